"""binpack's loss weighting in mace: equal epoch weights in mace's own loss on two real ranks, and
evaluation loaders (hence mace's validation and test metrics) untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.manager import Session, create_manager
from cfm_plugins.options import TrainerSettings
from tests.helpers import run_module

SCRIPT = "tests.scripts.mace_loss_weights"


def test_per_sample_weighs_every_graph_and_atom_alike_in_maces_loss_on_two_ranks():
    """Gradients of mace's WeightedEnergyForcesStressLoss at one probe per graph and per atom, over
    one epoch of a binpack plan on 2 ranks (sharded sizes, gloo, DDP): under per_sample every graph
    weighs S/N in the energy and stress terms and every atom S/A in the forces term; under stock
    the same plan weighs them unequally."""
    proc = run_module(SCRIPT, np=2, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    runs = {
        d["weighting"]: d
        for d in (
            json.loads(ln[8:]) for ln in proc.stdout.splitlines() if ln.startswith("WEIGHTS ")
        )
    }
    assert set(runs) == {"stock", "per_sample"}, proc.stdout[-4000:]
    for weighting, d in runs.items():
        steps, graphs, atoms = d["steps"], d["graphs"], d["atoms"]
        energy, forces, stress = (np.array(d[k]) for k in ("energy", "forces", "stress"))
        has_stress = np.array(d["has_stress"]) > 0
        assert steps >= 4 and has_stress.sum() >= 4 and (~has_stress).sum() >= 4
        assert np.all(stress[~has_stress] == 0)  # mace's stress_weight 0: scaled, still 0
        if weighting == "per_sample":
            np.testing.assert_allclose(energy, steps / graphs, rtol=1e-12)
            np.testing.assert_allclose(stress[has_stress], steps / graphs, rtol=1e-12)
            np.testing.assert_allclose(forces, steps / atoms, rtol=1e-12)
        else:  # the bias per_sample removes: some graphs weigh twice others
            assert energy.max() / energy.min() > 1.5
            assert forces.max() / forces.min() > 1.05
            # and both weightings give the epoch the same total weight: the learning rate keeps its
            # meaning
            np.testing.assert_allclose(energy.sum(), steps, rtol=1e-12)
            np.testing.assert_allclose(forces.sum(), steps, rtol=1e-12)


# ------------------------------------------------------------------------ evaluation is untouched
def _frames():
    from cfm_plugins.datasets.cuni import make_structures

    return make_structures(24, seed=2, max_atoms=60)


def _loaders(weighting, frames, model_cutoff=4.0, generator=None):
    """mace's train and valid loaders as the adapter builds them under binpack (one rank); mace
    passes each a ``generator`` seeded with ``--seed``."""
    import mace  # noqa: F401
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable
    from mace.tools.torch_geometric.dataloader import DataLoader as MaceLoader
    from torch.utils.data import ConcatDataset

    from cfm_plugins_adapters.mace.loader import make_dataloader_factory

    keys = mace_data.KeySpecification(
        info_keys={"energy": "REF_energy", "stress": "REF_stress"},
        arrays_keys={"forces": "REF_forces"},
    )
    z_table = AtomicNumberTable([28, 29])
    data = [
        mace_data.AtomicData.from_config(
            mace_data.config_from_atoms(a, key_specification=keys),
            z_table=z_table,
            cutoff=model_cutoff,
        )
        for a in frames
    ]
    config = Config(
        enabled=["mace", "binpack"], options={"loss_weighting": weighting, "max_tokens": 150}
    )
    create_manager(config)
    config.dist = DistInfo(rank=0, world_size=1)
    session = Session(
        config,
        TrainerSettings(
            batch_size=4,
            seed=3,
            loss="mace_run_train --loss weighted",
            loss_weightings=("stock", "per_sample"),
        ),
    )
    factory = make_dataloader_factory(MaceLoader, session)
    train = factory(
        dataset=ConcatDataset([data[:16]]),
        batch_size=4,
        shuffle=True,
        drop_last=True,
        generator=generator,
        num_workers=0,
    )
    valid = factory(
        dataset=data[16:],
        batch_size=4,
        shuffle=False,
        drop_last=False,
        generator=generator,
        num_workers=0,
    )
    return train, valid


def test_evaluation_loaders_are_never_reweighted_and_metrics_unchanged(f64):
    """Under per_sample the training loader scales its batches' energy/forces weights; the
    validation loader gives the very batches of loss_weighting=stock, so mace's evaluate() (loss,
    RMSEs) is the same number for the same model."""
    import torch
    from mace.tools.train import evaluate

    from cfm_plugins.testing import mace_model

    frames = _frames()
    stock_train, stock_valid = _loaders("stock", frames)
    ps_train, ps_valid = _loaders("per_sample", frames)
    assert (
        type(ps_train).__name__ == "LossScaledDataLoader"
        and type(stock_train).__name__ == "DataLoader"
    )
    assert type(ps_valid).__name__ == "DataLoader"

    # training batches: the same graphs, the energy weights scaled by the graph factor
    scaled = [(b.energy_weight.clone(), b.forces_weight.clone()) for b in ps_train]
    plain = [(b.energy_weight.clone(), b.forces_weight.clone()) for b in stock_train]
    assert len(scaled) == len(plain)
    assert any(not torch.equal(s[0], p[0]) for s, p in zip(scaled, plain))
    # every weight of a batch by the same factor (graph count against the epoch's mean)
    for (se, _sf), (pe, _pf) in zip(scaled, plain):
        assert torch.allclose(se / pe, (se / pe)[0].expand_as(se))

    # validation: identical batches and identical metrics
    model = mace_model(
        "8x0e+8x1o", atomic_numbers=(28, 29), max_ell=1, correlation=2, r_max=4.0, perturb=0.05
    )
    from mace import modules

    loss_fn = modules.WeightedEnergyForcesStressLoss(
        energy_weight=1.0, forces_weight=10.0, stress_weight=1.0
    )
    args = {"energy": True, "forces": True, "virials": False, "stress": True}
    metrics = [
        evaluate(model, loss_fn, loader, args, torch.device("cpu"))[1]
        for loader in (stock_valid, ps_valid)
    ]
    for key in ("loss", "rmse_e_per_atom", "rmse_f", "mae_e", "mae_f", "rmse_stress"):
        assert metrics[1][key] == metrics[0][key], key


@pytest.mark.parametrize("weighting", ["stock", "per_sample"])
def test_iterating_the_loaders_leaves_torchs_global_generator_as_the_stock_loaders_do(weighting):
    """mace iterates the training loader (the mean number of neighbours, the scale and shift) before
    it builds the model from torch's global generator. The stock loaders draw each iteration's seed
    from the generator mace gives them; ours did from the global one, so the same --seed gave
    another initial model than stock mace (validation RMSEs before training differed). With the
    generator kept, iterating leaves the global state alone and moves the loader's own."""
    import torch

    frames = _frames()
    generator = torch.Generator().manual_seed(1)
    train, valid = _loaders(weighting, frames, generator=generator)
    assert train.generator is generator and valid.generator is generator
    before, own = torch.random.get_rng_state(), generator.get_state()
    assert sum(b.num_graphs for b in train) > 0 and sum(b.num_graphs for b in valid) > 0
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not torch.equal(generator.get_state(), own)
    # without a generator (what ours passed on), an iteration draws from the global one
    unseeded, _ = _loaders(weighting, frames)
    next(iter(unseeded))
    assert not torch.equal(torch.random.get_rng_state(), before)


