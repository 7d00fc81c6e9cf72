"""The Triton conv TP + scatter (``cfm_plugins.ops.triton.conv_tp``) in the interpreter on CPU,
registered as the ``cfm::conv_tp_*`` operators' CPU kernels: against e3nn's TensorProduct +
scatter_sum (forward, gradients, double backward, float64 and float32), against the C++ kernels
(every gradient subset), gradcheck/gradgradcheck, opcheck, torch.compile, non-contiguous and
expanded inputs, tiles smaller than the problem, isolated nodes and an empty graph, weight rows
past 2**31 elements; outputs left unfilled by default (NaN-filled here first) where the kernels
store every column, zero-filled where not, and every output zero-filled with the debug switch
``CFM_PLUGINS_TRITON_UNFILLED=0``, which a bad value of fails at the kernels' set-up.
"""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton import conv_tp as ttp
from cfm_plugins.ops.triton.configs import TileConfig, override
from tests.helpers.conv_tp_cases import graph, inputs, op_args, reference, rel_err
from tests.helpers.mace_models import mace_tp

pytestmark = pytest.mark.usefixtures("triton_cpu")

#: float32 tolerance: no tl.dot (TF32 never enters on a GPU); float32 round-off of the sums
F32_TOL = 2e-5


def tiled_case(seed: int, isolated: int, dtype=torch.float64):
    """7 channels (tiles of 4 split them), 6 nodes, 27 edges (blocks of 2 or 4 split them), one node
    isolated: the module, the operator arguments and an output gradient."""
    tp = mace_tp("0e+1o", 2, 7, dtype)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 6, 27, dtype, seed=seed)
    xc, g_t, desc, desc_t, meta = op_args(
        fused, x, graph(6, 27, seed=seed + 1, isolated=(isolated,))
    )
    return fused, (xc, y, w, g_t, desc, desc_t, meta), torch.randn(6, meta[1], dtype=dtype)


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-10), (torch.float32, F32_TOL)], ids=["f64", "f32"]
)
@pytest.mark.parametrize("hidden,lmax,channels", [("0e+1o", 3, 5), ("0e+1o+2e", 2, 3)])
def test_forward_gradients_and_double_backward_match_e3nn(hidden, lmax, channels, dtype, tol):
    """MACE's training pattern through the cfm:: operators (C++ autograd calling the Triton
    kernels): receiver sums, d/d(x, y, w) with create_graph, then the gradient of a loss on them."""
    tp = mace_tp(hidden, lmax, channels, dtype)
    fused = FusedConvTP.from_e3nn(tp)
    N, E = 7, 20
    ei = graph(N, E, seed=3, isolated=(4,))
    results = []
    for fn in (lambda x, y, w: reference(tp, x, y, w, ei), lambda x, y, w: fused(x, y, w, ei)):
        x, y, w = inputs(tp, N, E, dtype, seed=4, requires_grad=True)
        out = fn(x, y, w)
        energy = (out**2).sum() + out.sum()
        gx, gy, gw = torch.autograd.grad(energy, (x, y, w), create_graph=True)
        second = torch.autograd.grad((gy**2).sum() + (gx * gx).sum(), (x, y, w))
        results.append((out.detach(), gx.detach(), gy.detach(), gw.detach()) + second)
    assert torch.all(results[1][0][4] == 0)  # the isolated node receives nothing
    for a, b in zip(*results[::-1]):
        assert b.abs().max() > 0 and rel_err(a, b) < tol


@pytest.mark.parametrize(
    "need",
    [
        (True, True, True),
        (True, False, False),
        (False, True, False),
        (False, False, True),
        (False, True, True),
    ],
    ids=["all", "x", "y", "w", "yw"],
)
def test_every_gradient_subset_matches_the_cpp_kernel(triton_cpu, need):
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 6, 15, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(6, 15))
    g = torch.randn(6, meta[1], dtype=torch.float64)
    got = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, *need)
    with triton_cpu():
        ref = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, *need)
    for a, b, wanted in zip(got, ref, need):
        assert a.shape == b.shape
        if wanted:
            assert b.abs().max() > 0 and rel_err(a, b) < 1e-12


