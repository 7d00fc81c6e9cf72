"""The radial conv TP's Triton kernels (``cfm_plugins.ops.triton.conv_tp_radial``) in the
interpreter on CPU, against the reference ``w = h @ wr``, the C++ ``cfm::conv_tp_{fwd,bwd}``
kernels, ``gh = gw @ wr.T`` and ``gwr = h.T @ gw``: every gradient subset in float64 and float32,
K = 64 and K = 12, an isolated node; tl.dot tiles, rank-1 updates (small tiles, and tl.dot off as
for float64 on AMD), the wr gradient over several segments of several edge blocks; outputs stored
whole (NaN-filled first); a graph without edges; the input checks; the operators registered as CPU
kernels (a force-training pattern through the C++ autograd).
"""

from __future__ import annotations

import itertools

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.triton import conv_tp as ttp
from cfm_plugins.ops.triton import conv_tp_radial as ttr
from cfm_plugins.ops.triton.configs import TileConfig, override
from tests.helpers.conv_tp_cases import graph, inputs, op_args, rel_err
from tests.helpers.mace_models import mace_tp
from tests.ops.triton.test_conv_tp import nan_filled_outputs

pytestmark = pytest.mark.usefixtures("triton_cpu")

F32_TOL = 2e-5
#: every (need_x, need_y, need_h, need_wr)
SUBSETS = list(itertools.product((False, True), repeat=4))


def case(K: int, dtype=torch.float64, N: int = 7, E: int = 26, seed: int = 3):
    """4 channels of 0e+1o, harmonics l <= 2, node 2 isolated: the operator arguments
    (x, y, h, wr, graph, desc, desc_t, meta) and an output gradient."""
    tp = mace_tp("0e+1o", 2, 4, dtype)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, _ = inputs(tp, N, E, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    h = torch.randn(E, K, generator=gen, dtype=dtype)
    wr = torch.randn(K, tp.weight_numel, generator=gen, dtype=dtype) / K**0.5
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(N, E, seed=seed + 2, isolated=(2,)))
    g = torch.randn(N, meta[1], generator=gen, dtype=dtype)
    return (xc, y, h, wr, g_t, desc, desc_t, meta), g


def reference(cpp_kernels, args, g):
    """(forward, gx, gy, gh, gwr) with w = h @ wr and the C++ conv TP kernels."""
    x, y, h, wr, *rest = args
    w = h @ wr
    with cpp_kernels():
        out = torch.ops.cfm.conv_tp_fwd(x, y, w, *rest)
        gx, gy, gw = torch.ops.cfm.conv_tp_bwd(g, x, y, w, *rest, True, True, True)
    return out, gx, gy, gw @ wr.T, h.T @ gw


def check(got, ref, need, tol) -> None:
    """``got`` (gx, gy, gh, gwr) against the reference where asked, empty where not."""
    for a, b, wanted in zip(got, ref, need):
        if wanted:
            assert a.shape == b.shape and b.abs().max() > 0 and rel_err(a, b) < tol
        else:
            assert a.numel() == 0 and a.dtype == b.dtype


#: tl.dot in every kernel (tiles of 16 x 16)
DOT_TILES = dict(tp_radial_segment=TileConfig(16, 16), tp_radial_edge=TileConfig(16, 16))


@pytest.mark.parametrize("K", [64, 12])
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-10), (torch.float32, F32_TOL)], ids=["f64", "f32"]
)
def test_every_gradient_subset_matches_the_reference(triton_cpu, dtype, tol, K):
    """K = 64 with tl.dot tiles; K = 12 with the interpreter's tiles (4 channels: rank-1 updates
    in the segment and edge kernels; tl.dot in the wr gradient's kernel)."""
    args, g = case(K, dtype)
    ref = reference(triton_cpu, args, g)
    with override(**(DOT_TILES if K == 64 else {})):
        out = ttr.fwd(*args)
        assert rel_err(out, ref[0]) < tol and torch.all(out[2] == 0)  # node 2 receives nothing
        for need in SUBSETS:
            got = ttr.bwd(g, *args, *need)
            check(got, ref[1:], need, tol)
            if need[0]:
                assert torch.all(got[0][2] == 0)


@pytest.fixture
def poisoned(monkeypatch, debug_switch):
    """Outputs left unfilled (the default) filled with NaN first: any element no kernel stores
    shows."""
    debug_switch(ttp.UNFILLED_ENV, None)
    return nan_filled_outputs(monkeypatch)


@pytest.mark.parametrize(
    "tiles,dot",
    [
        (DOT_TILES, True),
        (dict(tp_radial_segment=TileConfig(2, 4), tp_radial_edge=TileConfig(4, 4)), True),
        (DOT_TILES, False),
    ],
    ids=["dot", "small", "dot-off"],
)
def test_dot_tiles_rank1_updates_and_segments_store_every_element(
    triton_cpu, monkeypatch, poisoned, tiles, dot
):
    """K = 20 (padded to 32): tl.dot tiles, tiles smaller than the problem (rank-1 updates, several
    channel tiles and edge blocks), and tl.dot off (as for float64 on AMD: rank-1 updates in every
    kernel); the wr gradient summed over 3 segments of up to 2 edge blocks. Every output is handed
    out unfilled (NaN) and stored whole."""
    monkeypatch.setattr(ttr, "SEGMENT_MIN", 32)
    monkeypatch.setattr(ttr, "SEGMENTS", 4)
    if not dot:
        monkeypatch.setattr(
            ttr, "_dot_flags", lambda x: dict(IEEE=x.dtype == torch.float32, DOT=False)
        )
    args, g = case(20, E=70, seed=5)
    ref = reference(triton_cpu, args, g)
    assert ttr._segments(70) == (32, 3)
    with override(tp_radial_wr=TileConfig(16, 16), **tiles):
        got = (ttr.fwd(*args), *ttr.bwd(g, *args, True, True, True, True))
    y, h, wr, meta = args[1], args[2], args[3], args[-1]
    assert poisoned == [
        (7, meta[1]),
        (7, meta[0]),
        tuple(y.shape),
        tuple(h.shape),
        (3, *wr.shape),
    ]
    for a, b in zip(got, ref):
        assert not a.isnan().any() and b.abs().max() > 0 and rel_err(a, b) < 1e-12


