"""The radial fusion (``cfm::conv_tp_radial_*``, kernel ``conv_tp_radial``): the operators against
the weights made first and the plain conv TP operators (float64 round-off), gradcheck and
gradgradcheck, and on real mace models: energies, forces and the parameter gradients of a force
loss equal to stock's, the state_dict unchanged, unpatch restoring the stock modules and
TorchScript."""

from __future__ import annotations

import copy
import itertools

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn.util import jit

from cfm_plugins.ops.conv_tp import FusedConvTP, _graph_tensors
from cfm_plugins.ops.conv_tp_radial import RadialHidden
from cfm_plugins.ops.patching import patch_model, unpatch_model
from cfm_plugins.testing import mace_conv_tp
from tests.helpers.mace_models import BLOCKS
from tests.helpers.mace_models import mace_batch as batch
from tests.helpers.mace_models import run_mace as run
from tests.helpers.mace_models import tiny_mace as build

RADIAL = ("conv_tp", "conv_tp_radial")


def _case(dtype, K=12, N=7, E=40, seed=0, hidden="8x0e+8x1o", lmax=2, channels=8):
    torch.manual_seed(seed)
    tp = mace_conv_tp(hidden, lmax, channels, dtype)
    m = FusedConvTP.from_e3nn(tp)
    ei = torch.randint(0, N - 1, (2, E))  # node N-1 has no edge
    x = torch.randn(N, tp.irreps_in1.dim, dtype=dtype).index_select(1, m._cl_perm_in)
    y = torch.randn(E, tp.irreps_in2.dim, dtype=dtype)
    h = torch.randn(E, K, dtype=dtype)
    wr = torch.randn(K, tp.weight_numel, dtype=dtype)
    tables = (
        _graph_tensors(ei, N),
        [m._tp_ints, m._tp_coef],
        [m._tp_ints_t, m._tp_coef_t],
        m._tp_meta,
    )
    return x.contiguous(), y, h, wr, tables


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_operators_match_the_weights_made_first(dtype):
    x, y, h, wr, tables = _case(dtype)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=2e-5, atol=1e-5)
    w = h @ wr
    ref = torch.ops.cfm.conv_tp_fwd(x, y, w, *tables)
    torch.testing.assert_close(torch.ops.cfm.conv_tp_radial_fwd(x, y, h, wr, *tables), ref, **tol)
    g = torch.randn_like(ref)
    for need in itertools.product([False, True], repeat=4):
        nx, ny, nh, nwr = need
        gx, gy, gw = torch.ops.cfm.conv_tp_bwd(g, x, y, w, *tables, nx, ny, nh or nwr)
        got = torch.ops.cfm.conv_tp_radial_bwd(g, x, y, h, wr, *tables, *need)
        refs = (gx, gy, gw @ wr.T if nh else None, h.T @ gw if nwr else None)
        for wanted, a, r in zip(need, got, refs):
            if wanted:
                torch.testing.assert_close(a, r, **tol)
            else:
                assert a.numel() == 0


def test_operators_without_edges():
    x, y, h, wr, (graph, *rest) = _case(torch.float64, E=0)
    out = torch.ops.cfm.conv_tp_radial_fwd(x, y, h, wr, graph, *rest)
    assert out.shape[0] == x.shape[0] and not out.any()
    g = torch.randn_like(out)
    gx, gy, gh, gwr = torch.ops.cfm.conv_tp_radial_bwd(g, x, y, h, wr, graph, *rest, *[True] * 4)
    assert not gx.any() and gy.shape == y.shape and gh.shape == h.shape and not gwr.any()


def test_wrong_radial_weight_is_refused():
    x, y, h, wr, tables = _case(torch.float64)
    with pytest.raises(RuntimeError, match="wr must be a contiguous"):
        torch.ops.cfm.conv_tp_radial_fwd(x, y, h, wr[:5], *tables)
    with pytest.raises(RuntimeError, match="the paths read"):
        torch.ops.cfm.conv_tp_radial_fwd(x, y, h, wr[:, :7].contiguous(), *tables)


def test_gradcheck_and_gradgradcheck():
    x, y, h, wr, tables = _case(
        torch.float64, K=3, N=4, E=7, hidden="2x0e+2x1o", lmax=1, channels=2
    )

    def f(*a):
        return torch.ops.cfm.conv_tp_radial_fwd(*a, *tables)

    args = [t.clone().requires_grad_() for t in (x, y, h, wr)]
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def _grads(m, b):
    m.zero_grad()
    bb = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
    out = m(bb, training=True, compute_force=True)
    ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
    return [p.grad.clone() if p.grad is not None else None for p in m.parameters()]


@pytest.mark.parametrize("block", [BLOCKS[0], BLOCKS[2]])
def test_mace_energies_forces_and_force_training_gradients(block):
    model = build("ScaleShiftMACE", block, block)
    b = batch()
    ref, g_ref = run(model, b), _grads(model, b)
    keys = list(model.state_dict())
    stock_mlps = [blk.conv_tp_weights for blk in model.interactions]

    report = patch_model(model, RADIAL)
    assert report.counts == {"conv_tp": 2, "conv_tp_radial": 2}
    assert all(
        isinstance(blk.conv_tp_weights, RadialHidden) and blk.conv_tp.radial
        for blk in model.interactions
    )
    assert list(model.state_dict()) == keys
    got = run(model, b)
    assert ref[1].abs().max() > 1e-3
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    for a, r in zip(_grads(model, b), g_ref):
        assert (a is None) == (r is None)
        if a is not None:
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)

    scripted = jit.compile(copy.deepcopy(model))  # e3nn's scripting, as mace's export does
    bb = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
    out = scripted(bb, compute_force=True)
    torch.testing.assert_close(out["forces"], ref[1], rtol=1e-10, atol=1e-12)
    assert "cfm.conv_tp_radial_fwd" in "\n".join(m.conv_tp.code for m in scripted.interactions)

    assert unpatch_model(model, ("conv_tp",)).total == 2  # conv_tp alone takes the radial back
    assert [blk.conv_tp_weights for blk in model.interactions] == stock_mlps
    assert list(model.state_dict()) == keys
    for a, r in zip(run(model, b), ref):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-14)


def test_radial_alone_is_refused_with_the_reason():
    model = build("ScaleShiftMACE", BLOCKS[0], BLOCKS[0])
    report = patch_model(model, ("conv_tp_radial",))
    assert report.total == 0
    assert report.left and all("fuse conv_tp too" in why for _, why in report.left)


def test_functional_call_reaches_the_radial_weight():
    """torch.func.functional_call (ensembles, torch.func transforms, tracers that lift the
    parameters) substitutes the MLP's parameters: the fused TP reads the substitute, and the
    gradient reaches it."""
    from torch.func import functional_call

    model = build("ScaleShiftMACE", BLOCKS[0], BLOCKS[0])
    fused = copy.deepcopy(model)
    patch_model(fused, RADIAL)
    b = batch()

    def energy_and_grads(m):
        params = {
            k: (v.detach() * 1.01).requires_grad_() for k, v in m.named_parameters()
        }  # not the module's values
        bb = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
        e = functional_call(m, params, (bb,), dict(training=True, compute_force=False))["energy"]
        names = [k for k in params if "conv_tp_weights" in k]
        return e.detach(), torch.autograd.grad(e.sum(), [params[k] for k in names])

    (e0, g0), (e1, g1) = energy_and_grads(model), energy_and_grads(fused)
    torch.testing.assert_close(e1, e0, rtol=1e-11, atol=1e-12)
    assert len(g0) == len(g1) > 0
    for a, r in zip(g1, g0):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
