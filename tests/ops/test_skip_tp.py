"""FusedSkipTP against e3nn's FullyConnectedTensorProduct built as mace builds its skip connection:
forward, gradients and double backward (float64 to 1e-10, float32), gradcheck and gradgradcheck of
the operators, opcheck, elements without nodes, an empty batch, the stock fallbacks (a second
input that is not a one-hot, checked once; a second input that requires a gradient; the library
missing), state_dict, dtype moves, pickling, and what the kernel table recognises."""

from __future__ import annotations

import copy
import io
import logging

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3

from cfm_plugins.ops import _backend
from cfm_plugins.ops import skip_tp as sk
from cfm_plugins.ops.skip_tp import FusedSkipTP
from tests.helpers.skip_tp_cases import (
    FORMS,
    mace_skip_tp,
    node_inputs,
    op_args,
    rel_err,
    training_pattern,
)

needs_ext = pytest.mark.skipif(
    _backend.choose(torch.device("cpu")) != "cpu" or not hasattr(torch.ops.cfm, "skip_tp_fwd"),
    reason="compiled CPU kernel not built",
)


@needs_ext
@pytest.mark.parametrize("irreps_in,irreps_out", FORMS)
@pytest.mark.parametrize("elements", [3, 89])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_training_pattern_matches_e3nn(irreps_in, irreps_out, elements, dtype, tol):
    """Output, gradients in the node features and the weights, and the double backward of a loss
    on them (force training), against e3nn's module with the same parameter."""
    tp = mace_skip_tp(irreps_in, irreps_out, elements, dtype)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 150, dtype, absent=(1,))  # > one chunk of 64 nodes for element 0
    ref = training_pattern(tp, tp.weight, x, y)
    got = training_pattern(fused, tp.weight, x, y)
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < tol


@needs_ext
def test_weight_gradient_of_an_element_without_nodes_is_zero():
    tp = mace_skip_tp("8x0e+8x1o", "8x0e+8x1o", 4)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 30, absent=(1, 3))
    (fused(x, y) ** 2).sum().backward()
    d = fused.descriptor
    for p in range(d.num_paths):
        mul_in, mul_out = d.path_io[p][1], d.path_io[p][3]
        g = tp.weight.grad[d.woff[p] : d.woff[p] + mul_in * 4 * mul_out].view(mul_in, 4, mul_out)
        assert torch.all(g[:, [1, 3]] == 0) and g[:, [0, 2]].abs().max() > 0


@needs_ext
def test_gradcheck_and_gradgradcheck_of_the_operators():
    tp = mace_skip_tp("3x0e+2x1o+2x0e", "2x0e+3x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 7, absent=())
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach().clone().requires_grad_()
    x = x.requires_grad_()

    def fwd(x, w):
        return torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta)

    assert torch.autograd.gradcheck(fwd, (x, w))
    assert torch.autograd.gradgradcheck(fwd, (x, w))
    g = torch.randn(7, meta[1], dtype=torch.float64, requires_grad=True)

    def bwd(g, x, w):
        return torch.ops.cfm.skip_tp_bwd(g, x, w, order, elem_ptr, desc, desc_t, meta, True, True)

    assert torch.autograd.gradcheck(bwd, (g, x, w))
    assert torch.autograd.gradgradcheck(bwd, (g, x, w))  # a third derivative


