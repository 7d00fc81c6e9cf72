"""FusedConvTP against e3nn's TensorProduct + scatter_sum, built exactly as mace's interaction
blocks build it; gradients (first and second order), empty/isolated graphs, bad input,
state_dict, the pure-torch fallback, torch.compile, and the CUDA kernel where a GPU exists."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3
from mace.modules.irreps_tools import tp_out_irreps_with_instructions

from cfm_plugins.ops import _backend
from cfm_plugins.ops import conv_tp as ctp
from cfm_plugins.ops.conv_tp import FusedConvTP
from tests.helpers import ROOT
from tests.helpers.conv_tp_cases import edge_gradients, graph, inputs, op_args, reference, rel_err
from tests.helpers.mace_models import mace_tp

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
needs_ext = pytest.mark.skipif(
    _backend.choose(torch.device("cpu")) != "cpu", reason="compiled CPU kernel not built"
)


CASES = [(h, l, c) for h in ("0e", "0e+1o", "0e+1o+2e") for l in (2, 3) for c in (8, 128)]


@pytest.mark.parametrize("hidden,lmax,channels", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_forward_matches_e3nn_scatter(hidden, lmax, channels, dtype, tol):
    tp = mace_tp(hidden, lmax, channels, dtype)
    fused = FusedConvTP.from_e3nn(tp)
    N = 13
    ei = graph(N, 70 if channels == 8 else 30, isolated=(5,))
    x, y, w = inputs(tp, N, ei.shape[1], dtype)
    ref = reference(tp, x, y, w, ei)
    out = fused(x, y, w, ei)
    assert out.dtype == dtype and out.shape == ref.shape == (N, tp.irreps_out.dim)
    assert rel_err(out, ref) < tol
    assert torch.all(out[5] == 0)  # the isolated node receives nothing
    # the e3nn (per-edge, unscattered) call form gives e3nn's output too
    assert rel_err(fused(x[ei[0]], y, w), tp(x[ei[0]], y, w)) < tol


@pytest.mark.parametrize("hidden,lmax", [("0e+1o", 3), ("0e+1o+2e", 2)])
def test_gradients_and_double_backward_match_e3nn(hidden, lmax):
    """The MACE training pattern: forces = -dE/d(edge attrs) with create_graph, then a loss on
    them."""
    tp = mace_tp(hidden, lmax, 16)
    fused = FusedConvTP.from_e3nn(tp)
    N = 11
    ei = graph(N, 60, seed=3, isolated=(0,))
    results = []
    for fn in (lambda x, y, w: reference(tp, x, y, w, ei), lambda x, y, w: fused(x, y, w, ei)):
        x, y, w = inputs(tp, N, ei.shape[1], torch.float64, seed=4, requires_grad=True)
        energy = (fn(x, y, w) ** 2).sum() + fn(x, y, w).sum()
        gx, gy, gw = torch.autograd.grad(energy, (x, y, w), create_graph=True)
        second = torch.autograd.grad((gy**2).sum() + (gx * gx).sum(), (x, y, w))
        results.append((gx.detach(), gy.detach(), gw.detach()) + second)
    for a, b in zip(*results):
        assert b.abs().max() > 0
        assert rel_err(a, b) < 1e-10


@needs_ext
def test_double_backward_releases_the_weight_cotangent_before_the_weight_gradient_terms():
    """Force training's peak memory: in the second backward the cotangent of the weight gradient
    (aw), the weights and both weight-gradient terms are [edges, paths*channels] buffers. aw must be
    released before those terms are computed (three buffers alive, not four), and the result must
    not change."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    alive_at_weight_terms: list[bool] = []
    refs: list = []

    class FreshCotangent(torch.autograd.Function):  # identity whose backward makes aw a new buffer
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            a = g * 1.0
            refs.append(weakref.ref(a))
            return a

    class WatchWeightTerms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if (
                func.__name__.startswith("conv_tp_bwd") and args[10]
            ):  # need_w: a weight-gradient term
                alive_at_weight_terms.append(refs[0]() is not None)
            return func(*args, **(kwargs or {}))

    tp = mace_tp("0e+1o", 2, 8)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(9, 40, seed=5)
    grads = []
    for watch in (False, True):
        refs.clear()
        x, y, w = inputs(tp, 9, ei.shape[1], torch.float64, seed=6, requires_grad=True)
        gx, gy, gw = torch.autograd.grad(
            (fused(x, y, w, ei) ** 2).sum(), (x, y, w), create_graph=True
        )
        loss = (gx**2).sum() + (gy**2).sum() + (FreshCotangent.apply(gw) ** 2).sum()
        if watch:
            with WatchWeightTerms():
                grads.append(torch.autograd.grad(loss, (x, y, w)))
        else:
            grads.append(torch.autograd.grad(loss, (x, y, w)))
    # the two terms of the double backward, then the forward's own weight gradient; aw freed before
    # all
    assert alive_at_weight_terms == [False, False, False]
    for a, b in zip(*grads):
        assert a.abs().max() > 0 and torch.equal(a, b)