# ------------------------------------------------------- the validation loss under binpack
def _batches_and_output(frames):
    """mace batches of ``frames`` and a prediction off the labels by a random amount, per part."""
    import torch
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable
    from mace.tools.torch_geometric import Batch

    keys = mace_data.KeySpecification(
        info_keys={"energy": "REF_energy", "stress": "REF_stress"},
        arrays_keys={"forces": "REF_forces"},
    )
    graphs = [
        mace_data.AtomicData.from_config(
            mace_data.config_from_atoms(a, key_specification=keys),
            z_table=AtomicNumberTable([28, 29]),
            cutoff=4.0,
        )
        for a in frames
    ]
    gen = torch.Generator().manual_seed(0)
    whole = Batch.from_data_list(graphs)
    noise = {
        k: 0.3 * torch.randn(whole[k].shape, generator=gen)
        for k in ("energy", "forces", "stress", "virials")
    }
    ptr = whole.ptr.tolist()

    def batch(idx):
        out = {k: whole[k][idx] + noise[k][idx] for k in ("energy", "stress", "virials")}
        out["forces"] = torch.cat(
            [whole.forces[ptr[i] : ptr[i + 1]] + noise["forces"][ptr[i] : ptr[i + 1]] for i in idx]
        )
        return Batch.from_data_list([graphs[i] for i in idx]), out

    return batch


MACE_LOSSES = {
    "weighted": ("WeightedEnergyForcesLoss", dict(energy_weight=1.0, forces_weight=10.0)),
    "forces_only": ("WeightedForcesLoss", dict(forces_weight=3.0)),
    "stress": (
        "WeightedEnergyForcesStressLoss",
        dict(energy_weight=1.0, forces_weight=10.0, stress_weight=5.0),
    ),
    "virials": (
        "WeightedEnergyForcesVirialsLoss",
        dict(energy_weight=1.0, forces_weight=10.0, virials_weight=5.0),
    ),
    "huber": (
        "WeightedHuberEnergyForcesStressLoss",
        dict(energy_weight=1.0, forces_weight=10.0, stress_weight=5.0, huber_delta=0.01),
    ),
    "universal": (
        "UniversalLoss",
        dict(energy_weight=1.0, forces_weight=10.0, stress_weight=5.0, huber_delta=0.01),
    ),
    "l1l2energyforces": (
        "WeightedEnergyForcesL1L2Loss",
        dict(energy_weight=1.0, forces_weight=10.0),
    ),
}