@needs_ext
def test_opcheck_of_the_operators():
    tp = mace_skip_tp("4x0e+2x1o", "3x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 9, absent=())
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach().clone().requires_grad_()
    x = x.requires_grad_()
    g = torch.randn(9, meta[1], dtype=torch.float64)
    torch.library.opcheck(
        torch.ops.cfm.skip_tp_fwd.default, (x, w, order, elem_ptr, desc, desc_t, meta)
    )
    for need in ((True, True), (True, False), (False, True)):
        torch.library.opcheck(
            torch.ops.cfm.skip_tp_bwd.default,
            (g, x, w, order, elem_ptr, desc, desc_t, meta, *need),
        )


@needs_ext
def test_bad_groupings_and_shapes_are_refused_by_the_operators():
    tp = mace_skip_tp("4x0e", "4x0e", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 5, absent=())
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach()
    with pytest.raises(RuntimeError, match="elem_ptr must run from 0"):
        torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr - 1, desc, desc_t, meta)
    with pytest.raises(RuntimeError, match="not a node"):
        torch.ops.cfm.skip_tp_fwd(x, w, order + 5, elem_ptr, desc, desc_t, meta)
    with pytest.raises(RuntimeError, match="x must be"):
        torch.ops.cfm.skip_tp_fwd(x[:, :3].contiguous(), w, order, elem_ptr, desc, desc_t, meta)
    with pytest.raises(RuntimeError, match="w must be"):
        torch.ops.cfm.skip_tp_fwd(x, w[:-1], order, elem_ptr, desc, desc_t, meta)