@needs_ext
def test_double_backward_adds_the_second_weight_term_in_edge_slices():
    """Force training's peak memory: outside a graph the second weight-gradient term of the double
    backward is added into the first one slice of edges by slice (1/8 of them, no fewer than 32768),
    so it never exists whole. The result equals the unsliced sum (taken when a graph is
    recorded), and the slices cover every edge."""
    from torch.utils._python_dispatch import TorchDispatchMode

    weight_term_rows: list[int] = []

    class WatchWeightTerms(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("conv_tp_bwd") and args[10]:  # need_w
                weight_term_rows.append(args[2].shape[0])
            return func(*args, **(kwargs or {}))

    tp = mace_tp("0e+1o", 1, 2)
    fused = FusedConvTP.from_e3nn(tp)
    N, E = 40, 70_000
    ei = graph(N, E, seed=8)
    grads = []
    for create_graph in (True, False):  # recorded: one unsliced sum; not recorded: in slices
        weight_term_rows.clear()
        x, y, w = inputs(tp, N, E, torch.float64, seed=9, requires_grad=True)
        gx, gy, gw = torch.autograd.grad(
            (fused(x, y, w, ei) ** 2).sum(), (x, y, w), create_graph=True
        )
        loss = (gx**2).sum() + (gy**2).sum() + (gw**3).sum()
        with WatchWeightTerms():
            grads.append(torch.autograd.grad(loss, (x, y, w), create_graph=create_graph))
        rows = list(weight_term_rows)
    # the last run: the first term whole, the second in ceil(70000 / 32768) = 3 slices, then the
    # forward's own weight gradient
    assert rows == [E, 32768, 32768, E - 2 * 32768, E]
    for a, b in zip(*grads):
        assert a.abs().max() > 0 and torch.equal(a.detach(), b)


def small_problem(hidden="2x0e+2x1o", lmax=2, N=5, E=9, seed=0):
    irreps_in = o3.Irreps(hidden)
    sh = o3.Irreps.spherical_harmonics(lmax)
    mid, ins = tp_out_irreps_with_instructions(irreps_in, sh, o3.Irreps([(2, ir) for _, ir in sh]))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        tp = o3.TensorProduct(
            irreps_in, sh, mid, instructions=ins, shared_weights=False, internal_weights=False
        )
    finally:
        torch.set_default_dtype(previous)
    ei = graph(N, E, seed=seed, isolated=(N - 1,))
    ei[:, :3] = torch.tensor([[0, 0, 1], [0, 1, 1]])  # self edge and a repeated pair
    return (
        FusedConvTP.from_e3nn(tp),
        ei,
        inputs(tp, N, ei.shape[1], torch.float64, seed=seed, requires_grad=True),
    )


@needs_ext
def test_gradcheck_and_gradgradcheck_compiled_kernel():
    fused, ei, xyw = small_problem("2x0e+2x1o+1x2e", 2)
    fn = lambda x, y, w: fused(x, y, w, ei)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xyw)
    assert torch.autograd.gradgradcheck(fn, xyw)


