"""FusedSymmetricContraction against mace-torch's own SymmetricContraction (values and derivatives).

Real mace modules built with mace's constructors; weights randomized with torch.randn (mace leaves
some at structured values). The compiled CPU kernel and the pure-torch fallback are both checked.
"""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn: sets TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)
import pytest
import torch

from cfm_plugins.ops import _backend
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from tests.helpers.mace_models import mace_module

HAVE_EXT = _backend.choose(torch.device("cpu")) == "cpu"
needs_ext = pytest.mark.skipif(
    not HAVE_EXT, reason="CPU extension not built (python setup.py build_ext --inplace)"
)


def inputs(n, mul, elements, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, mul, 16, generator=g, dtype=dtype)
    idx = torch.randint(0, elements, (n,), generator=g)
    y = torch.nn.functional.one_hot(idx, elements).to(dtype)
    return x, idx, y


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def force_loss(module, x, y):
    """|d(sum out^2)/dx|^2: its gradient in the weights is force training's double backward."""
    x = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(module(x, y).pow(2).sum(), x, create_graph=True)
    return gx.pow(2).sum()


# (hidden, mul, correlation, elements, reduced): every hidden/correlation/cg pair with 8 channels,
# element counts rotated; a few with 128 channels and 89 elements.
CASES = [
    (h, 8, c, [1, 3, 89][(i + c) % 3], r)
    for i, h in enumerate(["0e", "0e+1o", "0e+1o+2e"])
    for c in (1, 2, 3)
    for r in (False, True)
] + [("0e+1o", 128, 3, 89, False), ("0e+1o+2e", 128, 2, 3, True), ("0e", 128, 3, 1, True)]


def _ids(case):
    h, m, c, e, r = case
    return f"{h}-{m}ch-corr{c}-{e}el-{'reduced' if r else 'full'}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_forward_matches_mace(case, use_kernel):
    if use_kernel and not HAVE_EXT:
        pytest.skip("CPU extension not built")
    hidden, mul, corr, elements, reduced = case
    n = 40 if mul > 8 else 70
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        sc = mace_module(hidden, mul, corr, elements, reduced, dtype)
        fused = FusedSymmetricContraction.from_mace(sc, use_kernel=use_kernel)
        x, idx, y = inputs(n, mul, elements, dtype)
        ref = sc(x, y)
        out = fused(x, y)
        assert out.shape == ref.shape and out.dtype == dtype
        assert rel_err(out, ref) < tol, (dtype, rel_err(out, ref))
        assert torch.equal(fused(x, idx), out)  # integer element indices give the same result


@pytest.mark.parametrize("case", [CASES[5], CASES[11], CASES[16], CASES[-3]], ids=_ids)
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_derivatives_match_mace(case, use_kernel):
    """d out/d x, d out/d W, and the force-training second derivative (grad of a loss on d E/d
    x)."""
    if use_kernel and not HAVE_EXT:
        pytest.skip("CPU extension not built")
    hidden, mul, corr, elements, reduced = case
    sc = mace_module(hidden, mul, corr, elements, reduced)
    fused = FusedSymmetricContraction.from_mace(sc, use_kernel=use_kernel)
    x, _, y = inputs(30, mul, elements, torch.float64, seed=3)
    params = [p for p in sc.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(5)
    results = []
    for mod in (sc, fused):
        xx = x.clone().requires_grad_(True)
        out = mod(xx, y)
        gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
        grads = torch.autograd.grad(out, [xx] + params, gout, create_graph=True)
        v = torch.randn(xx.shape, generator=g.manual_seed(9), dtype=xx.dtype)
        second = torch.autograd.grad(
            (grads[0] * v).sum() + (grads[0] ** 2).sum(), [xx] + params, allow_unused=True
        )
        results.append((grads, second))
    (g_ref, s_ref), (g_fus, s_fus) = results
    for a, b in zip(g_fus, g_ref):
        assert rel_err(a, b) < 1e-10
    for a, b in zip(s_fus, s_ref):
        if b is None:  # mace: unused (correlation 1: d out/dx does not depend on x)
            assert a is None or a.abs().max() < 1e-12
        else:
            assert rel_err(a, b) < 1e-10


def _small():
    sc = mace_module("0e+1o", 8, 3, 1, True)
    # narrow to 2 channels: gradcheck cost grows with every input entry
    with torch.no_grad():
        for c in sc.contractions:
            c.weights_max = torch.nn.Parameter(c.weights_max[:, :, :2].clone())
            for k in range(len(c.weights)):
                c.weights[k] = torch.nn.Parameter(c.weights[k][:, :, :2].clone())
            c.num_features = 2
    return sc


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_gradcheck_and_gradgradcheck(use_kernel):
    if use_kernel and not HAVE_EXT:
        pytest.skip("CPU extension not built")
    sc = _small()
    fused = FusedSymmetricContraction.from_mace(sc, use_kernel=use_kernel)
    names = [n for n, p in fused.named_parameters() if p.requires_grad]
    x = torch.randn(3, 2, 16, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 0, 0])
    ws = [dict(fused.named_parameters())[n].detach().clone().requires_grad_(True) for n in names]

    def f(x, *w):
        return torch.func.functional_call(fused, dict(zip(names, w)), (x, idx))

    assert torch.autograd.gradcheck(f, (x, *ws), atol=1e-8)
    if use_kernel:  # the fallback's second derivatives are torch autograd's own (and slow to check)
        assert torch.autograd.gradgradcheck(f, (x, *ws), atol=1e-7)