@needs_ext
def test_an_empty_batch():
    tp = mace_skip_tp("4x0e+2x1o", "4x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x = torch.zeros(0, tp.irreps_in1.dim, dtype=torch.float64, requires_grad=True)
    y = torch.zeros(0, 3, dtype=torch.float64)
    out = fused(x, y)  # e3nn's code (nothing to group)
    assert out.shape == (0, tp.irreps_out.dim)
    (out.sum() + 0 * tp.weight.sum()).backward()
    assert torch.all(tp.weight.grad == 0)
    # the operators themselves: an empty output, and every weight's gradient written (zeros)
    order, elem_ptr, desc, desc_t, meta = op_args(fused, y)
    w = tp.weight.detach()
    assert torch.ops.cfm.skip_tp_fwd(x, w, order, elem_ptr, desc, desc_t, meta).shape == out.shape
    gx, gw = torch.ops.cfm.skip_tp_bwd(
        out.detach(), x.detach(), w, order, elem_ptr, desc, desc_t, meta, True, True
    )
    assert gx.shape == x.shape and gw.shape == w.shape and torch.all(gw == 0)


@needs_ext
def test_a_second_input_that_is_not_one_hot_runs_e3nn_said_once(caplog):
    tp = mace_skip_tp("4x0e+2x1o", "4x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, _ = node_inputs(tp, 6)
    y = torch.rand(6, 3, dtype=torch.float64)  # a mixture: not a one-hot
    with caplog.at_level(logging.WARNING, logger="cfm_plugins.ops"):
        for _ in range(2):
            assert rel_err(fused(x, y), tp(x, y)) < 1e-14
    said = [r for r in caplog.records if "not a one-hot" in r.getMessage()]
    assert len(said) == 1 and fused._stock_only


@needs_ext
def test_the_one_hot_check_runs_once_per_module_or_every_call_with_the_debug_switch(
    debug_switch, monkeypatch
):
    tp = mace_skip_tp("4x0e", "4x0e", 3)
    x, y = node_inputs(tp, 6, absent=())
    checks = []
    real = sk._is_one_hot
    monkeypatch.setattr(sk, "_is_one_hot", lambda t: checks.append(1) or real(t))
    fused = FusedSkipTP.from_e3nn(tp)
    for _ in range(3):
        fused(x, y.clone())  # a new batch each time
    assert len(checks) == 1
    debug_switch("CFM_PLUGINS_CHECK_ONE_HOT", "1")
    fused(x, y.clone())
    fused(x, y.clone())
    assert len(checks) == 3
    bad = y.clone()
    bad[2] = 0.5
    assert rel_err(fused(x, bad), tp(x, bad)) < 1e-14 and fused._stock_only


@needs_ext
def test_a_second_input_that_requires_grad_runs_e3nn():
    """The gradient in the one-hot is the dense product's: e3nn's code computes it."""
    tp = mace_skip_tp("4x0e+2x1o", "3x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 6, absent=())
    grads = []
    for m in (tp, fused):
        yy = y.clone().requires_grad_()
        (m(x, yy) ** 2).sum().backward()
        grads.append(yy.grad)
    assert rel_err(grads[1], grads[0]) < 1e-14 and not fused._stock_only


def test_the_pure_torch_switch_runs_e3nn(debug_switch):
    debug_switch("CFM_PLUGINS_FORCE_TORCH", "1")
    tp = mace_skip_tp("4x0e+2x1o", "4x0e+2x1o", 3)
    fused = FusedSkipTP.from_e3nn(tp)
    x, y = node_inputs(tp, 6, absent=())
    assert torch.equal(fused(x, y), tp(x, y))


@needs_ext
def test_state_dict_dtype_moves_pickling_and_restore():
    tp = mace_skip_tp("8x0e+8x1o", "8x0e+8x1o", 5)
    keys = dict(tp.state_dict())
    fused = FusedSkipTP.from_e3nn(tp)
    assert list(fused.state_dict()) == list(keys)
    assert fused.weight is tp.weight and fused.output_mask is tp.output_mask  # shared, not copied
    x, y = node_inputs(tp, 12)
    ref = tp(x, y)
    for clone in (copy.deepcopy(fused), _pickled(fused)):
        assert isinstance(clone, FusedSkipTP) and rel_err(clone(x, y), ref) < 1e-13
    f32 = copy.deepcopy(fused).float()
    assert f32._sk_coef.dtype == torch.float64 and f32.weight.dtype == torch.float32
    assert rel_err(f32(x.float(), y.float()).double(), ref) < 1e-5
    back = f32.to_e3nn()
    assert not isinstance(back, FusedSkipTP) and back.weight is f32.weight
    assert back.output_mask.dtype == torch.float32
    # a checkpoint of another stock module loads into the fused one
    other = mace_skip_tp("8x0e+8x1o", "8x0e+8x1o", 5, seed=3)
    fused.load_state_dict(other.state_dict())
    assert rel_err(fused(x, y), other(x, y)) < 1e-13


def _pickled(m):
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_recognised_forms_and_the_self_check_at_make():
    tp = mace_skip_tp("8x0e+8x1o", "8x0e+8x1o", 5)
    parent = torch.nn.Module()
    parent.skip_tp = tp
    assert sk.is_skip_tp(tp) and sk._is_block_skip_tp(tp, parent, "skip_tp")
    assert sk._is_block_skip_tp(tp, parent, "skip_tp_full")
    assert not sk._is_block_skip_tp(tp, parent, "linear")  # only where MACE holds it
    assert not sk.is_skip_tp(o3.FullyConnectedTensorProduct("4x0e", "2x1o", "4x1o"))
    fused = sk._make(tp, parent, "skip_tp")
    assert not sk.is_skip_tp(fused) and not fused.gpu_kernels
    # a module whose coefficients are not what its own code computes is refused at make
    wrong = copy.deepcopy(tp)
    ins = wrong.instructions[0]
    wrong.instructions[0] = ins._replace(path_weight=2 * ins.path_weight)
    with pytest.raises(ValueError, match="differs from the per-element map"):
        sk._make(wrong, parent, "skip_tp")


def test_a_compiled_module_is_compiled_once_per_shape_whatever_was_asked_first():
    """The module's first questions (is the library's operator declared, the debug switches) are
    cached process-wide at their first answer. Asked first inside a compiled graph, the cache's
    change invalidated the graph: a 2-rank compiled MACE run compiled 4 graphs for 3 shapes."""
    from torch._dynamo.testing import CompileCounter

    from cfm_plugins.ops import _debug

    sk._DECLARED.clear()
    _debug.reread()
    tp = mace_skip_tp("8x0e+8x1o", "8x0e+8x1o", 5)
    module = FusedSkipTP.from_e3nn(tp)
    counter = CompileCounter()
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    x, y = node_inputs(tp, 10)
    for _ in range(3):
        out = compiled(x, y)
        module(x, y)  # an eager call between (its one-hot check)
    assert counter.frame_count == 1
    assert torch.allclose(out, tp(x, y), rtol=1e-10, atol=1e-12)