def test_gradcheck_and_gradgradcheck_torch_fallback(debug_switch):
    debug_switch("CFM_PLUGINS_FORCE_TORCH", "1")
    assert _backend.choose(torch.device("cpu")) == "torch"
    fused, ei, xyw = small_problem("1x0e+1x1o", 2, N=4, E=6)
    fn = lambda x, y, w: fused(x, y, w, ei)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xyw)
    assert torch.autograd.gradgradcheck(
        fn, xyw, fast_mode=True
    )  # full mode: same code, 10x the time


def test_torch_fallback_matches_compiled_and_e3nn(debug_switch):
    tp = mace_tp("0e+1o", 3, 8)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(9, 40, seed=5, isolated=(2,))
    outs = []
    for force in ("1", "0"):
        debug_switch("CFM_PLUGINS_FORCE_TORCH", force)
        x, y, w = inputs(tp, 9, ei.shape[1], torch.float64, seed=6, requires_grad=True)
        out = fused(x, y, w, ei)
        g = torch.autograd.grad((out**2).sum(), (x, y, w))
        outs.append((out.detach(),) + g)
    x, y, w = inputs(tp, 9, ei.shape[1], torch.float64, seed=6, requires_grad=True)
    ref = reference(tp, x, y, w, ei)
    gref = torch.autograd.grad((ref**2).sum(), (x, y, w))
    for a, b, r in zip(outs[0], outs[1], (ref.detach(),) + gref):
        assert rel_err(a, r) < 1e-10 and rel_err(b, r) < 1e-10


def test_no_edges_and_isolated_nodes_give_zeros():
    tp = mace_tp("0e+1o", 2, 8)
    fused = FusedConvTP.from_e3nn(tp)
    ei = torch.zeros(2, 0, dtype=torch.int64)
    x, y, w = inputs(tp, 6, ei.shape[1], torch.float64, requires_grad=True)
    out = fused(x, y, w, ei)
    assert out.shape == (6, tp.irreps_out.dim) and torch.all(out == 0)
    gx, gy, gw = torch.autograd.grad(out.sum(), (x, y, w), create_graph=True)
    assert (
        torch.all(gx == 0)
        and gy.shape == (0, tp.irreps_in2.dim)
        and gw.shape == (0, tp.weight_numel)
    )
    (ggx,) = torch.autograd.grad(gx.sum(), (x,), allow_unused=True)
    assert ggx is None or torch.all(ggx == 0)
    # no nodes and no edges
    x0 = torch.zeros(0, tp.irreps_in1.dim, dtype=torch.float64)
    assert fused(x0, y.detach(), w.detach(), ei).shape == (0, tp.irreps_out.dim)
    # isolated atoms: gradient rows of the isolated nodes are zero
    ei = torch.tensor([[0, 1, 1], [1, 0, 3]])
    x, y, w = inputs(tp, 6, ei.shape[1], torch.float64, requires_grad=True)
    out = fused(x, y, w, ei)
    (gx,) = torch.autograd.grad((out**2).sum(), (x,))
    assert (
        torch.all(out[[2, 4, 5]] == 0)
        and torch.all(gx[[2, 3, 4, 5]] == 0)
        and gx[0].abs().sum() > 0
    )


def test_bad_input_raises_value_error():
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(5, 7)
    x, y, w = inputs(tp, 5, ei.shape[1], torch.float64)
    bad = {
        "node_feats shape": (x[:, :-1], y, w, ei),
        "edge_attrs shape": (x, y[:, :-1], w, ei),
        "tp_weights shape": (x, y, w[:, :-1], ei),
        "dtype mismatch": (x.float(), y, w, ei),
        "out of range": (x, y, w, ei.clone().index_fill_(1, torch.tensor([2]), 5)),
        "out of range ": (x, y, w, ei.clone().index_fill_(1, torch.tensor([0]), -1)),
        "edges in edge_index": (x, y[:-1], w[:-1], ei),
        "edge_index shape": (x, y, w, ei[:1]),
        "edge_index dtype": (x, y, w, ei.double()),
        "float32 or float64": (x.half(), y.half(), w.half(), ei),
    }
    for what, args in bad.items():
        with pytest.raises(ValueError, match=what.strip()):
            fused(*args)