def nan_filled_outputs(monkeypatch) -> list:
    """The launchers' unfilled outputs (``_uninitialised``) filled with NaN, so that any element no
    kernel stores shows; returns the list of the shapes handed out that way."""
    handed = []

    def nan_filled(shape, like):
        handed.append(tuple(shape))
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)

    monkeypatch.setattr(ttp, "_uninitialised", nan_filled)
    return handed


@pytest.fixture
def poisoned(monkeypatch, debug_switch):
    """The default (``CFM_PLUGINS_TRITON_UNFILLED`` unset) with NaN in the unfilled outputs
    (:func:`nan_filled_outputs`)."""
    debug_switch(ttp.UNFILLED_ENV, None)
    return nan_filled_outputs(monkeypatch)


def test_outputs_are_zero_filled_when_asked(triton_cpu, monkeypatch, debug_switch):
    """With ``CFM_PLUGINS_TRITON_UNFILLED=0`` every output is zero-filled first (the former
    default): nothing is handed out unfilled, and the results are the C++ kernels'."""
    debug_switch(ttp.UNFILLED_ENV, "0")
    handed = nan_filled_outputs(monkeypatch)
    _, args, g = tiled_case(seed=16, isolated=1)
    got = torch.ops.cfm.conv_tp_fwd(*args), *torch.ops.cfm.conv_tp_bwd(g, *args, True, True, True)
    assert handed == []
    with triton_cpu():
        ref = (
            torch.ops.cfm.conv_tp_fwd(*args),
            *torch.ops.cfm.conv_tp_bwd(g, *args, True, True, True),
        )
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-12


def test_outputs_left_unfilled_are_stored_whole(triton_cpu, poisoned):
    """MACE's tables store every column of the forward's output and of each gradient, an isolated
    node's row included, so the launchers leave those tensors unfilled: filled with NaN first, with
    channel tiles and edge blocks smaller than the problem, they equal the C++ kernels' results."""
    _, args, g = tiled_case(seed=12, isolated=2)
    y, w, meta = args[1], args[2], args[-1]

    def passes():
        return torch.ops.cfm.conv_tp_fwd(*args), *torch.ops.cfm.conv_tp_bwd(
            g, *args, True, True, True
        )

    with override(tp_segment=TileConfig(2, 4), tp_edge=TileConfig(4, 4)):
        got = passes()
    assert poisoned == [(6, meta[1]), (6, meta[0]), tuple(y.shape), tuple(w.shape)]
    with triton_cpu():
        ref = passes()
    assert torch.all(got[0][2] == 0) and torch.all(
        got[1][2] == 0
    )  # the isolated node: no sum, no gradient
    for a, b in zip(got, ref):
        assert not a.isnan().any() and b.abs().max() > 0 and rel_err(a, b) < 1e-12


def test_outputs_a_kernel_leaves_gaps_in_are_zero_filled(triton_cpu, poisoned):
    """0e+3o features, harmonics l<=1, targets 0e+1o (mace's rule for the paths): no path reads the
    3o rows, so the node-feature gradient's kernel stores only the 0e columns and that gradient is
    zero-filled, the others not; a graph without edges launches nothing and fills every output."""
    tp = mace_tp("0e+3o", 1, 2)
    fused = FusedConvTP.from_e3nn(tp)
    tables_t = ttp.TPTables.from_descriptor(fused.descriptor.transpose())
    N, E = 5, 12
    x, y, w = inputs(tp, N, E, torch.float64, seed=14)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(N, E, seed=15))
    assert tables_t.out_width == 2 < meta[0] == 16  # 2 channels of 0e stored, of 2x0e+2x3o
    g = torch.randn(N, meta[1], dtype=torch.float64)
    got = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, True, True, True)
    assert poisoned == [tuple(y.shape), tuple(w.shape)]
    with triton_cpu():
        ref = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, True, True, True)
    assert torch.all(got[0][:, 2:] == 0) and got[0][:, :2].abs().max() > 0
    for a, b in zip(got, ref):
        assert not a.isnan().any() and rel_err(a, b) < 1e-12
    poisoned.clear()
    empty = op_args(fused, x, torch.zeros(2, 0, dtype=torch.int64))[1]
    outs = (
        ttp.fwd(xc, y[:0], w[:0], empty, desc, desc_t, meta),
        *ttp.bwd(g, xc, y[:0], w[:0], empty, desc, desc_t, meta, True, True, True),
    )
    assert poisoned == [] and all(torch.all(t == 0) for t in outs)


