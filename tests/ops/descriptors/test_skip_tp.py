"""The skip-connection descriptor (ops/descriptors/skip_tp.py): e3nn's FullyConnectedTensorProduct
with an ``Ex0e`` second input as a per-element linear map (its tables, evaluated with torch, give
e3nn's output and node-feature gradient), and what it refuses."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3

from cfm_plugins.ops.descriptors import skip_tp as desc_mod
from tests.helpers.skip_tp_cases import FORMS, mace_skip_tp, node_inputs, rel_err


def evaluate(d: desc_mod.SkipTPDescriptor, w, src, idx):
    """The tables of one orientation on ``src`` rows with elements ``idx`` (torch, float64)."""
    n = src.shape[0]
    ints, coef = d.packed()
    out = src.new_full((n, d.dim_dst), float("nan"))
    for (off, mul, dim), p0, p1 in zip(d.blocks, d.path_ptr[:-1], d.path_ptr[1:]):
        acc = src.new_zeros(n, mul, dim)
        for j in range(p0, p1):
            src_off, K, woff, ks, ns, es = d.paths[j]
            k, c = torch.arange(K), torch.arange(mul)
            W = w[woff + k[None, :, None] * ks + idx[:, None, None] * es + c[None, None, :] * ns]
            acc += coef[j] * torch.einsum(
                "nkd,nkc->ncd", src[:, src_off : src_off + K * dim].view(n, K, dim), W
            )
        out[:, off : off + mul * dim] = acc.reshape(n, -1)
    return out


@pytest.mark.parametrize("irreps_in,irreps_out", FORMS)
def test_tables_give_e3nns_output_and_node_feature_gradient(irreps_in, irreps_out):
    tp = mace_skip_tp(irreps_in, irreps_out, 5)
    d = desc_mod.from_e3nn(tp)
    assert desc_mod.why_not(tp) == "" and not d.transposed
    assert d.meta() == [
        tp.irreps_in1.dim,
        tp.irreps_out.dim,
        5,
        tp.weight_numel,
        d.num_paths,
        len(tp.irreps_out),
        len(tp.irreps_in1),
    ]
    x, y = node_inputs(tp, 17, absent=(2,))
    idx = y.argmax(-1)
    w = tp.weight.detach()
    out = evaluate(d, w, x, idx)
    assert rel_err(out, tp(x, y).detach()) < 1e-13  # every column written (no NaN left)
    g = torch.randn_like(out)
    xg = x.clone().requires_grad_()
    (tp(xg, y) * g).sum().backward()
    t = d.transpose()
    assert t.transposed and (t.dim_src, t.dim_dst) == (d.dim_dst, d.dim_src)
    assert t.transpose().paths == d.paths and t.meta() == d.meta()
    assert rel_err(evaluate(t, w, g, idx), xg.grad) < 1e-13


def test_coefficient_is_the_path_weight_over_the_3j_norm():
    """128x0e+128x1o with 89 elements (MACE-MP): 1/sqrt(128 * 89) for both paths, the weights of
    path 1 after those of path 0."""
    tp = o3.FullyConnectedTensorProduct("128x0e+128x1o", "89x0e", "128x0e+128x1o")
    d = desc_mod.from_e3nn(tp)
    assert d.num_paths == 2 and d.woff == (0, 128 * 89 * 128)
    for c in d.coef:
        assert abs(c - (128 * 89) ** -0.5) < 1e-15
    ints, coef = d.packed()
    assert ints.dtype.name == "int32" and ints.size == 4 * 2 + 1 + 6 * 2 and coef.size == 2


def test_a_block_without_paths_is_listed_so_that_kernels_write_zeros_there():
    tp = mace_skip_tp("8x0e", "8x0e+8x1o", 3)  # the first layer: nothing reaches 1o
    d = desc_mod.from_e3nn(tp)
    assert d.blocks == ((0, 8, 1), (8, 8, 3)) and d.path_ptr == [0, 1, 1]


@pytest.mark.parametrize(
    "build,why",
    [
        (lambda: o3.FullyConnectedTensorProduct("4x0e", "2x1o", "4x1o"), "one block of scalars"),
        (lambda: o3.FullyConnectedTensorProduct("4x0e", "2x0e+1x0e", "4x0e"), "one block"),
        (lambda: o3.FullyConnectedTensorProduct("4x0e", "2x0o", "4x0o"), "scalars Nx0e"),
        (
            lambda: o3.FullyConnectedTensorProduct("4x0e", "3x0e", "4x0e", shared_weights=False),
            "internal and shared",
        ),
        (
            lambda: o3.TensorProduct(
                "4x0e", "3x0e", "4x0e", [(0, 0, 0, "uvu", True)], internal_weights=True
            ),
            "'uvw'",
        ),
        (lambda: torch.nn.Linear(3, 3), "not an e3nn tensor product"),
    ],
)
def test_what_it_does_not_describe_is_refused_saying_why(build, why):
    module = build()
    assert why in desc_mod.why_not(module)
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace("'", "'")):
        desc_mod.from_e3nn(module)