def test_rejects_what_the_kernel_does_not_cover():
    tp = o3.TensorProduct(
        "2x0e+2x1o",
        "1x1o",
        "2x1o+2x0e",
        [(0, 0, 0, "uvw", True), (1, 0, 1, "uvw", True)],
        shared_weights=False,
        internal_weights=False,
    )
    with pytest.raises(ValueError, match="uvu"):
        FusedConvTP.from_e3nn(tp)
    tp = o3.TensorProduct(
        "2x0e",
        "2x0e",
        "2x0e",
        [(0, 0, 0, "uvu", True)],
        shared_weights=False,
        internal_weights=False,
    )
    with pytest.raises(ValueError, match="multiplicity"):
        FusedConvTP.from_e3nn(tp)


def test_state_dict_identical_and_to_e3nn_restores():
    tp = mace_tp("0e+1o", 3, 8)
    fused = FusedConvTP.from_e3nn(tp)
    sd_tp, sd_f = tp.state_dict(), fused.state_dict()
    assert list(sd_tp) == list(sd_f) and len(sd_f) > 0
    assert all(torch.equal(sd_tp[k], sd_f[k]) for k in sd_tp)
    fused.load_state_dict(sd_tp)
    assert fused.weight_numel == tp.weight_numel
    assert (fused.irreps_in1, fused.irreps_in2, fused.irreps_out) == (
        tp.irreps_in1,
        tp.irreps_in2,
        tp.irreps_out,
    )
    assert fused.instructions == tp.instructions
    back = fused.to_e3nn()
    assert back is tp and list(back.state_dict()) == list(sd_tp)


@needs_ext
def test_deterministic_across_runs_and_threads():
    tp = mace_tp("0e+1o", 3, 128, torch.float32)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(40, 1500, seed=8)
    x, y, w = inputs(tp, 40, ei.shape[1], torch.float32, requires_grad=True)
    runs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 2):
            torch.set_num_threads(n)
            out = fused(x, y, w, ei)
            runs.append((out,) + torch.autograd.grad((out**2).sum(), (x, y, w)))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_csr_cached_per_edge_index_and_version():
    ei = graph(10, 30, seed=9)
    a = ctp.edge_csr(ei, 10)
    assert ctp.edge_csr(ei, 10) is a
    assert ctp.edge_csr(ei.clone(), 10) is not a
    ei[0, 0] = (ei[0, 0] + 1) % 10  # in-place change bumps the version: regrouped
    b = ctp.edge_csr(ei, 10)
    assert b is not a and torch.equal(b.sender, ei[0])
    assert torch.equal(b.receiver[b.rperm], torch.sort(ei[1]).values)
    assert (
        b.rptr.tolist() == torch.searchsorted(torch.sort(ei[1]).values, torch.arange(11)).tolist()
    )


def test_pickle_round_trip_in_a_fresh_process(tmp_path):
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(6, 12, seed=10)
    x, y, w = inputs(tp, 6, ei.shape[1], torch.float64)
    torch.save({"m": fused, "args": (x, y, w, ei), "out": fused(x, y, w, ei)}, tmp_path / "m.pt")
    code = (
        "import mace, torch; d = torch.load(r'%s', weights_only=False); "
        "assert torch.equal(d['m'](*d['args']), d['out']); print('ok')"
    ) % (tmp_path / "m.pt")
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_torch_compile_forward_and_backward():
    tp = mace_tp("0e+1o", 2, 8)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(7, 20, seed=11)
    x, y, w = inputs(tp, 7, ei.shape[1], torch.float64, requires_grad=True)

    def loss(x, y, w):
        return (fused(x, y, w, ei) ** 2).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    ref = loss(x, y, w)
    got = compiled(x, y, w)
    assert torch.allclose(got, ref, rtol=1e-12)
    g_ref = torch.autograd.grad(ref, (x, y, w))
    g_got = torch.autograd.grad(got, (x, y, w))
    assert all(rel_err(a, b) < 1e-12 for a, b in zip(g_got, g_ref))


