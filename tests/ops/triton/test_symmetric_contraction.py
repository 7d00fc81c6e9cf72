"""The Triton symmetric contraction (``cfm_plugins.ops.triton.symmetric_contraction``) in the
interpreter on CPU, registered as the ``cfm::symmetric_contraction_*`` operators' CPU kernels:
against mace-torch's own module (forward, backward, double backward, float64 and float32), against
the C++ kernels (every double-backward flag combination), gradcheck/gradgradcheck, opcheck,
non-contiguous and expanded inputs, tiles smaller than the problem, the weight gradient's partial
slots, and the generated source and its cache.

Most cases use node features 0e+1o (4 components per channel: 30 monomials at correlation 3), the
MACE size (0e+1o+2e+3o, 16 components) appears where it is cheap enough for the interpreter
(~1 ms per tile operation per program: 494 monomials at correlation 3).
"""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3
from mace.modules.symmetric_contraction import SymmetricContraction

from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton import symmetric_contraction as tsc
from cfm_plugins.ops.triton.configs import TileConfig, override
from tests.helpers.mace_models import mace_module

pytestmark = pytest.mark.usefixtures("triton_cpu")


def small_sc(
    channels: int,
    corr: int,
    elements: int,
    hidden: str = "0e+1o",
    dtype=torch.float64,
    seed: int = 0,
):
    """mace's SymmetricContraction on node features channels x (0e+1o), weights randomized."""
    torch.manual_seed(seed)
    irreps_in = o3.Irreps(f"{channels}x0e+{channels}x1o")
    irreps_out = o3.Irreps("+".join(f"{channels}x{ir}" for ir in hidden.split("+")))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        sc = SymmetricContraction(irreps_in, irreps_out, corr, num_elements=elements)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in sc.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p))
    return sc.to(dtype)


def inputs(n, channels, ell, elements, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, ell, generator=g, dtype=dtype)
    idx = torch.randint(0, elements, (n,), generator=g)
    return x, idx, torch.nn.functional.one_hot(idx, elements).to(dtype)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def op_args(fused, x, idx):
    """The operator arguments the module builds for x and element indices idx."""
    present, inv, counts = torch._unique2(idx, sorted=True, return_inverse=True, return_counts=True)
    coeff = fused._fold(present, x.dtype).detach()
    order, chunk_ptr = fused._chunks(inv, counts, x.shape[0])
    return coeff, (inv, order, chunk_ptr, fused._desc_tensors(), fused._meta)


#: float32 tolerance: the kernels use no tl.dot, so TF32 never enters on a GPU; the bound is
#: float32 round-off of sums of up to a few hundred terms
F32_TOL = 2e-5


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float64, 1e-10), (torch.float32, F32_TOL)], ids=["f64", "f32"]
)
@pytest.mark.parametrize("corr,elements,hidden", [(1, 2, "0e"), (2, 3, "0e+1o"), (3, 2, "0e+1o")])
def test_forward_and_derivatives_match_mace(corr, elements, hidden, dtype, tol):
    """Output, d/dx, d/dW and the force-training second derivative through the cfm:: operators
    (C++ autograd calling the Triton fwd, bwd and bwd2 kernels) against mace's module."""
    sc = small_sc(6, corr, elements, hidden, dtype)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(21, 6, 4, elements, dtype)
    params = [p for p in sc.parameters() if p.requires_grad]
    results = []
    for mod, arg in ((sc, y), (fused, idx)):
        xx = x.clone().requires_grad_(True)
        out = mod(xx, arg)
        gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=dtype)
        grads = torch.autograd.grad(out, [xx] + params, gout, create_graph=True)
        v = torch.randn(xx.shape, generator=torch.Generator().manual_seed(9), dtype=dtype)
        second = torch.autograd.grad(
            (grads[0] * v).sum() + (grads[0] ** 2).sum(), [xx] + params, allow_unused=True
        )
        results.append((out.detach(), [g.detach() for g in grads], second))
    (o_ref, g_ref, s_ref), (o_tri, g_tri, s_tri) = results
    assert rel_err(o_tri, o_ref) < tol
    for a, b in zip(g_tri, g_ref):
        assert rel_err(a, b) < tol
    for a, b in zip(s_tri, s_ref):
        if b is None:  # correlation 1: d out/dx does not depend on x
            assert a is None or a.abs().max() < 1e-12
        else:
            assert b.abs().max() > 0 and rel_err(a, b) < tol