def test_a_graph_without_edges_and_a_wider_wr():
    """No edges: zeros everywhere and nothing launched; wr wider than the columns the paths read
    (accepted, as by the C++ check): those columns' gradient is zero."""
    args, g = case(12, E=0)
    x, y, h, wr, *rest = args
    out = ttr.fwd(*args)
    gx, gy, gh, gwr = ttr.bwd(g, *args, True, True, True, True)
    assert out.shape == (7, rest[-1][1]) and gx.shape == x.shape and gy.shape == y.shape
    assert gh.shape == (0, 12) and gwr.shape == wr.shape
    assert all(torch.all(t == 0) for t in (out, gx, gwr))
    args, g = case(12)
    x, y, h, wr, *rest = args
    wide = torch.cat([wr, torch.randn(12, 3, dtype=wr.dtype)], dim=1)
    gwr_wide = ttr.bwd(g, x, y, h, wide, *rest, False, False, False, True)[3]
    gwr = ttr.bwd(g, *args, False, False, False, True)[3]
    assert gwr_wide.shape == wide.shape and torch.all(gwr_wide[:, -3:] == 0)
    assert rel_err(gwr_wide[:, :-3], gwr) < 1e-14
    assert torch.equal(ttr.fwd(x, y, h, wide, *rest), ttr.fwd(*args))


def test_bad_input_is_refused_with_the_shapes():
    args, g = case(12, E=10)
    x, y, h, wr, *rest = args
    with pytest.raises(RuntimeError, match=r"y and h must be \[E, \*\] alike"):
        ttr.fwd(x, y, h[:5], wr, *rest)
    with pytest.raises(RuntimeError, match="h is torch.float32"):
        ttr.fwd(x, y, h.float(), wr, *rest)
    with pytest.raises(RuntimeError, match="wr is torch.float32"):
        ttr.fwd(x, y, h, wr.float(), *rest)
    with pytest.raises(
        RuntimeError, match=r"wr must be \[K, weight_numel\] with K = 12 .* got \[11"
    ):
        ttr.fwd(x, y, h, wr[:11], *rest)
    with pytest.raises(RuntimeError, match=r"weight_numel >= 28 .* got \[12, 27\]"):
        ttr.bwd(g, x, y, h, wr[:, :27], *rest, True, True, True, True)
    with pytest.raises(RuntimeError, match=r"g must be torch.float64 \[N, 84\]"):
        ttr.bwd(g[:, :5], *args, True, True, True, True)


def test_the_operators_run_these_kernels_when_registered(triton_cpu):
    """``register("CPU")`` (the fixture) makes these launchers the radial operators' CPU kernels:
    a force-training pattern through the C++ autograd (forward, gradients with create_graph, the
    gradient of a loss on them) gives what the C++ kernels give."""
    (x, y, h, wr, *rest), _ = case(12, N=5, E=12)

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in (x, y, h, wr)]
        out = torch.ops.cfm.conv_tp_radial_fwd(*leaves, *rest)
        grads = torch.autograd.grad((out**2).sum(), leaves, create_graph=True)
        second = torch.autograd.grad(sum((t**2).sum() for t in grads[1:]), leaves)
        return (out.detach(), *(t.detach() for t in grads), *second)

    got = run()
    ttr._KERNELS._hits.clear()
    got = run()
    assert {fn.fn.__name__ for _, fn in ttr._KERNELS._hits.values()} >= {
        "tp_radial_segment",
        "tp_radial_segment_t",
        "tp_radial_edge_hy",
        "tp_radial_wr",
    }
    with triton_cpu():
        ref = run()
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-10


def test_kernels_are_named_and_atomic_free():
    """Each variant has its own name in a GPU profile; no kernel uses atomics (the wr gradient's
    partial sums are summed in a fixed order)."""
    (_, _, _, _, _, desc, _, meta), _ = case(12, E=4)
    t = ttp.TPTables.from_operator(desc, meta)
    names = {}
    for kernel, transposed, flags in ttr.kernel_variants():
        src = ttr.source(t, kernel, transposed=transposed, **flags)
        body = src.split("\ndef tp_", 1)[1]
        assert "atomic" not in src and "_dot(" in body  # tl.dot where the tile allows
        names[ttr.compiled_name(kernel, transposed, flags)] = body.split("(", 1)[0]
    assert names == {
        "tp_radial_segment": "radial_segment",
        "tp_radial_segment[T]": "radial_segment_t",
        "tp_radial_edge[h,y]": "radial_edge_hy",
        "tp_radial_edge[h]": "radial_edge_h",
        "tp_radial_edge[y]": "radial_edge_y",
        "tp_radial_wr": "radial_wr",
    }