@needs_ext
def test_fallback_forced_by_environment(debug_switch):
    sc = mace_module("0e+1o", 8, 3, 3, True)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(20, 8, 3, torch.float64)
    with_kernel = fused(x, y)
    debug_switch("CFM_PLUGINS_FORCE_TORCH", "1")
    assert _backend.choose(torch.device("cpu")) == "torch"
    forced = fused(x, y)
    assert rel_err(forced, with_kernel) < 1e-12
    assert rel_err(forced, sc(x, y)) < 1e-10


def test_state_dict_shared_and_interchangeable():
    sc = mace_module("0e+1o", 8, 2, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    assert list(fused.state_dict()) == list(sc.state_dict())
    assert all(a is b for a, b in zip(fused.parameters(), sc.parameters()))
    other = mace_module("0e+1o", 8, 2, 3, False)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(2.0)
    fused.load_state_dict(other.state_dict())  # loads into the shared parameters
    x, _, y = inputs(10, 8, 3, torch.float64)
    assert rel_err(fused(x, y), other(x, y)) < 1e-10
    assert fused.to_mace() is sc


def test_bad_inputs_raise_clear_errors():
    sc = mace_module("0e+1o", 8, 2, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(6, 8, 3, torch.float64)
    with pytest.raises(ValueError, match=r"\[nodes, 8, 16\]"):
        fused(x[:, :4], y)
    with pytest.raises(ValueError, match=r"\[nodes, 8, 16\]"):
        fused(x[0], y)
    with pytest.raises(ValueError, match="float64"):
        fused(x.float(), y)
    with pytest.raises(ValueError, match=r"\[6, 3\]"):
        fused(x, torch.nn.functional.one_hot(idx, 4).double())
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        fused(x, torch.tensor([0, 1, 2, 3, 0, 1]))
    with pytest.raises(ValueError, match=r"\[6\]"):
        fused(x, idx[:4])
    with pytest.raises(ValueError, match="one-hot"):
        fused(x, 0.5 * y)


@pytest.mark.parametrize("chunk", [3, 4, 128])
def test_static_chunks_are_the_chunks_then_empty_ones(chunk):
    """The traced forward's chunks: the eager chunking's, then empty chunks at n, as many as
    n // chunk + elements in all, whatever the values (absent elements, counts a multiple of the
    chunk)."""
    fused = FusedSymmetricContraction.from_mace(mace_module("0e+1o", 4, 2, 7, False))
    fused._chunk = chunk
    g = torch.Generator().manual_seed(5)
    for idx in (
        torch.tensor([5, 5, 1, 5, 1, 1, 1, 5, 5, 5, 3, 5, 5, 1, 5, 5]),
        torch.full((12,), 6),
        torch.randint(0, 7, (40,), generator=g),
        torch.arange(7),
    ):
        n = idx.shape[0]
        _, inv, counts = torch._unique2(idx, sorted=True, return_inverse=True, return_counts=True)
        order, chunk_ptr = fused._chunks(inv, counts, n)
        all_counts = torch.zeros(7, dtype=torch.int64).index_add(0, idx, torch.ones_like(idx))
        s_order, s_ptr = fused._static_chunks(idx, all_counts, n)
        real = chunk_ptr.numel() - 1
        assert s_ptr.numel() == n // chunk + 7 + 1 >= chunk_ptr.numel()
        assert torch.equal(s_ptr[: real + 1], chunk_ptr) and bool((s_ptr[real:] == n).all()), (
            s_ptr,
            chunk_ptr,
        )
        assert torch.equal(s_order, order)  # inv ranks idx: the same stable sort


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpp_kernels_skip_the_empty_chunks_of_a_traced_forward(dtype):
    """The operators with the static chunk list (empty chunks at the end) give what they give
    with the eager one: forward, backward, double backward."""
    fused = FusedSymmetricContraction.from_mace(mace_module("0e+1o", 8, 3, 5, False).to(dtype))
    fused._chunk = 4
    x, idx, _ = inputs(23, 8, 5, dtype)
    present, inv, counts = torch._unique2(idx, sorted=True, return_inverse=True, return_counts=True)
    coeff = fused._fold(present, dtype).detach()
    exact = (inv, *fused._chunks(inv, counts, 23))
    padded = (inv, *fused._static_chunks(inv, counts, 23))
    assert padded[2].numel() > exact[2].numel() and padded[2][-2] == 23  # empty chunks there
    g = torch.Generator().manual_seed(2)
    gout = torch.randn(23, fused.descriptor.out_dim, generator=g, dtype=dtype)
    dx, dc = (
        torch.randn(x.shape, generator=g, dtype=dtype),
        torch.randn(coeff.shape, generator=g, dtype=dtype),
    )
    ops, meta = torch.ops.cfm, (fused._desc_tensors(), fused._meta)

    def passes(groups):
        return (
            ops.symmetric_contraction_fwd(x, coeff, *groups, *meta),
            *ops.symmetric_contraction_bwd(gout, x, coeff, *groups, *meta, True, True),
            *ops.symmetric_contraction_bwd2(
                gout, x, coeff, dx, dc, *groups, *meta, True, True, True
            ),
        )

    tol = (
        1e-12 if dtype == torch.float64 else 1e-5
    )  # element gradients of several chunks add atomically
    for a, b in zip(passes(padded), passes(exact)):
        assert b.abs().max() > 0 and rel_err(a, b) < tol


@needs_ext
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_outputs_left_unfilled_are_stored_whole(dtype, tol, nan_uninitialised):
    """The forward's output and the node gradients of both backward operators are allocated
    uninitialised (every element stored by the kernels); the element-coefficient gradients are
    sums into zeros (the chunks of one element add into its rows). With every uninitialised
    element NaN,
    on the padded chunk list too (empty chunks the kernels skip), no NaN comes out and the values
    are those of the exact chunks."""
    fused = FusedSymmetricContraction.from_mace(mace_module("0e+1o", 8, 3, 5, False).to(dtype))
    fused._chunk = 4
    x, idx, _ = inputs(23, 8, 5, dtype, seed=4)
    idx[idx == 2] = 3  # an element of the table without nodes: not among the present ones
    present, inv, counts = torch._unique2(idx, sorted=True, return_inverse=True, return_counts=True)
    coeff = fused._fold(present, dtype).detach()
    g = torch.Generator().manual_seed(3)
    gout = torch.randn(23, fused.descriptor.out_dim, generator=g, dtype=dtype)
    dx = torch.randn(x.shape, generator=g, dtype=dtype)
    dc = torch.randn(coeff.shape, generator=g, dtype=dtype)
    ops, meta = torch.ops.cfm, (fused._desc_tensors(), fused._meta)

    def passes(groups):
        return (
            ops.symmetric_contraction_fwd(x, coeff, *groups, *meta),
            *ops.symmetric_contraction_bwd(gout, x, coeff, *groups, *meta, True, True),
            *ops.symmetric_contraction_bwd2(
                gout, x, coeff, dx, dc, *groups, *meta, True, True, True
            ),
        )

    exact = passes((inv, *fused._chunks(inv, counts, 23)))
    padded = passes((inv, *fused._static_chunks(inv, counts, 23)))
    for a, b in zip(padded, exact):
        assert not a.isnan().any() and not b.isnan().any()
        assert b.abs().max() > 0 and rel_err(a, b) < tol


@needs_ext
def test_torch_compile_small():
    sc = mace_module("0e+1o", 8, 3, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(12, 8, 3, torch.float64)
    xx = x.clone().requires_grad_(True)

    def energy_and_grad(x, idx):
        out = fused(x, idx)
        return out.pow(2).sum()

    compiled = torch.compile(energy_and_grad, backend="aot_eager")
    e = compiled(xx, idx)
    (gx,) = torch.autograd.grad(e, xx)
    xr = x.clone().requires_grad_(True)
    er = sc(xr, y).pow(2).sum()
    (gr,) = torch.autograd.grad(er, xr)
    assert rel_err(e.detach(), er.detach()) < 1e-10 and rel_err(gx, gr) < 1e-10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", [CASES[5], CASES[16], CASES[-3]], ids=_ids)
def test_cuda_matches_mace(case):
    hidden, mul, corr, elements, reduced = case
    sc = mace_module(hidden, mul, corr, elements, reduced).cuda()
    fused = FusedSymmetricContraction.from_mace(sc)
    x, _, y = inputs(200, mul, elements, torch.float64)
    x, y = x.cuda().requires_grad_(True), y.cuda()
    params = [p for p in sc.parameters() if p.requires_grad]
    res = []
    for mod in (sc, fused):
        out = mod(x, y)
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        second = torch.autograd.grad(gx.pow(2).sum(), params)
        res.append((out, gx, second))
    (o_r, g_r, s_r), (o_f, g_f, s_f) = res
    assert rel_err(o_f, o_r) < 1e-10 and rel_err(g_f, g_r) < 1e-10
    for a, b in zip(s_f, s_r):
        assert rel_err(a, b) < 1e-9
    xf = x.detach().float()
    sc32 = mace_module(hidden, mul, corr, elements, reduced, torch.float32).cuda()
    assert (
        rel_err(FusedSymmetricContraction.from_mace(sc32)(xf, y.float()), sc32(xf, y.float()))
        < 1e-5
    )


@needs_ext
def test_opcheck_operators():
    """torch.library.opcheck of cfm::symmetric_contraction_{fwd,bwd,bwd2}: schema, fake (Meta)
    kernels, autograd registration, torch.compile's dispatch (AOT) with dynamic shapes."""
    sc = mace_module("0e+1o", 8, 3, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, _ = inputs(10, 8, 3, torch.float64)
    present, inv, counts = torch._unique2(idx, sorted=True, return_inverse=True, return_counts=True)
    coeff = fused._fold(present, x.dtype).detach().requires_grad_()
    order, chunk_ptr = fused._chunks(inv, counts, x.shape[0])
    static = (inv, order, chunk_ptr, fused._desc_tensors(), fused._meta)
    x = x.detach().contiguous().requires_grad_()
    torch.library.opcheck(torch.ops.cfm.symmetric_contraction_fwd.default, (x, coeff, *static))
    gout = torch.randn(
        x.shape[0], fused.descriptor.out_dim, dtype=torch.float64, requires_grad=True
    )
    torch.library.opcheck(
        torch.ops.cfm.symmetric_contraction_bwd.default, (gout, x, coeff, *static, True, True)
    )
    dx, dc = torch.randn_like(x), torch.randn_like(coeff)
    torch.library.opcheck(
        torch.ops.cfm.symmetric_contraction_bwd2.default,
        (gout.detach(), x.detach(), coeff.detach(), dx, dc, *static, True, True, True),
    )


@needs_ext
def test_torch_compile_double_backward():
    """Force training under torch.compile: d/dW of |dE/dx|^2 through a compiled forward. Dynamo
    traces the module in one graph (fullgraph); aot_autograd itself does not support double
    backward (a torch limitation), so the graph runs with the "eager" backend here."""
    sc = mace_module("0e+1o", 8, 3, 3, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(12, 8, 3, torch.float64)
    params = [p for p in sc.parameters() if p.requires_grad]

    compiled = torch.compile(fused, backend="eager", fullgraph=True)
    got = torch.autograd.grad(force_loss(compiled, x, idx), params)
    ref = torch.autograd.grad(force_loss(sc, x, y), params)
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(got, ref))


def test_torch_fallback_compiles_in_one_graph(debug_switch):
    """The pure-torch evaluation (no compiled library, or CFM_PLUGINS_FORCE_TORCH=1) under
    torch.compile(fullgraph=True): no shape or branch depends on the data (one element absent
    from the batch), and forward and force-training gradients match mace's module."""
    debug_switch("CFM_PLUGINS_FORCE_TORCH", "1")
    sc = mace_module("0e+1o", 8, 3, 4, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    x, idx, y = inputs(15, 8, 3, torch.float64)  # elements 0..2 of 4: element 3 has no node
    y = torch.nn.functional.one_hot(idx, 4).to(torch.float64)
    params = [p for p in sc.parameters() if p.requires_grad]

    compiled = torch.compile(fused, backend="eager", fullgraph=True)
    assert rel_err(compiled(x, y), sc(x, y)) < 1e-12
    got = torch.autograd.grad(force_loss(compiled, x, y), params)
    ref = torch.autograd.grad(force_loss(sc, x, y), params)
    assert all(rel_err(a, b) < 1e-10 for a, b in zip(got, ref))
