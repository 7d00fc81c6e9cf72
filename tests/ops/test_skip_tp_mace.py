"""patch_model with all three kernels (symmetric contraction, conv TP, skip connection) on real mace
models built with mace's constructors: energies, forces, stress and a train step's parameter
gradients equal to the stock model's to float64 round-off, for every interaction block that holds
a ``FullyConnectedTensorProduct`` skip connection (mace 0.3.16: ``RealAgnosticInteractionBlock``
and ``RealAgnosticResidualInteractionBlock`` and their ``Density`` variants; the non-residual
blocks apply it to the message, the residual ones to the node features); state_dict unchanged;
unpatch restores; ``auto`` leaves the untimed GPU kernel off, a named request turns it on."""

from __future__ import annotations

import copy

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops import _backend
from cfm_plugins.ops.patching import patch_model, unpatch_model
from cfm_plugins.ops.skip_tp import FusedSkipTP
from tests.helpers.mace_models import mace_batch, run_mace, tiny_mace

needs_ext = pytest.mark.skipif(
    _backend.choose(torch.device("cpu")) != "cpu" or not hasattr(torch.ops.cfm, "skip_tp_fwd"),
    reason="compiled CPU kernel not built",
)

ALL = ("symmetric_contraction", "conv_tp", "skip_tp")

BLOCK_PAIRS = [  # (kind, interaction block, first block)
    ("ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"),
    ("MACE", "RealAgnosticInteractionBlock", "RealAgnosticInteractionBlock"),
    (
        "ScaleShiftMACE",
        "RealAgnosticDensityResidualInteractionBlock",
        "RealAgnosticDensityInteractionBlock",
    ),
    ("MACE", "RealAgnosticDensityInteractionBlock", "RealAgnosticDensityInteractionBlock"),
]


def grads(model, b):
    """Parameter gradients of a force loss (the double backward of force training)."""
    model.zero_grad()
    bb = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
    out = model(bb, training=True, compute_force=True)
    ((out["forces"] ** 2).sum() + out["energy"].pow(2).sum()).backward()
    return [p.grad.clone() if p.grad is not None else None for p in model.parameters()]


@needs_ext
@pytest.mark.parametrize("kind,block,first", BLOCK_PAIRS)
def test_all_three_kernels_keep_energies_forces_and_train_step_gradients(kind, block, first):
    stock = tiny_mace(kind, block, first)
    model = copy.deepcopy(stock)
    b = mace_batch()
    keys = list(model.state_dict())
    report = patch_model(model, ALL)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    assert all(isinstance(blk.skip_tp, FusedSkipTP) for blk in model.interactions)
    assert list(model.state_dict()) == keys
    assert patch_model(model, ALL).total == 0  # idempotent
    ref, got = run_mace(stock, b), run_mace(model, b)
    assert ref[1].abs().max() > 1e-3  # forces are not trivially zero
    for a, r in zip(got, ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
    for a, r in zip(grads(model, b), grads(stock, b)):
        assert (a is None) == (r is None)
        if a is not None:
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
    undone = unpatch_model(model, ("skip_tp",))
    assert undone.counts == {"skip_tp": 2}
    assert not any(isinstance(m, FusedSkipTP) for m in model.modules())
    assert type(model.interactions[0].skip_tp) is type(stock.interactions[0].skip_tp)
    assert list(model.state_dict()) == keys
    for a, r in zip(run_mace(model, b), ref):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)


@needs_ext
def test_float32_model_and_a_checkpoint_round_trip(tmp_path):
    stock = tiny_mace(
        "ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
    ).float()
    model = copy.deepcopy(stock)
    assert patch_model(model).counts["skip_tp"] == 2
    b = {
        k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in mace_batch(1).items()
    }
    for a, r in zip(run_mace(model, b), run_mace(stock, b)):
        torch.testing.assert_close(a, r, rtol=2e-4, atol=2e-5)
    torch.save(model, tmp_path / "m.model")
    loaded = torch.load(tmp_path / "m.model", weights_only=False)
    assert isinstance(loaded.interactions[1].skip_tp, FusedSkipTP)
    for a, r in zip(run_mace(loaded, b), run_mace(stock, b)):
        torch.testing.assert_close(a, r, rtol=2e-4, atol=2e-5)
    # a stock checkpoint loads into the patched model
    other = tiny_mace(
        "ScaleShiftMACE",
        "RealAgnosticResidualInteractionBlock",
        "RealAgnosticInteractionBlock",
        seed=4,
    ).float()
    model.load_state_dict(other.state_dict())
    for a, r in zip(run_mace(model, b), run_mace(other, b)):
        torch.testing.assert_close(a, r, rtol=2e-4, atol=2e-5)


def test_auto_leaves_the_untimed_gpu_kernel_off_and_a_named_request_turns_it_on():
    model = tiny_mace(
        "ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
    )
    auto = copy.deepcopy(model)
    assert patch_model(auto).counts["skip_tp"] == 2  # None: every kernel the model has
    assert not any(m.gpu_kernels for m in auto.modules() if isinstance(m, FusedSkipTP))
    named = copy.deepcopy(model)
    assert patch_model(named, ("skip_tp",)).counts == {"skip_tp": 2}
    fused = [m for m in named.modules() if isinstance(m, FusedSkipTP)]
    assert len(fused) == 2 and all(m.gpu_kernels for m in fused)