def test_mace_size_forward_and_forces_match_mace():
    """The MACE node features (0e+1o+2e+3o: 16 components, 494 monomials) at correlation 3, one
    element present (one program per pass in the interpreter): forward and d/dx in float64 (the
    weight gradients and the double backward are checked on 0e+1o features above: the same
    generator, a fraction of the interpreter's time). The module is one the C++ kernel tests use
    (mace builds its U matrices once per session)."""
    sc = mace_module("0e+1o", 8, 3, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, _, y = inputs(3, 8, 16, 3, torch.float64)
    idx = torch.full((3,), 2)
    y = torch.nn.functional.one_hot(idx, 3).to(x.dtype)
    res = []
    for mod, arg in ((sc, y), (fused, idx)):
        xx = x.clone().requires_grad_(True)
        out = mod(xx, arg)
        res.append([out.detach()] + list(torch.autograd.grad(out.pow(2).sum(), [xx])))
    for a, b in zip(*res[::-1]):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-10


@pytest.mark.parametrize("has_dx,has_dc", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize(
    "need",
    [(True, True, True), (True, False, False), (False, True, False), (False, False, True)],
    ids=["all", "ggout", "gx", "gcoeff"],
)
def test_every_bwd2_variant_matches_the_cpp_kernel(triton_cpu, has_dx, has_dc, need):
    sc = small_sc(5, 3, 2)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, _ = inputs(13, 5, 4, 2, torch.float64)
    coeff, static = op_args(fused, x, idx)
    g = torch.Generator().manual_seed(3)
    gout = torch.randn(x.shape[0], fused.descriptor.out_dim, generator=g, dtype=x.dtype)
    dx = torch.randn(x.shape, generator=g, dtype=x.dtype) if has_dx else None
    dc = torch.randn(coeff.shape, generator=g, dtype=x.dtype) if has_dc else None
    op = torch.ops.cfm.symmetric_contraction_bwd2
    got = op(gout, x, coeff, dx, dc, *static, *need)
    with triton_cpu():
        ref = op(gout, x, coeff, dx, dc, *static, *need)
    for a, b, wanted in zip(got, ref, need):
        assert a.shape == b.shape
        if wanted and b.abs().max() > 0:
            assert rel_err(a, b) < 1e-12
        else:
            assert a.abs().max() == 0 if a.numel() else True


def _small_narrow():
    sc = small_sc(2, 3, 1)
    return FusedSymmetricContraction.from_mace(sc)


def test_gradcheck_and_gradgradcheck():
    fused = _small_narrow()
    names = [n for n, p in fused.named_parameters() if p.requires_grad]
    x = torch.randn(3, 2, 4, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 0, 0])
    ws = [dict(fused.named_parameters())[n].detach().clone().requires_grad_(True) for n in names]

    def f(x, *w):
        return torch.func.functional_call(fused, dict(zip(names, w)), (x, idx))

    # fast mode: random directions instead of every input entry (the interpreter costs ~1 ms per
    # tile operation; the entry-by-entry check of every pass took minutes)
    assert torch.autograd.gradcheck(f, (x, *ws), atol=1e-8, fast_mode=True)
    assert torch.autograd.gradgradcheck(f, (x, *ws), atol=1e-7, fast_mode=True)


def test_opcheck_operators():
    """torch.library.opcheck with the Triton kernels: schema, Meta kernels against what the
    kernels return (including the empty tensors of outputs not requested), autograd, AOT
    dispatch."""
    fused = FusedSymmetricContraction.from_mace(small_sc(3, 2, 2))
    x, idx, _ = inputs(7, 3, 4, 2, torch.float64)
    coeff, static = op_args(fused, x, idx)
    coeff.requires_grad_()
    x = x.requires_grad_()
    torch.library.opcheck(torch.ops.cfm.symmetric_contraction_fwd.default, (x, coeff, *static))
    gout = torch.randn(
        x.shape[0], fused.descriptor.out_dim, dtype=torch.float64, requires_grad=True
    )
    torch.library.opcheck(
        torch.ops.cfm.symmetric_contraction_bwd.default, (gout, x, coeff, *static, True, False)
    )
    torch.library.opcheck(
        torch.ops.cfm.symmetric_contraction_bwd2.default,
        (
            gout.detach(),
            x.detach(),
            coeff.detach(),
            torch.randn_like(x),
            None,
            *static,
            True,
            True,
            False,
        ),
    )


def test_noncontiguous_and_expanded_inputs():
    """Strides are passed to the kernels: a transposed x, an expanded (stride 0) coeff and a
    sliced gout give what their contiguous copies give."""
    fused = FusedSymmetricContraction.from_mace(small_sc(4, 3, 1))
    x, idx, _ = inputs(9, 4, 4, 1, torch.float64)
    coeff, static = op_args(fused, x, idx)
    x_t = x.transpose(0, 2).contiguous().transpose(0, 2)  # same values, node stride 1
    coeff_e = coeff[:1, :, :1].expand(1, coeff.shape[1], coeff.shape[2])  # stride 0 over channels
    gout_big = torch.randn(x.shape[0], 2 * fused.descriptor.out_dim, dtype=x.dtype)
    gout_s = gout_big[:, ::2]
    assert not x_t.is_contiguous() and coeff_e.stride(2) == 0 and not gout_s.is_contiguous()
    ref = (
        tsc.fwd(x, coeff_e.contiguous(), *static),
        tsc.bwd(gout_s.contiguous(), x, coeff_e.contiguous(), *static, True, True),
    )
    got = (tsc.fwd(x_t, coeff_e, *static), tsc.bwd(gout_s, x_t, coeff_e, *static, True, True))
    assert torch.equal(got[0], ref[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))
    dx = torch.randn_like(x).transpose(0, 2).contiguous().transpose(0, 2)
    ref2 = tsc.bwd2(
        gout_s.contiguous(),
        x,
        coeff_e.contiguous(),
        dx.contiguous(),
        coeff_e.contiguous(),
        *static,
        True,
        True,
        True,
    )
    got2 = tsc.bwd2(gout_s, x_t, coeff_e, dx, coeff_e, *static, True, True, True)
    assert all(torch.equal(a, b) for a, b in zip(got2, ref2))


def test_tiles_smaller_than_the_problem(triton_cpu, monkeypatch):
    """7 channels in tiles of 4, chunks of 20 nodes in tiles of 4 with 2 tiles per chunk (a
    CHUNK of 8 here), so each program strides over several tiles and adds its weight-gradient
    slot; the results equal the C++ kernels'."""
    monkeypatch.setattr(tsc, "CHUNK", 8)
    fused = FusedSymmetricContraction.from_mace(small_sc(7, 3, 2))
    fused._chunk = 20
    x, idx, _ = inputs(37, 7, 4, 2, torch.float64)
    coeff, static = op_args(fused, x, idx)
    gout = torch.randn(x.shape[0], fused.descriptor.out_dim, dtype=x.dtype)
    dx = torch.randn_like(x)
    small = TileConfig(4, 4)

    def passes():
        return (
            torch.ops.cfm.symmetric_contraction_fwd(x, coeff, *static),
            *torch.ops.cfm.symmetric_contraction_bwd(gout, x, coeff, *static, True, True),
            *torch.ops.cfm.symmetric_contraction_bwd2(
                gout, x, coeff, dx, None, *static, True, True, True
            ),
        )

    with override(sc_fwd=small, sc_bwd=small, sc_bwd2=small):
        got = passes()
    with triton_cpu():
        ref = passes()
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-12


def test_the_empty_chunks_of_a_traced_forward_change_nothing(triton_cpu):
    """The traced forward's chunk list (``_static_chunks``: the real chunks, then empty ones at n)
    gives the exact chunk list's results bit for bit, forward and both backwards, and the C++
    kernels' too."""
    fused = FusedSymmetricContraction.from_mace(small_sc(5, 3, 4))
    fused._chunk = 4
    x, idx, _ = inputs(19, 5, 4, 4, torch.float64)
    idx = torch.where(idx == 2, 3, idx)  # element 2 absent: no chunk of its own, a zero gradient
    coeff, exact = op_args(fused, x, idx)
    counts = torch.zeros(4, dtype=torch.int64).index_add(0, idx, torch.ones_like(idx))
    present = torch.arange(4)
    coeff_all = fused._fold(present, x.dtype).detach()
    padded = (idx, *fused._static_chunks(idx, counts, 19), *exact[3:])
    assert padded[2].numel() > exact[2].numel() and padded[2][-2] == 19
    g = torch.Generator().manual_seed(4)
    gout = torch.randn(19, fused.descriptor.out_dim, generator=g, dtype=x.dtype)
    dx = torch.randn(x.shape, generator=g, dtype=x.dtype)

    def passes(c, static):
        return (
            torch.ops.cfm.symmetric_contraction_fwd(x, c, *static),
            *torch.ops.cfm.symmetric_contraction_bwd(gout, x, c, *static, True, True),
            *torch.ops.cfm.symmetric_contraction_bwd2(
                gout, x, c, dx, torch.ones_like(c), *static, True, True, True
            ),
        )

    got, ref = passes(coeff_all, padded), passes(coeff, exact)
    with triton_cpu():
        cpp = passes(coeff_all, padded)
    keep = present[
        torch.bincount(idx, minlength=4) > 0
    ]  # the weight gradients of the present elements
    for a, b, c in zip(got, ref, cpp):
        if (
            a.shape != b.shape
        ):  # coefficient gradients: every element against the present ones (others zero)
            assert a[keep].shape == b.shape and a[~torch.isin(present, keep)].abs().max() == 0
            a, c = a[keep], c[keep]
        assert b.abs().max() > 0
        assert torch.equal(a, b)
        assert rel_err(c, b) < 1e-12


def test_the_weight_gradient_slots_follow_the_tiles_with_nodes():
    """The partial buffer has a slot per program with nodes, consecutive per chunk: an empty chunk
    (a traced step ends its chunk list with them) takes none, and the buffer's size depends on the
    shapes only: ceil(n / block_n) + chunks at most, where one slot per chunk tile took chunks *
    split."""
    coeff = torch.zeros(3, 2, 16, dtype=torch.float64)
    exact = torch.tensor([0, 3, 5, 6, 9, 12, 15, 16])
    padded = torch.cat([exact, torch.full((5,), 16)])
    a = tsc._WeightGrad(coeff, exact, 16, split=4, block_n=2)
    b = tsc._WeightGrad(coeff, padded, 16, split=4, block_n=2)
    assert a.slots.tolist() == [0, 2, 3, 4, 6, 8, 10]  # tiles with nodes: 2, 1, 1, 2, 2, 2, 1
    assert b.slots.tolist() == a.slots.tolist() + [11] * 5  # the empty chunks write nothing
    assert a.target.shape[0] == min(7 * 4, 8 + 7) and b.target.shape[0] == min(12 * 4, 8 + 12) >= 11


def test_empty_input_and_bad_input():
    fused = FusedSymmetricContraction.from_mace(small_sc(3, 2, 2))
    x, idx, _ = inputs(4, 3, 4, 2, torch.float64)
    coeff, (inv, order, chunk_ptr, desc, meta) = op_args(fused, x, idx)
    empty = x[:0]
    e64 = torch.zeros(0, dtype=torch.int64)
    out = tsc.fwd(empty, coeff, e64, e64, torch.zeros(1, dtype=torch.int64), desc, meta)
    assert out.shape == (0, fused.descriptor.out_dim)
    with pytest.raises(RuntimeError, match=r"x must be \[N, 3, 4\]"):
        tsc.fwd(x[:, :2], coeff, inv, order, chunk_ptr, desc, meta)
    with pytest.raises(RuntimeError, match="coeff is torch.float32"):
        tsc.fwd(x, coeff.float(), inv, order, chunk_ptr, desc, meta)
    with pytest.raises(RuntimeError, match="order must be int64"):
        tsc.fwd(x, coeff, inv, order.int(), chunk_ptr, desc, meta)


def test_generated_source_and_cache(tmp_path, monkeypatch):
    """The tables read from the operator's tensors equal the descriptor's; the source is a pure
    function of them; a module is written once under its content hash and imported from there."""
    fused = FusedSymmetricContraction.from_mace(small_sc(3, 3, 2))
    from_op = tsc.SCTables.from_operator(*fused.operator_tables())
    assert from_op == tsc.SCTables.from_descriptor(fused.descriptor)
    src = tsc.source(
        from_op, "bwd2", need_gg=True, need_gx=True, need_gc=True, has_dx=True, has_dc=False
    )
    assert src == tsc.source(
        from_op, "bwd2", need_gg=True, need_gx=True, need_gc=True, has_dx=True, has_dc=False
    )
    assert "tl.atomic_add" not in src and "def sc_bwd2(" in src
    assert "tl.atomic_add" not in tsc.source(from_op, "bwd", need_gx=False, need_gc=True)
    monkeypatch.setenv("CFM_PLUGINS_TRITON_CACHE", str(tmp_path))
    mod = _codegen.load_source("sc_test", src)
    files = list(tmp_path.glob("sc_test_*.py"))
    assert len(files) == 1 and files[0].read_text() == src and hasattr(mod, "sc_bwd2")
    assert _codegen.load_source("sc_test", src) is mod
