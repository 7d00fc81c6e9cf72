"""The kernel table: one entry per kernel, reached through the ``cfm_patch_model`` hook.

A toy third kernel (``tests/helpers/toy_kernel.py``) registered for a test is swapped into a real
MACE model by the same hook every adapter calls (the NequIP twin of this test runs in .venv-nequip),
and a ``fused_kernels`` entry a model has no module for is reported, never dropped.
"""

from __future__ import annotations

import logging

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from e3nn import o3

from cfm_plugins.ops import kernel_table
from cfm_plugins.ops.conv_tp import FusedConvTP
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
from tests.helpers.toy_kernel import NAME, ToyFusedLinear, fused_config, toy_kernel_registered


def test_a_toy_kernel_entry_is_swapped_in_a_mace_model_through_the_hook():
    model = build("ScaleShiftMACE", BLOCKS[0], BLOCKS[1])
    b = batch()
    ref = run(model, b)
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    linears = sum(isinstance(m, o3.Linear) for m in model.modules())
    assert linears > 0
    with toy_kernel_registered():
        config = fused_config("mace", f"{NAME},conv_tp")
        [report] = config.pm.hook.cfm_patch_model(model=model, config=config)
        assert report.counts == {NAME: linears, "conv_tp": 2}
        assert sum(isinstance(m, ToyFusedLinear) for m in model.modules()) == linears
        assert sum(isinstance(m, FusedConvTP) for m in model.modules()) == 2
        state = model.state_dict()
        assert state.keys() == keys.keys() and all(torch.equal(state[k], keys[k]) for k in keys)
        ToyFusedLinear.calls = 0
        got = run(model, b)
        assert ToyFusedLinear.calls >= linears  # the toy modules ran
        for a, r in zip(got, ref):
            torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-12)
        [undone] = config.pm.hook.cfm_unpatch_model(model=model, config=config)
        assert undone.counts == {NAME: linears, "conv_tp": 2}
        assert not any(isinstance(m, (ToyFusedLinear, FusedConvTP)) for m in model.modules())
    assert NAME not in kernel_table.kernel_names()


def test_an_unregistered_kernel_name_is_refused_at_start():
    with pytest.raises(
        ValueError, match=f"unknown fused kernel '{NAME}'.*known: symmetric_contraction, conv_tp"
    ):
        fused_config("mace", NAME)


def test_a_kernel_the_model_has_no_module_for_is_reported(caplog):
    config = fused_config("mace", "symmetric_contraction,conv_tp")
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with caplog.at_level(logging.INFO, logger="cfm_plugins.fused"):
        [report] = config.pm.hook.cfm_patch_model(model=model, config=config)
        config.pm.hook.cfm_patch_model(model=model, config=config)  # said once per model
    assert report.missing == ("symmetric_contraction", "conv_tp") and report.total == 0
    said = [r for r in caplog.records if "has no module for" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "Sequential" in said[0].getMessage() and "nothing was swapped" in said[0].getMessage()

    caplog.clear()
    mace_model = build("MACE", BLOCKS[1], BLOCKS[1])
    with caplog.at_level(logging.INFO, logger="cfm_plugins.fused"):
        [report] = config.pm.hook.cfm_patch_model(model=mace_model, config=config)
    assert report.missing == () and report.counts == {"symmetric_contraction": 2, "conv_tp": 2}
    assert (
        "interactions.0.conv_tp" in caplog.text
        and "products.1.symmetric_contractions" in caplog.text
    )
    assert "has no module for" not in caplog.text


def test_registering_checks_names_and_forms():
    with pytest.raises(ValueError, match="already registered"):
        kernel_table.register_kernel(kernel_table.kernels()["conv_tp"])
    with pytest.raises(ValueError, match="has no form"):
        kernel_table.register_kernel(kernel_table.Kernel("empty", "nothing", ()))
    with pytest.raises(ValueError, match="unknown fused kernel 'nope'"):
        kernel_table.add_form("nope", kernel_table.kernels()["conv_tp"].forms[0])


def test_the_model_itself_is_not_swapped():
    from cfm_plugins.ops.patching import patch_model

    tp = o3.TensorProduct(
        "2x0e",
        "1x0e",
        "2x0e",
        [(0, 0, 0, "uvu", True)],
        shared_weights=False,
        internal_weights=False,
    )
    with pytest.raises(ValueError, match="the model itself"):
        patch_model(tp, ("conv_tp",))