def test_torch_compile_double_backward_matches_eager():
    """Force training as the static plugin compiles it (the forces taken inside the compiled
    function, ``autograd.grad`` traced into the graph; then the gradient of a loss on them)
    equals eager, around the channel-last reorderings too (``0e+1o`` in, l<=2 out: neither is the
    identity). A custom autograd function whose backward applies itself again gave second
    derivatives off by 5e-4 there: traced, the reorderings are plain ``index_select``."""
    from cfm_plugins.static_shapes.forward import configure_dynamo

    configure_dynamo()
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    assert not fused._identity_in and not fused._identity_out
    ei = graph(7, 20, seed=13)

    def forces(x, y, w):
        energy = (fused(x, y, w, ei) ** 2).sum()
        gx, gy = torch.autograd.grad(energy, (x, y), create_graph=True)
        return energy, gx, gy

    results = []
    for fn in (forces, torch.compile(forces, backend="aot_eager", fullgraph=True)):
        x, y, w = inputs(tp, 7, ei.shape[1], torch.float64, seed=14, requires_grad=True)
        energy, gx, gy = fn(x, y, w)
        results.append(torch.autograd.grad(energy + (gx**2).sum() + (gy**2).sum(), (x, y, w)))
    for a, b in zip(*reversed(results)):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-12


@needs_ext
def test_opcheck_custom_ops():
    fused, ei, (x, y, w) = small_problem("2x0e+2x1o", 2)
    csr = ctp.edge_csr(ei, x.shape[0])
    xc = x.detach().index_select(1, fused._cl_perm_in).requires_grad_()
    graph_ = [csr.sender, csr.receiver, csr.rperm, csr.rptr, csr.sperm, csr.sptr]
    desc = fused.operator_tables()
    torch.library.opcheck(torch.ops.cfm.conv_tp_fwd.default, (xc, y, w, graph_, *desc))
    g = torch.randn(x.shape[0], fused.descriptor.dim_out, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(
        torch.ops.cfm.conv_tp_bwd.default, (g, xc, y, w, graph_, *desc, True, True, True)
    )


@needs_cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_cuda_matches_cpu(dtype, tol):
    tp = mace_tp("0e+1o", 3, 128, dtype)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(50, 900, seed=12, isolated=(3,))
    x, y, w = inputs(tp, 50, ei.shape[1], dtype, requires_grad=True)
    out = fused(x, y, w, ei)
    grads = torch.autograd.grad((out**2).sum(), (x, y, w))
    fused_cuda = FusedConvTP.from_e3nn(tp).cuda()
    xc, yc, wc = (t.detach().cuda().requires_grad_() for t in (x, y, w))
    outc = fused_cuda(xc, yc, wc, ei.cuda())
    gradc = torch.autograd.grad((outc**2).sum(), (xc, yc, wc), create_graph=True)
    assert _backend.choose(xc.device) == "cuda", "CUDA kernels not built (CFM_PLUGINS_CUDA=1)"
    assert rel_err(outc.cpu(), out.detach()) < tol
    for a, b in zip(gradc, grads):
        assert rel_err(a.detach().cpu(), b) < tol
    (gg,) = torch.autograd.grad(gradc[1].sum(), (wc,))
    assert torch.isfinite(gg).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (20 GiB of it)")
def test_cuda_weight_gradient_past_2_31_elements():
    """More edges than 2**31 / weights per edge (an H200 took an illegal address in Triton's edge
    kernel at 2,496,100 edges of this layer: edge * row stride wrapped in int32): the last edges'
    weight-gradient rows are what those edges alone give (the gradient of an edge's weights reads
    that edge only). The GPU backend in force (``auto``: Triton where it imports)."""
    tp = mace_tp("0e+1o", 3, 128, torch.float32)
    fused = FusedConvTP.from_e3nn(tp).cuda()
    N, E = 1000, 2**31 // tp.weight_numel + 64
    ei = graph(N, E, seed=21).cuda()
    x, y, w = (t.cuda() for t in inputs(tp, N, E, torch.float32))
    xc, g_t, desc, desc_t, meta = op_args(fused, x, ei)
    g = torch.randn(N, meta[1], device="cuda")
    gw = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, False, False, True)[2][
        -3:
    ].cpu()
    del w
    tail = slice(E - 3, E)
    _, g_s, *_ = op_args(fused, x, ei[:, tail].contiguous())
    w_s = torch.randn(
        3, tp.weight_numel, device="cuda"
    )  # the weight gradient does not read the weights
    ref = torch.ops.cfm.conv_tp_bwd(
        g, xc, y[tail].contiguous(), w_s, g_s, desc, desc_t, meta, False, False, True
    )[2]
    assert ref.abs().max() > 0 and rel_err(gw, ref.cpu()) < 1e-5


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_cuda_triton_edge_tiles_match_the_default(dtype, launch_settings):
    """Every tile of Triton's edge kernel (configs.py: the default and the alternatives autotuning
    picks from), compiled for the GPU: the edge gradients of each gradient subset equal the default
    tile's, to round-off (the sums over channels are taken in other tiles)."""
    from cfm_plugins.ops import triton as triton_kernels
    from cfm_plugins.ops.triton import configs

    if not triton_kernels.available()[0]:
        pytest.skip(f"the Triton kernels cannot run here: {triton_kernels.available()[1]}")
    launch_settings(backend="triton")
    assert _backend.runs_triton(torch.device("cuda"))

    tp = mace_tp("0e+1o", 3, 48, dtype)
    fused = FusedConvTP.from_e3nn(tp).cuda()
    N, E = 60, 1500
    ei = graph(N, E, seed=31, isolated=(7,)).cuda()
    x, y, w = (t.cuda() for t in inputs(tp, N, E, dtype, seed=32))
    xc, g_t, desc, desc_t, meta = op_args(fused, x, ei)
    g = torch.randn(N, meta[1], dtype=dtype, device="cuda")
    subsets = [(False, True, True), (False, True, False), (False, False, True)]

    def edge_grads(tile):
        with configs.override(tp_edge=tile):
            return edge_gradients(g, xc, y, w, g_t, desc, desc_t, meta, subsets)

    tiles = configs.configs_for("tp_edge", "float64" if dtype == torch.float64 else "float32")
    ref = edge_grads(tiles[0])
    assert all(r.abs().max() > 0 for r in ref)
    for tile in tiles[1:]:
        got = edge_grads(tile)
        for a, b in zip(got, ref):
            assert rel_err(a.cpu(), b.cpu()) < (1e-12 if dtype == torch.float64 else 1e-5), (
                tile.label()
            )


