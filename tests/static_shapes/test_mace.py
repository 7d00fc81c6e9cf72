"""Padded mace batches against unpadded ones, on a real (small) MACE model: the same loss,
gradients, energies, forces, stress and validation metrics to float64 round-off, with and without
fused kernels."""

from __future__ import annotations

import logging
import pickle

import mace  # noqa: F401  (before e3nn)
import numpy as np
import pytest
import torch
from ase.calculators.emt import EMT
from mace import data, tools
from mace.modules.loss import WeightedEnergyForcesStressLoss
from mace.tools.torch_geometric.dataloader import Collater, DataLoader
from mace.tools.train import evaluate

from cfm_plugins.ops.patching import patch_model
from cfm_plugins.static_shapes import forward
from cfm_plugins.static_shapes.budget import Budget, BudgetTracker
from cfm_plugins.static_shapes.mace import MACE_SPEC, PaddedBatch, PaddingCollater
from tests.helpers.mace_models import build_model, structures

RTOL = 1e-10
KEYSPEC = data.KeySpecification(
    info_keys={"energy": "REF_energy", "stress": "REF_stress"}, arrays_keys={"forces": "REF_forces"}
)
OUTPUT_ARGS = {"energy": True, "forces": True, "virials": False, "stress": True, "dipoles": False}


def labelled_items(dtype=torch.float64):
    """Size-diverse CuNi structures (bulk, slab, cluster; 30-40 atoms) with EMT labels, as mace
    data."""
    z_table = tools.AtomicNumberTable([28, 29])
    out = []
    for atoms in structures():
        atoms.calc = EMT()
        atoms.info["REF_energy"] = atoms.get_potential_energy()
        atoms.arrays["REF_forces"] = atoms.get_forces()
        if atoms.pbc.all():
            atoms.info["REF_stress"] = atoms.get_stress()
        config = data.config_from_atoms(atoms, key_specification=KEYSPEC)
        with tools.torch_tools.default_dtype(dtype):
            out.append(data.AtomicData.from_config(config, z_table=z_table, cutoff=5.0))
    return out


@pytest.fixture(scope="module")
def items():
    return labelled_items()


BUDGET = Budget(
    atoms=72, edges=2304, graphs=8
)  # the 5 structures: 57 atoms, 1918 edges; 3 pad graphs


def tracker(budget=BUDGET):
    return BudgetTracker(budget, name="test")


def padded(items, budget=BUDGET) -> PaddedBatch:
    return PaddingCollater(Collater([None], [None]), tracker(budget), distance=10.0)(items)


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def step(model, batch, loss_fn):
    """mace's training step up to the optimizer: the loss, every parameter's gradient, the
    outputs."""
    model.zero_grad(set_to_none=True)
    out = model(batch.to_dict(), training=True, compute_force=True, compute_stress=True)
    loss = loss_fn(pred=out, ref=batch)
    loss.backward()
    return (
        loss.detach(),
        [p.grad.clone() for p in model.parameters()],
        {k: out[k].detach() for k in ("energy", "forces", "stress")},
    )


def test_pad_graphs_are_inert_and_apart_from_the_real_atoms(items):
    b = padded(items)
    graphs, atoms, edges = b.real_sizes
    assert (graphs, atoms) == (len(items), sum(d.num_nodes for d in items))
    assert b.padded_sizes() == (8, 72, 2304)
    assert b.num_graphs == graphs and b.num_nodes == atoms and b.edge_index.shape[1] == edges
    p = b.padded
    pad_edges = p.edge_index[:, edges:]
    assert (pad_edges >= atoms).all() and (
        p.edge_index[:, :edges] < atoms
    ).all()  # no edge joins pad and real
    vectors = p.positions[pad_edges[1]] - p.positions[pad_edges[0]] + p.shifts[edges:]
    assert torch.allclose(
        vectors.norm(dim=1), torch.full((2304 - edges,), 10.0, dtype=vectors.dtype)
    )
    assert (p.weight[graphs:] == 0).all() and (
        p.ptr[graphs + 1 :] == 72
    ).all()  # the empty pad graphs
    assert (p.node_attrs[atoms:, 0] == 1).all() and torch.linalg.det(
        p.cell.view(-1, 3, 3)[graphs:]
    ).min() > 0


@pytest.mark.parametrize("fused", [False, True], ids=["stock", "fused"])
def test_padded_step_equals_the_unpadded_step(items, fused):
    model = build_model(0)
    if fused:
        assert patch_model(model, ("symmetric_contraction", "conv_tp")).total > 0
    loss_fn = WeightedEnergyForcesStressLoss(
        energy_weight=1.0, forces_weight=10.0, stress_weight=100.0
    )
    plain = Collater([None], [None])(items)
    loss0, grads0, out0 = step(model, plain, loss_fn)
    forward.install(model, MACE_SPEC)
    loss1, grads1, out1 = step(model, padded(items), loss_fn)
    assert abs(float(loss1 - loss0)) <= RTOL * abs(float(loss0))
    assert len(grads1) == len(grads0) > 10
    for g1, g0 in zip(grads1, grads0):
        assert rel(g1, g0) <= RTOL
    for key in out0:
        assert out1[key].shape == out0[key].shape and rel(out1[key], out0[key]) <= RTOL


