"""cfm::silu (the radial MLPs' SiLU with a lean double backward): values and every derivative
against torch's SiLU, what the force-training backward keeps, and its swap into MACE's
interaction blocks."""

from __future__ import annotations

import copy

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn.math import normalize2mom

from cfm_plugins.ops import _backend
from cfm_plugins.ops.patching import patch_model, unpatch_model
from cfm_plugins.ops.silu import LeanSiLU
from tests.helpers.mace_models import BLOCKS, mace_batch, run_mace, tiny_mace

needs_ext = pytest.mark.skipif(
    not _backend.operators_available(), reason="compiled CPU library not built"
)
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (not counted: no GPU here)"
)


def _x(dtype=torch.float64, n=(40, 9), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*n, generator=g, dtype=dtype)).requires_grad_(True)


@needs_ext
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-14), (torch.float32, 1e-6)])
def test_values_and_first_second_derivatives_match_torch_silu(dtype, tol):
    x, w = _x(dtype), _x(dtype, seed=1).detach()
    results = []
    for f in (torch.ops.cfm.silu, torch.nn.functional.silu):
        y = f(x)
        (gx,) = torch.autograd.grad((y * w).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad((gx**2).sum(), x)
        results.append((y, gx, ggx))
    assert torch.equal(results[0][0], results[1][0])  # the value is torch's own kernel
    for ours, ref in zip(results[0][1:], results[1][1:]):
        assert ref.abs().max() > 0 and ((ours - ref).abs().max() / ref.abs().max()) < tol


@needs_ext
def test_gradcheck_to_the_third_derivative():
    x, g = _x(n=(6, 5)), _x(n=(6, 5), seed=2)
    assert torch.autograd.gradcheck(torch.ops.cfm.silu, (x,))
    assert torch.autograd.gradgradcheck(torch.ops.cfm.silu, (x,))
    assert torch.autograd.gradgradcheck(
        torch.ops.cfm.silu_bwd, (g, x)
    )  # silu''' through silu_bwd's backward


@needs_ext
def test_second_derivative_fills_no_tensor():
    """The second derivative (force training's double backward through each radial-MLP SiLU) runs
    no ``aten::fill_``: ``1 - s`` written as ATen's scalar-minus-tensor fills a [rows, width]
    tensor with 1 first."""
    x, w = _x(), _x(seed=1).detach()
    (gx,) = torch.autograd.grad((torch.ops.cfm.silu(x) * w).sum(), x, create_graph=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.autograd.grad(gx, x, w)

    def in_silu_node(e):
        while e is not None:
            if "cfm::silu" in e.name:
                return True
            e = e.cpu_parent
        return False

    events = prof.events()
    assert any(in_silu_node(e) and e.name == "aten::sigmoid" for e in events)  # it ran
    assert not [e.name for e in events if e.name == "aten::fill_" and in_silu_node(e)]


@needs_ext
def test_force_training_backward_keeps_the_gradient_only():
    """What the create_graph backward of one SiLU layer saves for the second backward: torch keeps
    four new [rows, width] tensors (sigmoid, 1 - s, ...), cfm::silu one (the incoming gradient)."""

    def new_saved(f):
        x = _x()
        y = f(x)
        seen = {x.data_ptr()}  # the input is held anyway (by the forward)
        new = []

        def pack(t):
            if t.shape == x.shape and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                new.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            torch.autograd.grad(y.sum() * 1.5, x, create_graph=True)
        return len(new)

    assert new_saved(torch.nn.functional.silu) >= 3
    assert new_saved(torch.ops.cfm.silu) == 1


def test_patch_swaps_the_radial_mlp_activations_and_unpatch_restores_e3nn_ones():
    model = tiny_mace("ScaleShiftMACE", BLOCKS[0], "RealAgnosticInteractionBlock")
    stock_acts = [layer.act for b in model.interactions for layer in b.conv_tp_weights.children()]
    patched = copy.deepcopy(model)
    report = patch_model(patched)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    for block in patched.interactions:
        acts = [layer.act for layer in block.conv_tp_weights.children()]
        assert (
            all(isinstance(a, LeanSiLU) for a in acts[:-1]) and acts[-1] is None
        )  # the output layer is linear
        assert acts[0].cst == pytest.approx(normalize2mom(torch.nn.functional.silu).cst)
    assert patched.state_dict().keys() == model.state_dict().keys()
    for ref, got in zip(run_mace(model, mace_batch()), run_mace(patched, mace_batch())):
        assert ref.abs().max() > 0 and (got - ref).abs().max() <= 1e-10 * ref.abs().max()
    unpatch_model(patched)
    restored = [layer.act for b in patched.interactions for layer in b.conv_tp_weights.children()]
    assert [type(a) for a in restored] == [type(a) for a in stock_acts]
    # one e3nn activation module per MLP, shared by its layers, as before
    for block in patched.interactions:
        layers = list(block.conv_tp_weights.children())
        assert layers[0].act is layers[1].act and isinstance(layers[0].act, normalize2mom)


def test_without_the_library_the_swap_calls_torch_silu(debug_switch):
    debug_switch("CFM_PLUGINS_FORCE_TORCH", "1")
    lean = LeanSiLU(normalize2mom(torch.nn.functional.silu))
    assert not lean.use_op
    x = _x()
    assert torch.equal(lean(x), normalize2mom(torch.nn.functional.silu)(x))


@needs_ext
def test_lean_silu_scripts():
    lean = torch.jit.script(LeanSiLU(normalize2mom(torch.nn.functional.silu)))
    x = _x()
    assert torch.equal(lean(x), normalize2mom(torch.nn.functional.silu)(x))


def test_force_training_gradients_match_stock():
    """The second backward (a loss on the forces) runs through cfm::silu's own double backward."""
    model = tiny_mace("ScaleShiftMACE", BLOCKS[0], "RealAgnosticInteractionBlock")
    patched = copy.deepcopy(model)
    patch_model(patched)
    grads = []
    for m in (model, patched):
        out = m(mace_batch(), training=True, compute_force=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        grads.append([p.grad for p in m.parameters()])
    radial = [n for n, _ in model.named_parameters()].index(
        "interactions.0.conv_tp_weights.layer0.weight"
    )
    assert grads[0][radial].abs().max() > 0
    for ref, got in zip(*grads):
        assert (got - ref).abs().max() <= 1e-10 * ref.abs().max()


@needs_ext
def test_opcheck_custom_ops():
    x, g = _x(n=(5, 4)), _x(n=(5, 4), seed=3)
    torch.library.opcheck(torch.ops.cfm.silu.default, (x,))
    torch.library.opcheck(torch.ops.cfm.silu_bwd.default, (g, x))


@needs_ext
def test_torch_compile_forward_and_backward():
    lean = LeanSiLU(normalize2mom(torch.nn.functional.silu))
    compiled = torch.compile(lean, fullgraph=True)
    results = []
    for fn in (compiled, normalize2mom(torch.nn.functional.silu)):
        x = _x()
        y = fn(x)
        results.append((y.detach(), torch.autograd.grad(y.square().sum(), x)[0]))
    for ours, ref in zip(*results):
        assert ((ours - ref).abs().max() / ref.abs().max()) < 1e-12


@needs_ext
@needs_cuda
def test_cuda_values_and_derivatives_match_cpu():
    results = []
    for device in ("cpu", "cuda"):
        x = _x().detach().to(device).requires_grad_(True)
        y = torch.ops.cfm.silu(x)
        (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.square().sum(), x)
        results.append([t.detach().cpu() for t in (y, gx, ggx)])
    for ours, ref in zip(*results):
        assert ((ours - ref).abs().max() / ref.abs().max()) < 1e-12