def test_a_misspelt_unfilled_value_is_refused_at_set_up(triton_cpu, debug_switch):
    """The debug switch is read once, when the kernels are registered: a bad value fails there,
    before anything is registered, never at a launch."""
    from cfm_plugins.ops import triton as triton_kernels

    debug_switch(ttp.UNFILLED_ENV, "yes")
    with triton_cpu():  # the Triton kernels unregistered here: register them again
        with pytest.raises(ValueError, match="CFM_PLUGINS_TRITON_UNFILLED='yes': use 1 .* or 0"):
            triton_kernels.register("CPU")
        assert not triton_kernels.registered("CPU")
        debug_switch(ttp.UNFILLED_ENV, "1")


def test_stored_width_of_a_set_of_columns():
    assert ttp._width([0, 2, 1, 1]) == 3 and ttp._width([]) == 0
    assert ttp._width([1, 2]) is None and ttp._width([0, 2]) is None


@pytest.mark.parametrize("tile", [None, TileConfig(4, 4)], ids=["default", "small"])
def test_weight_gradient_of_an_edge_slice_is_those_rows_of_the_whole(triton_cpu, tile):
    """The double backward sums its second weight-gradient term slice by slice of edges (the C++
    autograd, add_weight_term_in_slices): sender, receiver, y and w sliced, the CSR pointers and the
    node tensors whole. The Triton kernel must give those rows of the whole gradient, with a tile
    as large as the problem and with one smaller (blocks that straddle the slice's ends)."""
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    N, E, a, b = 6, 30, 11, 26
    x, y, w = inputs(tp, N, E, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(N, E))
    g = torch.randn(N, meta[1], dtype=torch.float64)
    sliced = [t[a:b] if i < 2 else t for i, t in enumerate(g_t)]
    with override(**({"tp_edge": tile} if tile else {})):
        whole = torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, False, False, True)[
            2
        ]
        part = torch.ops.cfm.conv_tp_bwd(
            g, xc, y[a:b], w[a:b], sliced, desc, desc_t, meta, False, False, True
        )[2]
    assert part.shape == (b - a, w.shape[1]) and part.abs().max() > 0
    assert torch.equal(part, whole[a:b])


def test_gradcheck_and_gradgradcheck():
    tp = mace_tp("0e+1o", 1, 2)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(4, 6, seed=5, isolated=(3,))
    ei[:, :2] = torch.tensor([[0, 0], [0, 1]])  # a self edge
    xyw = inputs(tp, 4, 6, torch.float64, requires_grad=True)
    fn = lambda x, y, w: fused(x, y, w, ei)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xyw, fast_mode=True)
    assert torch.autograd.gradgradcheck(fn, xyw, fast_mode=True)