@needs_cuda
def test_cuda_gradgradcheck():
    fused, ei, xyw = small_problem("2x0e+2x1o", 2)
    fused = fused.cuda()
    ei = ei.cuda()
    xyw = [t.detach().cuda().requires_grad_() for t in xyw]
    fn = lambda x, y, w: fused(x, y, w, ei)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xyw)
    assert torch.autograd.gradgradcheck(fn, xyw)


def test_module_summary_mentions_sparsity():
    fused = FusedConvTP.from_e3nn(mace_tp("0e+1o", 3, 8))
    text = repr(fused)
    assert "10 paths" in text and "CG entries" in text
    buf = io.StringIO()
    print(fused.paths[0], file=buf)
    assert "mul=8" in buf.getvalue()


def test_csr_cache_entry_dropped_with_its_edge_index():
    ei = graph(10, 30, seed=13)
    ctp.edge_csr(ei, 10)
    n = len(ctp._CSR_CACHE)
    del ei
    assert len(ctp._CSR_CACHE) == n - 1


# ---- outputs without a zero fill: the kernels store every element (NaN-filled memory proves it)
def _tp_with_targets(hidden: str, lmax: int, targets: str, channels: int = 3):
    """A uvu conv TP as mace builds it, with only ``targets`` as output irreps: feature rows or
    edge attributes no path reads are the gaps a kernel leaves in a gradient."""
    irreps_in = o3.Irreps([(channels, ir) for _, ir in o3.Irreps(hidden)])
    sh = o3.Irreps.spherical_harmonics(lmax)
    target = o3.Irreps([(channels, ir) for _, ir in o3.Irreps(targets)])
    mid, ins = tp_out_irreps_with_instructions(irreps_in, sh, target)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return o3.TensorProduct(
            irreps_in, sh, mid, instructions=ins, shared_weights=False, internal_weights=False
        )
    finally:
        torch.set_default_dtype(previous)