@pytest.mark.parametrize("fused", [False, True], ids=["stock", "fused"])
def test_padded_validation_metrics_equal_the_unpadded_ones(items, fused):
    """mace's own `evaluate` (MACELoss: loss, MAE/RMSE of energies, forces, stress) over padded
    batches."""
    model = build_model(1)
    if fused:
        patch_model(model, ("symmetric_contraction", "conv_tp"))
    loss_fn = WeightedEnergyForcesStressLoss(
        energy_weight=1.0, forces_weight=10.0, stress_weight=100.0
    )

    def metrics(pad):
        loader = DataLoader(items, batch_size=2, shuffle=False)
        if pad:
            loader.collate_fn = PaddingCollater(
                loader.collate_fn, tracker(Budget(48, 1024, 4)), distance=10.0
            )
            assert isinstance(next(iter(loader)), PaddedBatch)
        return evaluate(model, loss_fn, loader, OUTPUT_ARGS, torch.device("cpu"))[1]

    plain = metrics(False)
    forward.install(model, MACE_SPEC)
    pad = metrics(True)
    keys = [
        "loss",
        "mae_e",
        "rmse_e",
        "mae_e_per_atom",
        "rmse_e_per_atom",
        "mae_f",
        "rmse_f",
        "rel_mae_f",
        "mae_stress",
        "rmse_stress",
    ]
    for key in keys:
        assert plain[key] > 0 and abs(pad[key] - plain[key]) <= RTOL * abs(plain[key]), (
            key,
            pad[key],
            plain[key],
        )


def test_a_batch_over_the_budget_raises_it_once_and_is_never_cut(items, caplog):
    t = tracker(Budget(atoms=40, edges=1024, graphs=2))
    collate = PaddingCollater(Collater([None], [None]), t, distance=10.0)
    with caplog.at_level(logging.INFO, logger="cfm_plugins.static_shapes"):
        b = collate(items)
    assert t.raises == 1 and "over the budget" in caplog.text
    assert b.real_sizes[0] == len(items) and b.padded_sizes() == (
        t.budget.graphs,
        t.budget.atoms,
        t.budget.edges,
    )
    assert collate(items[:2]).padded_sizes() == b.padded_sizes() and t.raises == 1


def test_padded_batches_pickle_and_move_with_their_views(items):
    b = padded(items)
    back = pickle.loads(pickle.dumps(b))
    assert back.real_sizes == b.real_sizes and torch.equal(back.forces, b.forces)
    assert back.forces.data_ptr() == back.padded.forces.data_ptr()  # a view again, not a copy
    moved = back.to("cpu")
    assert moved is back and moved.positions.data_ptr() == moved.padded.positions.data_ptr()
    clone = b.clone()
    assert isinstance(clone, PaddedBatch) and clone.energy.data_ptr() != b.energy.data_ptr()
    loader = DataLoader(
        items, batch_size=3, shuffle=False, num_workers=1
    )  # collated in a worker process
    loader.collate_fn = PaddingCollater(loader.collate_fn, tracker(), distance=10.0)
    got = list(loader)
    assert [x.real_sizes[0] for x in got] == [3, 2] and all(
        x.padded_sizes() == (8, 72, 2304) for x in got
    )
    assert np.allclose(got[1].energy.numpy(), [d.energy.item() for d in items[3:]])


def test_loss_weights_scaled_on_a_padded_batch_hold_after_it_moves(items):
    """binpack's ``loss_weighting=per_sample`` under ``static_shapes``: the training loader
    scales the weight fields of a padded batch; moving it to the device (which makes its views
    again from the padded tensors) keeps them, equal to the same scaling of the unpadded batch."""
    from cfm_plugins.sampler.weighting import LossScale
    from cfm_plugins_adapters.mace.loader import (
        ATOM_WEIGHT_FIELDS,
        GRAPH_WEIGHT_FIELDS,
        scale_batch,
    )

    scale = LossScale(graphs=1.5, atoms=0.25)
    b, plain = padded(items), Collater([None], [None])(items)
    before = {
        name: getattr(plain, name).clone() for name in GRAPH_WEIGHT_FIELDS + ATOM_WEIGHT_FIELDS
    }
    scale_batch(b, scale)
    scale_batch(plain, scale)
    moved = b.to("cpu")
    for name in GRAPH_WEIGHT_FIELDS + ATOM_WEIGHT_FIELDS:
        factor = scale.graphs if name in GRAPH_WEIGHT_FIELDS else scale.atoms
        assert torch.equal(getattr(moved, name), getattr(plain, name)), name
        assert torch.equal(getattr(moved, name), before[name] * factor), name
    assert (
        float(moved.padded.weight[len(items) :].abs().sum()) == 0.0
    )  # the pad graphs still weigh nothing


def test_a_float64_model_rebuilt_without_torchscript_keeps_its_weights_exactly():
    """``without_torchscript`` (compile != off of a loaded model that holds e3nn's TorchScript)
    rebuilds the model in its weights' dtype: built in torch's default float32 and loaded after,
    every float64 weight came back rounded (~1e-7 relative)."""
    from cfm_plugins.static_shapes.mace import holds_torchscript, without_torchscript

    model = build_model(0, torch.float64)
    assert holds_torchscript(model) and torch.get_default_dtype() == torch.float32
    rebuilt = without_torchscript(model)
    assert not holds_torchscript(rebuilt)
    ref, got = model.state_dict(), rebuilt.state_dict()
    assert got.keys() == ref.keys()
    assert all(got[k].dtype == ref[k].dtype and torch.equal(got[k], ref[k]) for k in ref)