def test_opcheck_operators():
    tp = mace_tp("0e+1o", 1, 3)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 5, 9, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(5, 9))
    xc, y, w = (t.requires_grad_() for t in (xc, y, w))
    torch.library.opcheck(torch.ops.cfm.conv_tp_fwd.default, (xc, y, w, g_t, desc, desc_t, meta))
    g = torch.randn(5, meta[1], dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(
        torch.ops.cfm.conv_tp_bwd.default, (g, xc, y, w, g_t, desc, desc_t, meta, True, False, True)
    )


def test_torch_compile_forward_and_backward():
    tp = mace_tp("0e+1o", 2, 3)
    fused = FusedConvTP.from_e3nn(tp)
    ei = graph(5, 12)
    x, y, w = inputs(tp, 5, 12, torch.float64, requires_grad=True)

    def loss(x, y, w):
        return (fused(x, y, w, ei) ** 2).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = compiled(x, y, w)
    g_got = torch.autograd.grad(got, (x, y, w))
    ref = (reference(tp, x, y, w, ei) ** 2).sum()
    g_ref = torch.autograd.grad(ref, (x, y, w))
    assert rel_err(got.detach(), ref.detach()) < 1e-10
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(g_got, g_ref))


def test_noncontiguous_and_expanded_inputs():
    """Strides are passed: a column-sliced x, an expanded (stride 0) y and a transposed-storage w
    give what their contiguous copies give."""
    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 6, 14, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(6, 14))
    x_s = torch.cat([xc, xc], dim=1)[:, ::2]
    x_s.copy_(xc)
    y_e = y[:1].expand(14, y.shape[1])
    w_t = w.t().contiguous().t()
    g = torch.randn(6, 2 * meta[1], dtype=torch.float64)[:, ::2]
    assert (
        not x_s.is_contiguous()
        and y_e.stride(0) == 0
        and not w_t.is_contiguous()
        and not g.is_contiguous()
    )
    ref = (
        ttp.fwd(xc, y_e.contiguous(), w, g_t, desc, desc_t, meta),
        ttp.bwd(g.contiguous(), xc, y_e.contiguous(), w, g_t, desc, desc_t, meta, True, True, True),
    )
    got = (
        ttp.fwd(x_s, y_e, w_t, g_t, desc, desc_t, meta),
        ttp.bwd(g, x_s, y_e, w_t, g_t, desc, desc_t, meta, True, True, True),
    )
    assert torch.equal(got[0], ref[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


#: a row stride past 2**31 / 2 elements: the third row starts past 2**31 elements
FAR_ROW_STRIDE = 2**30 + 64


def far_apart_rows(w: torch.Tensor) -> torch.Tensor:
    """``w`` copied into a view whose rows are :data:`FAR_ROW_STRIDE` elements apart: from its third
    row, offsets past 2**31 elements, as the weights of 1.68M edges of 1280 weights have, without
    their memory (4 GiB of address space a row in float32; only the pages of the rows are
    touched)."""
    storage = torch.empty(
        (w.shape[0] - 1) * FAR_ROW_STRIDE + w.shape[1], dtype=w.dtype, device=w.device
    )
    view = storage.as_strided(tuple(w.shape), (FAR_ROW_STRIDE, 1))
    view.copy_(w)
    return view


def test_rows_past_2_31_elements_are_addressed_in_64_bits():
    """The edge kernel's row offsets (edge * row stride) in 64 bits: an H200 took an illegal address
    in the weight-gradient kernel at 2,496,100 edges (edge * weights per edge past 2**31 in int32);
    here, three edges whose weight rows lie 2**30 + 64 elements apart (32-bit offsets: a crash in
    the interpreter). The segment kernels' output rows (node * width) are widened too: checked in
    their source (past 2**31 elements from 2**31 / width nodes)."""
    tp = mace_tp("0e+1o", 2, 4, torch.float32)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 4, 3, torch.float32)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(4, 3))
    g = torch.randn(4, meta[1])
    far = far_apart_rows(w)
    assert torch.equal(
        ttp.fwd(xc, y, far, g_t, desc, desc_t, meta), ttp.fwd(xc, y, w, g_t, desc, desc_t, meta)
    )
    got = ttp.bwd(g, xc, y, far, g_t, desc, desc_t, meta, True, True, True)
    ref = ttp.bwd(g, xc, y, w, g_t, desc, desc_t, meta, True, True, True)
    assert all(torch.equal(a, b) and a.abs().max() > 0 for a, b in zip(got, ref))
    t = ttp.TPTables.from_operator(desc, meta)
    for kernel in ("segment", "edge"):
        flags = {"need_y": True, "need_w": True} if kernel == "edge" else {}
        assert "tl.program_id(0).to(tl.int64)" in ttp.source(t, kernel, **flags), kernel


