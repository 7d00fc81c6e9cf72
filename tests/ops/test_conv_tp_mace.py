"""patch_model / unpatch_model of the conv TP on real mace models (built with mace's own
constructors): energies and forces equal to float64 round-off, state_dict unchanged, unpatch
restores."""

from __future__ import annotations

import copy

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3

from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.patching import patch_model, unpatch_model
from tests.helpers.mace_models import (
    BLOCKS,
)
from tests.helpers.mace_models import (
    mace_batch as batch,
)
from tests.helpers.mace_models import (
    run_mace as run,
)
from tests.helpers.mace_models import (
    tiny_mace as build,
)

TP = ("conv_tp",)


@pytest.mark.parametrize(
    "kind,block,first",
    [
        ("ScaleShiftMACE", BLOCKS[0], "RealAgnosticInteractionBlock"),
        ("MACE", BLOCKS[1], BLOCKS[1]),
        ("ScaleShiftMACE", BLOCKS[2], BLOCKS[2]),
    ],
)
def test_patch_keeps_energies_forces_and_state_dict(kind, block, first):
    model = build(kind, block, first)
    b = batch()
    ref = run(model, b)
    keys = list(model.state_dict())
    originals = [blk.conv_tp for blk in model.interactions]

    assert patch_model(model, TP).total == 2
    assert all(
        isinstance(blk.conv_tp, FusedConvTP) and hasattr(blk, "conv_fusion")
        for blk in model.interactions
    )
    assert list(model.state_dict()) == keys
    assert patch_model(model, TP).total == 0  # idempotent
    got = run(model, b)
    assert ref[1].abs().max() > 1e-3  # forces are not trivially zero
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)

    # training step: parameter gradients of a force loss (double backward) agree
    def grads(m):
        m.zero_grad()
        bb = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
        out = m(bb, training=True, compute_force=True)
        ((out["forces"] ** 2).sum() + out["energy"].sum()).backward()
        return [p.grad.clone() if p.grad is not None else None for p in m.parameters()]

    g_fused = grads(model)

    assert unpatch_model(model, TP).total == 2
    assert [blk.conv_tp for blk in model.interactions] == originals
    assert not any(hasattr(blk, "conv_fusion") for blk in model.interactions)
    assert list(model.state_dict()) == keys
    g_ref = grads(model)
    for a, r in zip(g_fused, g_ref):
        assert (a is None) == (r is None)
        if a is not None:
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
    for a, r in zip(run(model, b), ref):
        torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-14)


def test_patched_model_survives_deepcopy_save_load_and_dtype_moves(tmp_path):
    model = build("ScaleShiftMACE", BLOCKS[0], BLOCKS[0], seed=1)
    b = batch(1)
    ref = run(model, b)
    patch_model(model, TP)
    clone = copy.deepcopy(model)
    torch.save(model, tmp_path / "m.model")
    loaded = torch.load(tmp_path / "m.model", weights_only=False)
    for m in (clone, loaded):
        assert isinstance(m.interactions[0].conv_tp, FusedConvTP)
        for a, r in zip(run(m, b), ref):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    # a checkpoint of the stock model loads into the patched one and back
    stock = build("ScaleShiftMACE", BLOCKS[0], BLOCKS[0], seed=2)
    model.load_state_dict(stock.state_dict())
    for a, r in zip(run(model, b), run(stock, b)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    # float32 after patching (the shared buffers move with the fused module and are restored)
    model32 = loaded.float()
    e32, f32, _ = run(
        model32,
        {
            k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in b.items()
        },
    )
    torch.testing.assert_close(e32.double(), ref[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(f32.double(), ref[1], rtol=1e-4, atol=1e-4)
    unpatch_model(model32, TP)
    tp = model32.interactions[0].conv_tp
    assert not isinstance(tp, FusedConvTP) and tp.output_mask.dtype == torch.float32


def _tensors(model: torch.nn.Module):
    """Every tensor a patched model holds: parameters and buffers (persistent or not) of every
    module."""
    for name, module in model.named_modules():
        for key, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None:
                yield f"{name}.{key}", t


def test_patched_model_follows_to_and_keeps_its_dtype():
    """Issue 8: every tensor of a patched module follows .to() (device and dtype), and patching a
    model that is already in a dtype keeps everything there (a meta-device move stands for a
    GPU)."""
    model = build(
        "MACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
    ).float()
    report = patch_model(model)
    assert report.counts["conv_tp"] > 0 and report.counts["symmetric_contraction"] > 0
    fused = [m for m in model.modules() if isinstance(m, FusedConvTP)]
    coef = {id(m): m._tp_coef.clone() for m in fused}
    floats = {
        n: t.dtype
        for n, t in _tensors(model)
        if t.is_floating_point() and "_tp_coef" not in n and "_sk_coef" not in n  # float64 tables
    }
    assert set(floats.values()) == {
        torch.float32
    }  # patched in float32: the new buffers are float32 too
    model.double()
    assert all(t.dtype == torch.float64 for n, t in _tensors(model) if t.is_floating_point())
    for m in fused:  # the CG tables stay float64 and exact through dtype moves
        assert m._tp_coef.dtype == torch.float64 and torch.equal(m._tp_coef, coef[id(m)])
    model.to("meta")
    off = [n for n, t in _tensors(model) if t.device.type != "meta"]
    assert not off, f"left behind by .to('meta'): {off}"
    assert all(m._tp_coef.dtype == torch.float64 for m in fused)


def test_patching_on_the_model_device():
    """Fused modules are created where their block's parameters live (not on the CPU by default)."""
    tp = o3.TensorProduct(
        "2x0e+2x1o",
        "1x0e+1x1o",
        "2x0e+2x1o",
        [(0, 0, 0, "uvu", True), (1, 1, 0, "uvu", True)],
        shared_weights=False,
        internal_weights=False,
    )
    fused = FusedConvTP.from_e3nn(tp, device="meta")
    own = {n: t for n, t in fused.named_buffers() if n.startswith(("_cl_", "_tp_"))}
    # the CG tables, the channel-last permutations and their inverses
    assert len(own) == 8 and {t.device.type for t in own.values()} == {"meta"}