GAP_CASES = {
    "mace layer": lambda: mace_tp("0e+1o", 3, 4),
    "feature rows no path reads": lambda: _tp_with_targets("0e+3o", 1, "0e+1o"),
    "edge attributes no path reads": lambda: _tp_with_targets("0e+1o", 3, "0e+1o"),
}


def _device_param():
    return pytest.mark.parametrize(
        "device", ["cpu", pytest.param("cuda", marks=needs_cuda)], ids=["cpu", "cuda"]
    )


@pytest.fixture
def cpp_kernels():
    """The C++ kernels on every device (CUDA: the C++ CUDA kernels, not Triton), put back after."""
    previous = _backend.gpu_backend()
    _backend.set_gpu_backend("cuda")
    yield
    _backend.set_gpu_backend(previous)


@needs_ext
@_device_param()
@pytest.mark.parametrize("case", list(GAP_CASES))
def test_outputs_unfilled_are_stored_whole(case, device, nan_uninitialised, cpp_kernels):
    """The operators allocate their outputs uninitialised (no zero fill). With every uninitialised
    element NaN, the forward, each gradient subset of ``conv_tp_bwd`` and the double backward equal
    e3nn's: no NaN, the rows of a node without incoming edges (forward) or outgoing ones (feature
    gradient) zero, and the gaps (feature rows or edge attributes no path reads) zero."""
    tp = GAP_CASES[case]()
    assert "edge attributes" not in case or tp.irreps_out.lmax < tp.irreps_in2.lmax
    fused = FusedConvTP.from_e3nn(tp).to(device)
    tp = tp.to(device)
    N = 8
    ei = graph(N, 40, seed=21, isolated=(2, 5, 6))
    ei = torch.cat([ei, torch.tensor([[5, 1], [0, 6]])], dim=1).to(device)  # 5 sends, 6 receives
    g = torch.randn(N, tp.irreps_out.dim, dtype=torch.float64, device=device)
    for need in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1), (0, 1, 1)]:
        grads = []
        for fn in (lambda x, y, w: reference(tp, x, y, w, ei), lambda x, y, w: fused(x, y, w, ei)):
            xyw = [t.to(device) for t in inputs(tp, N, ei.shape[1], torch.float64, seed=22)]
            wanted = [t.requires_grad_() for t, n in zip(xyw, need) if n]
            out = fn(*xyw)
            grads.append([out.detach(), *torch.autograd.grad((out * g).sum(), wanted)])
        for a, b in zip(*reversed(grads)):
            assert not a.isnan().any() and b.abs().max() > 0 and rel_err(a, b) < 1e-12
        out = grads[1][0]
        assert torch.all(out[[2, 5]] == 0)
        if need[0]:
            assert torch.all(grads[1][1][[2, 6]] == 0)
    results = []
    for fn in (lambda x, y, w: reference(tp, x, y, w, ei), lambda x, y, w: fused(x, y, w, ei)):
        x, y, w = (
            t.to(device).requires_grad_()
            for t in inputs(tp, N, ei.shape[1], torch.float64, seed=23)
        )
        gx, gy, gw = torch.autograd.grad((fn(x, y, w) * g).sum(), (x, y, w), create_graph=True)
        second = torch.autograd.grad((gx**2).sum() + (gy**2).sum() + (gw**2).sum(), (x, y, w))
        results.append([gx.detach(), gy.detach(), gw.detach(), *second])
    for a, b in zip(*reversed(results)):
        assert not a.isnan().any() and rel_err(a, b) < 1e-10
    x, y, w = (t.to(device) for t in inputs(tp, N, 0, torch.float64))
    empty = torch.zeros(2, 0, dtype=torch.int64, device=device)
    assert torch.all(fused(x, y, w, empty) == 0)  # no edge: no kernel runs, zeros