@pytest.mark.parametrize("loss", list(MACE_LOSSES))
def test_validation_loss_is_the_whole_set_as_one_batch_however_it_is_batched(f64, loss):
    """mace's MACELoss logs the sum of per-batch means over the number of structures, which moves
    with the batches; the metric binpack puts in its place gives mace's loss on the whole set as
    one batch, for every batching, for linear and Huber losses alike (issue 83)."""
    from mace import modules
    from mace.tools.train import MACELoss

    from cfm_plugins_adapters.mace.loader import structure_mean_metric_class

    cls, kwargs = MACE_LOSSES[loss]
    loss_fn = getattr(modules, cls)(**kwargs)
    batch = _batches_and_output(_frames()[:9])
    ref, pred = batch(list(range(9)))
    whole = float(loss_fn(ref=ref, pred=pred, ddp=False))
    plans = ([list(range(9))], [[0, 1, 2, 3], [4, 5, 6, 7, 8]], [[8], [0, 5], [1, 2, 3], [4, 6, 7]])
    ours, stock = [], []
    for plan in plans:
        metrics = structure_mean_metric_class(MACELoss)(loss_fn), MACELoss(loss_fn)
        for idx in plan:
            ref, pred = batch(idx)
            for m in metrics:
                m(ref, pred)
        ours.append(metrics[0].compute()[0])
        stock.append(metrics[1].compute()[0])
    np.testing.assert_allclose(ours, whole, rtol=1e-12)
    assert stock[0] == pytest.approx(whole / 9, rel=1e-12)  # stock, the set in one batch
    assert max(stock) / min(stock) > 1.5  # stock's figure moves with the batches


def test_a_loss_that_does_not_split_into_terms_keeps_maces_figure(f64, caplog):
    """A loss with a term outside mace's reduce_loss cannot be recombined: the figure is mace's
    own, said in one warning."""
    import logging

    import torch
    from mace.tools.train import MACELoss

    from cfm_plugins_adapters.mace import loader

    class PlainMeanLoss(torch.nn.Module):
        def forward(self, ref, pred, ddp=None):
            return torch.mean(torch.square(ref["energy"] - pred["energy"]))

    batch = _batches_and_output(_frames()[:6])
    loader._SAID.clear()
    metrics = (
        loader.structure_mean_metric_class(MACELoss)(PlainMeanLoss()),
        MACELoss(PlainMeanLoss()),
    )
    with caplog.at_level(logging.WARNING, logger="cfm_plugins.mace"):
        for idx in ([0, 1], [2, 3, 4, 5]):
            ref, pred = batch(idx)
            for m in metrics:
                m(ref, pred)
        figures = [m.compute()[0] for m in metrics]
    assert figures[0] == figures[1]
    assert any("PlainMeanLoss is mace's own mean" in r.getMessage() for r in caplog.records)


def test_the_loss_weighting_follows_the_loss_mace_builds():
    """mace switches --loss to universal for multihead fine-tuning after parsing its arguments:
    the settings name the loss mace builds and offer per_sample only for losses linear in the
    weights; a loss module built after a per_sample training loader that is not linear is refused.
    """
    import argparse

    from mace import modules

    from cfm_plugins.options import UsageError
    from cfm_plugins_adapters.mace.seams import check_built_loss, trainer_settings

    args = argparse.Namespace(
        batch_size=4, seed=1, default_dtype="float64", device="cpu", loss="weighted"
    )
    assert trainer_settings(args).loss_weightings == ("stock", "per_sample")
    args.loss, args.multiheads_finetuning = "universal", True
    settled = trainer_settings(args, "weighted")
    assert settled.loss_weightings == ("stock",)
    assert settled.loss == (
        "mace_run_train's universal loss (mace's choice for --multiheads_finetuning, over --loss "
        "weighted)"
    )
    config = Config(enabled=["binpack"])
    from cfm_plugins.plugins.binpack import training_loss_weighting

    assert training_loss_weighting(config, settled) == "stock"  # the default falls back
    explicit = Config(enabled=["binpack"], options={"loss_weighting": "per_sample"})
    with pytest.raises(UsageError, match="universal loss .*set loss_weighting=stock"):
        training_loss_weighting(explicit, settled)

    check_built_loss(modules.WeightedEnergyForcesLoss(), ["per_sample"])
    check_built_loss(modules.UniversalLoss(), ["stock", "stock"])
    with pytest.raises(UsageError, match="built a UniversalLoss after its training loader"):
        check_built_loss(modules.UniversalLoss(), ["per_sample"])