def test_tiles_smaller_than_the_problem(triton_cpu):
    """7 channels in tiles of 4, nodes with up to ~10 edges in blocks of 2, edges in blocks of 4."""
    tp = mace_tp("0e+1o", 2, 7)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 5, 23, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(5, 23))
    g = torch.randn(5, meta[1], dtype=torch.float64)

    def passes():
        return (
            torch.ops.cfm.conv_tp_fwd(xc, y, w, g_t, desc, desc_t, meta),
            *torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, True, True, True),
        )

    with override(tp_segment=TileConfig(2, 4), tp_edge=TileConfig(4, 4)):
        got = passes()
    with triton_cpu():
        ref = passes()
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-12


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-12), (torch.float32, F32_TOL)], ids=["f64", "f32"]
)
def test_small_tiles_and_every_gradient_subset_match_the_cpp_kernels(triton_cpu, dtype, tol):
    """Tiles smaller than the problem (several edge blocks per node, summed once per program;
    several channel tiles per edge), an isolated node, gradient subsets that launch each edge
    kernel, against the C++ kernels."""
    _, (xc, y, w, g_t, desc, desc_t, meta), g = tiled_case(seed=8, isolated=2, dtype=dtype)
    subsets = [(True, True, True), (False, True, False), (False, True, True), (True, False, True)]
    ttp._KERNELS._hits.clear()  # so that what ran is what this test launched

    def passes():
        return [torch.ops.cfm.conv_tp_fwd(xc, y, w, g_t, desc, desc_t, meta)] + [
            t
            for need in subsets
            for t, wanted in zip(
                torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, *need), need
            )
            if wanted
        ]

    with override(tp_segment=TileConfig(2, 4), tp_edge=TileConfig(4, 4)):
        got = passes()
    launched = {(key[1], tuple(key[2])) for key in ttp._KERNELS._hits}
    assert launched == {
        ("segment", (("transposed", False),)),
        ("segment", (("transposed", True),)),
        ("edge", (("need_w", True), ("need_y", True))),
        ("edge", (("need_w", False), ("need_y", True))),
        ("edge", (("need_w", True), ("need_y", False))),
    }
    with triton_cpu():
        ref = passes()
    assert torch.all(got[0][2] == 0)  # the isolated node receives nothing
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < tol


