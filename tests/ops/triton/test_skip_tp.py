"""The Triton skip connection (``cfm_plugins.ops.triton.skip_tp``) in the interpreter on CPU,
registered as the ``cfm::skip_tp_*`` operators' CPU kernels: against e3nn's module (forward,
gradients, double backward, float64 and float32), against the C++ kernels (every gradient subset,
both ``tl.dot`` and the rank-1 path that float64 takes on AMD GPUs), gradcheck, tiles smaller than
the problem (several tiles per element, elements without nodes, tile slots past the last real
one), an empty batch, and outputs written whole (never zero-filled first)."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops.skip_tp import FusedSkipTP
from cfm_plugins.ops.triton import skip_tp as tsk
from cfm_plugins.ops.triton.configs import TileConfig, override
from tests.helpers.skip_tp_cases import (
    mace_skip_tp,
    node_inputs,
    op_args,
    rel_err,
    training_pattern,
)

pytestmark = pytest.mark.usefixtures("triton_cpu")

F32_TOL = 2e-5  # tl.dot in IEEE precision: float32 round-off of the sums only


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-10), (torch.float32, F32_TOL)], ids=["f64", "f32"]
)
@pytest.mark.parametrize(
    "irreps_in,irreps_out", [("8x0e+8x1o", "8x0e+8x1o"), ("3x0e+5x1o+2x0e", "6x0e+3x1o+1x2e")]
)
def test_training_pattern_matches_e3nn(irreps_in, irreps_out, dtype, tol):
    tp = mace_skip_tp(irreps_in, irreps_out, 5, dtype)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 40, dtype, absent=(1,))
    ref = training_pattern(tp, tp.weight, x, y)
    got = training_pattern(fused, tp.weight, x, y)
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < tol


@pytest.mark.parametrize("dot", [True, False], ids=["dot", "rank1"])
@pytest.mark.parametrize("need", [(True, True), (True, False), (False, True)], ids=["xw", "x", "w"])
def test_every_gradient_subset_matches_the_cpp_kernels(triton_cpu, monkeypatch, need, dot):
    """Tiles smaller than the problem: 20 and 18 channels (blocks of 16 split them), 70 nodes of 4
    elements (tiles of 32 nodes split element 0's; element 2 has none), weight rows by 16."""
    monkeypatch.setattr(tsk, "_use_dot", lambda x: dot)
    tp = mace_skip_tp("20x0e+18x1o", "18x0e+20x1o", 4)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 70, absent=(2,))
    y[:40] = torch.nn.functional.one_hot(torch.zeros(40, dtype=torch.long), 4).double()
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach()
    g = torch.randn(70, meta[1], dtype=torch.float64)
    with override(skip_apply=TileConfig(16, 16), skip_wgrad=TileConfig(16, 16)):
        out = torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta)
        got = torch.ops.cfm.skip_tp_bwd(g, x, w, order, elem_ptr, desc, desc_t, meta, *need)
    with triton_cpu():
        ref_out = torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta)
        ref = torch.ops.cfm.skip_tp_bwd(g, x, w, order, elem_ptr, desc, desc_t, meta, *need)
    assert rel_err(out, ref_out) < 1e-13
    for wanted, a, b in zip(need, got, ref):
        if wanted:
            assert a.shape == b.shape and rel_err(a, b) < 1e-13
        else:
            assert a.numel() == 0 and b.numel() == 0


def test_outputs_are_written_whole(monkeypatch):
    """The launchers allocate uninitialised outputs: filled with NaN here first, every element
    must come back written (blocks no path reaches: zeros; elements without nodes: zero
    weights)."""
    real = tsk._uninitialised
    monkeypatch.setattr(
        tsk, "_uninitialised", lambda shape, like: real(shape, like).fill_(float("nan"))
    )
    tp = mace_skip_tp("8x0e", "8x0e+8x1o", 3)  # the first layer: nothing reaches 1o
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 10, absent=(1,))
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach()
    out = torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta)
    assert torch.isfinite(out).all() and torch.all(out[:, 8:] == 0)
    gx, gw = torch.ops.cfm.skip_tp_bwd(
        torch.randn_like(out), x, w, order, elem_ptr, desc, desc_t, meta, True, True
    )
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all()
    assert torch.all(gw.view(8, 3, 8)[:, 1] == 0)


def test_gradcheck_through_the_triton_kernels():
    """Small (each operator call is one interpreter run): the double backward is the training
    pattern's above, and the C++ kernels' gradgradcheck (tests/ops/test_skip_tp.py)."""
    tp = mace_skip_tp("1x0e+1x1o", "1x0e+1x1o", 2)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 3, absent=())
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach().clone().requires_grad_()

    def fwd(x, w):
        return torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta)

    assert torch.autograd.gradcheck(fwd, (x.requires_grad_(), w))


def test_an_empty_batch():
    tp = mace_skip_tp("4x0e+2x1o", "4x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    y = torch.zeros(0, 3, dtype=torch.float64)
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    x = torch.zeros(0, meta[0], dtype=torch.float64)
    w = tp.weight.detach()
    assert torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta).shape == (
        0,
        meta[1],
    )
    gx, gw = torch.ops.cfm.skip_tp_bwd(
        x.new_zeros(0, meta[1]), x, w, order, elem_ptr, desc, desc_t, meta, True, True
    )
    assert gx.shape == (0, meta[0]) and torch.all(gw == 0)