@needs_ext
@_device_param()
def test_weight_gradient_of_a_layout_with_gaps_is_zero_in_the_gaps(
    device, nan_uninitialised, cpp_kernels
):
    """Weights that the paths do not tile (slots between and after the paths' own; e3nn never lays
    them out so, a hand-made descriptor does): the edge kernels zero such a row first, so the weight
    gradient is the tiled layout's in the paths' slots and zero in the gaps, and the forward does
    not read the gaps."""
    tp = mace_tp("0e+1o", 2, 3)
    fused = FusedConvTP.from_e3nn(tp).to(device)
    d = fused.descriptor
    gap = 2
    woff = d.path_woff + gap * (1 + torch.arange(d.num_paths).numpy())
    wide = d.weight_numel + gap * (d.num_paths + 1)
    gapped = dataclasses.replace(d, path_woff=woff.astype(d.path_woff.dtype), weight_numel=wide)

    def tables(desc):
        ints, coef = desc.packed()
        return [torch.as_tensor(ints, device=device), torch.as_tensor(coef, device=device)]

    N, E = 6, 25
    x, y, w = (t.to(device) for t in inputs(tp, N, E, torch.float64, seed=31))
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(N, E, seed=32).to(device))
    slots = torch.cat([torch.arange(int(o), int(o) + int(m)) for o, m in zip(woff, d.path_mul)]).to(
        device
    )
    w_wide = torch.full((E, wide), 1e300, dtype=torch.float64, device=device)  # gaps: never read
    w_wide[:, slots] = w
    g = torch.randn(N, meta[1], dtype=torch.float64, device=device)
    ops = torch.ops.cfm
    wide_tables = (tables(gapped), tables(gapped.transpose()))
    out = ops.conv_tp_fwd(xc, y, w_wide, g_t, *wide_tables, meta)
    assert rel_err(out, ops.conv_tp_fwd(xc, y, w, g_t, desc, desc_t, meta)) < 1e-14
    for need in [(False, False, True), (True, True, True)]:
        got = ops.conv_tp_bwd(g, xc, y, w_wide, g_t, *wide_tables, meta, *need)
        ref = ops.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, *need)
        gw = got[2]
        assert not gw.isnan().any() and rel_err(gw[:, slots], ref[2]) < 1e-14
        gaps = torch.ones(wide, dtype=torch.bool, device=device)
        gaps[slots] = False
        assert torch.all(gw[:, gaps] == 0)
        if need[0]:
            assert rel_err(got[0], ref[0]) < 1e-14 and rel_err(got[1], ref[1]) < 1e-14


@needs_ext
def test_operators_fill_none_of_their_outputs():
    """Forward, backward and double backward of force training run the C++ operators with no
    zero fill of any output (each would be a pass over an [edges, weights] or [nodes, features]
    tensor): no ``aten::fill_``/``aten::zero_`` under a ``cfm::conv_tp_*`` operator; and the
    channel-last reorderings around them differentiate into gathers, not into index_select's
    backward (a zero fill and a scatter)."""
    fused, ei, (x, y, w) = small_problem("2x0e+2x1o", 2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        gx, gy, gw = torch.autograd.grad(
            (fused(x, y, w, ei) ** 2).sum(), (x, y, w), create_graph=True
        )
        torch.autograd.grad((gx**2).sum() + (gy**2).sum() + (gw**2).sum(), (x, y, w))

    def under_operator(e):
        while e is not None:
            if e.name.startswith("cfm::conv_tp"):
                return True
            e = e.cpu_parent
        return False

    events = prof.events()
    operators = {e.name for e in events if e.name.startswith("cfm::conv_tp")}
    fills = [
        e.name for e in events if e.name in ("aten::fill_", "aten::zero_") and under_operator(e)
    ]
    assert operators == {"cfm::conv_tp_fwd", "cfm::conv_tp_bwd"} and fills == []
    assert not fused._identity_in and not fused._identity_out
    assert not [e.name for e in events if "IndexSelectBackward" in e.name]