def test_segment_source_sums_once_per_program_over_presorted_ends():
    """The segment kernel (forward and transposed) sums each output row once, after its loop over
    edge blocks, next to the store, and reads the other ends of the edges in CSR order
    (``other_ptr + ks``, gathered once by the launcher); the edge kernel sums over channels inside
    its loop over channel tiles and walks the edges in their own order."""
    d = FusedConvTP.from_e3nn(mace_tp("0e+1o", 2, 3)).descriptor
    t = ttp.TPTables.from_descriptor(d)

    def reduce_depths(src):  # indentation (in levels) of the lines that sum
        return {(len(ln) - len(ln.lstrip())) // 4 for ln in src.splitlines() if "tl.reduce(" in ln}

    for tables in (t, ttp.TPTables.from_descriptor(d.transpose())):
        segment = ttp.source(tables, "segment")
        assert reduce_depths(segment) == {1} and "other_ptr + ks" in segment  # def body 1
    edge = ttp.source(t, "edge", need_y=True, need_w=True)
    assert reduce_depths(edge) == {2} and "perm_ptr" not in edge  # loop body 2


def test_kernel_cache_generates_each_variant_once(triton_cpu):
    """A launch finds its kernel without generating the source again (0.3 ms a launch otherwise);
    another flag is another kernel; equal tables in another object find the same generated
    module."""
    d = FusedConvTP.from_e3nn(mace_tp("0e+1o", 1, 2)).descriptor
    calls = []

    def generate(t, kernel, **flags):
        calls.append(kernel)
        return ttp.source(t, kernel, **flags)

    cache = _codegen.KernelCache("tp", generate, ttp.function_name)
    t = ttp.TPTables.from_descriptor(d)
    first = cache.get(t, "segment", transposed=False)
    assert cache.get(t, "segment", transposed=False) is first and len(calls) == 1
    assert cache.get(t, "segment", transposed=True) is not first and len(calls) == 2
    twin = ttp.TPTables.from_descriptor(d)
    assert twin == t and twin is not t
    assert cache.get(twin, "segment", transposed=False) is first and len(calls) == 3


def test_empty_graph_and_bad_input():
    tp = mace_tp("0e+1o", 1, 2)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 3, 0, torch.float64)
    out = fused(x, y, w, torch.zeros(2, 0, dtype=torch.int64))
    assert out.shape == (3, tp.irreps_out.dim) and torch.all(out == 0)
    x, y, w = inputs(tp, 3, 4, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(3, 4))
    with pytest.raises(RuntimeError, match=r"x must be \[N, 8\]"):
        ttp.fwd(xc[:, :5], y, w, g_t, desc, desc_t, meta)
    with pytest.raises(RuntimeError, match="w is torch.float32"):
        ttp.fwd(xc, y, w.float(), g_t, desc, desc_t, meta)


def test_tables_and_source():
    """The tables read back from the operator's packed tensors equal the descriptor's (plain and
    transposed); CG entries appear as exact float literals."""
    fused = FusedConvTP.from_e3nn(mace_tp("0e+1o", 2, 3))
    d = fused.descriptor
    assert ttp.TPTables.from_operator(
        [fused._tp_ints, fused._tp_coef], fused._tp_meta
    ) == ttp.TPTables.from_descriptor(d)
    meta_t = [fused._tp_meta[1], fused._tp_meta[0], *fused._tp_meta[2:]]
    t_t = ttp.TPTables.from_operator([fused._tp_ints_t, fused._tp_coef_t], meta_t)
    assert t_t == ttp.TPTables.from_descriptor(d.transpose())
    src = ttp.source(t_t, "segment")
    assert all(repr(float(c)) in src for c in d.ent_coef)
    edge = ttp.source(ttp.TPTables.from_descriptor(d), "edge", need_y=True, need_w=False)
    assert "gw_ptr + eid" not in edge and "gy_ptr + eid" in edge


def test_each_variant_has_its_own_name_in_a_gpu_profile(triton_cpu):
    """A profile lists kernels by function name: the forward, the node-feature gradient and each
    edge-gradient variant are told apart; the launches find their kernels by those names."""
    tp = mace_tp("0e+1o", 1, 3)
    fused = FusedConvTP.from_e3nn(tp)
    t = ttp.TPTables.from_descriptor(fused.descriptor)
    names = {}
    for kernel, transposed, flags in ttp.kernel_variants():
        src = ttp.source(t, kernel, transposed=transposed, **flags)
        names[ttp.compiled_name(kernel, transposed, flags)] = src.split("def ", 1)[1].split("(", 1)[
            0
        ]
    assert names == {
        "tp_segment": "tp_segment",
        "tp_segment[T]": "tp_segment_t",
        "tp_edge[w,y]": "tp_edge_wy",
        "tp_edge[w]": "tp_edge_w",
        "tp_edge[y]": "tp_edge_y",
    }
    x, y, w = inputs(tp, 5, 9, torch.float64)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(5, 9))
    torch.ops.cfm.conv_tp_bwd(
        torch.randn(5, meta[1], dtype=torch.float64),
        xc,
        y,
        w,
        g_t,
        desc,
        desc_t,
        meta,
        True,
        True,
        False,
    )
    launched = {fn.fn.__name__ for _, fn in ttp._KERNELS._hits.values()}
    assert {"tp_segment_t", "tp_edge_y"} <= launched
