"""The Triton kernels inside patched MACE models (``cfm_plugins.ops.triton.register``: the
launchers as the ``cfm::`` operators' kernels, here the CPU ones under the interpreter): energy,
forces, stress and the parameter gradients of a force loss (double backward through both kernels)
against the stock model in float64 and float32, and torch.compile of a patched model.
"""

from __future__ import annotations

import copy

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops.patching import patch_model
from tests.helpers.mace_models import BLOCKS, mace_cluster_batch, tiny_mace

pytestmark = pytest.mark.usefixtures("triton_cpu")


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def clone(b, dtype):
    return {
        k: (v.to(dtype) if torch.is_floating_point(v) else v.clone()) if torch.is_tensor(v) else v
        for k, v in b.items()
    }


def train_step(model, b):
    """Energy, forces, stress and the parameter gradients of a loss on energy and forces."""
    model.zero_grad()
    out = model(b, training=True, compute_force=True, compute_stress=True)
    ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    return [out["energy"].detach(), out["forces"].detach(), out["stress"].detach()] + grads


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)], ids=["f64", "f32"]
)
def test_patched_mace_training_step_matches_stock(dtype, tol):
    stock = tiny_mace("ScaleShiftMACE", BLOCKS[0], BLOCKS[0]).to(dtype)
    patched = copy.deepcopy(stock)
    assert patch_model(patched).counts == {
        "symmetric_contraction": 2,
        "conv_tp": 2,
        "skip_tp": 2,
    }
    b = mace_cluster_batch(5)
    ref = train_step(stock, clone(b, dtype))
    got = train_step(patched, clone(b, dtype))
    assert len(got) == len(ref) and ref[1].abs().max() > 1e-3
    for a, r in zip(got, ref):
        assert rel_err(a, r) < tol


def test_torch_compile_of_a_patched_model():
    """The energy of a patched model compiled whole (fullgraph: the cfm:: operators trace through
    their Meta kernels), forces by autograd through the compiled graph: the Triton forward and
    backward kernels run inside it, equal to the stock model. Prepared as mace prepares a model
    for torch.compile (``mace.tools.compile``: e3nn without TorchScript, irreps loops traced)."""
    import e3nn
    from mace.tools.compile import simplify

    defaults = dict(e3nn.get_optimization_defaults())
    e3nn.set_optimization_defaults(jit_script_fx=False)  # plain fx modules, which dynamo traces
    try:
        stock = tiny_mace("MACE", BLOCKS[1], BLOCKS[1])
        patched = tiny_mace("MACE", BLOCKS[1], BLOCKS[1])  # the same weights (seeded); a deepcopy
        # would hold TorchScript again (e3nn's modules unpickle their code scripted)
    finally:
        e3nn.set_optimization_defaults(**defaults)
    assert patch_model(patched).total == 6
    patched = simplify(patched)
    b = mace_cluster_batch(4, seed=1)

    def energy(model, positions):
        data = dict(b, positions=positions)
        return model(data, training=False, compute_force=False)["energy"].sum()

    compiled = torch.compile(lambda pos: energy(patched, pos), backend="aot_eager", fullgraph=True)
    results = []
    for fn in (lambda pos: energy(stock, pos), compiled):
        pos = b["positions"].clone().requires_grad_(True)
        e = fn(pos)
        results.append((e.detach(), torch.autograd.grad(e, pos)[0]))
    for a, r in zip(results[1], results[0]):
        assert rel_err(a, r) < 1e-10


def test_prepare_kernels_leaves_nothing_for_the_first_launch():
    """``prepare_kernels`` (the static path calls it before compiling or capturing) parses every
    fused module's descriptors and keeps the walk tables on their device, so a step afterwards
    parses, copies and allocates no table: on a GPU the first launch inside a CUDA graph's warm-up
    left two walk tables in the graph's pool (H100: "2 tensor(s) in the cudagraph pool not
    tracked")."""
    from cfm_plugins.ops import _backend
    from cfm_plugins.ops.triton import conv_tp as triton_tp
    from cfm_plugins.ops.triton import skip_tp as triton_skip
    from cfm_plugins.ops.triton import symmetric_contraction as triton_sc

    model = tiny_mace("ScaleShiftMACE", BLOCKS[0], BLOCKS[0]).to(torch.float64)
    assert patch_model(model).counts == {
        "symmetric_contraction": 2,
        "conv_tp": 2,
        "skip_tp": 2,
    }
    assert _backend.prepare_kernels(model) == 6
    walks, sc_tables, tp_tables = (
        dict(triton_sc._WALKS),
        dict(triton_sc._TABLES._hits),
        dict(triton_tp._TABLES._hits),
    )
    skip_tables = {  # each skip connection: its tables, the transposed ones, their job tables
        k: (v[1], dict(v[1]._jobs))
        for cache in (triton_skip._TABLES, triton_skip._TABLES_T)
        for k, v in cache._hits.items()
    }
    assert len(skip_tables) >= 2 and all(jobs for _, jobs in skip_tables.values())
    assert (
        len(walks) >= 1 and len(tp_tables) >= 2
    )  # each conv TP: its tables and the transposed ones
    train_step(model, clone(mace_cluster_batch(3), torch.float64))
    assert triton_sc._WALKS.keys() == walks.keys() and all(
        triton_sc._WALKS[k][1] is walks[k][1] for k in walks
    )
    assert (
        triton_sc._TABLES._hits.keys() == sc_tables.keys()
        and triton_tp._TABLES._hits.keys() == tp_tables.keys()
    )
    after = {
        k: v[1]
        for cache in (triton_skip._TABLES, triton_skip._TABLES_T)
        for k, v in cache._hits.items()
    }
    assert after.keys() == skip_tables.keys()
    for k, (tables, jobs) in skip_tables.items():
        assert after[k] is tables and tables._jobs.keys() == jobs.keys()
