"""patch_model with HydraGNN: MACE-style modules are found by their layout, not by class.

HydraGNN's later stacks carry a vendored copy of MACE's ``SymmetricContraction``; the test builds
such a copy (mace's own source loaded as another module, so its class is not mace's) inside a
HydraGNN stack (a ``hydragnn.models.Base`` subclass with a MACE-style conv: e3nn uvu tensor
product + scatter + symmetric contraction) and checks that the swap finds and fuses them exactly.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip("mace", reason="mace-torch is not installed (the [mace] extra)")

import torch  # noqa: E402

from cfm_plugins.ops.patching import find_modules, patch_model, unpatch_model  # noqa: E402
from tests.helpers.hydragnn_models import batch, build, vendored_symmetric_contraction_class  # noqa: E402


def test_the_kernel_table_fuses_a_hydragnn_model_holding_mace_style_modules(f64):
    model = build(vendored_symmetric_contraction_class())
    data = batch()
    ref = model(data)[0]
    ref.sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    keys = {k: v.clone() for k, v in model.state_dict().items()}

    found = find_modules(model)
    assert len(found["symmetric_contraction"]) == 2 and len(found["conv_tp"]) == 2, found

    report = patch_model(model)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 0}
    names = {type(m).__name__ for m in model.modules()}
    assert {"FusedSymmetricContraction", "FusedConvTP"} <= names
    state = model.state_dict()
    assert state.keys() == keys.keys() and all(torch.equal(state[k], keys[k]) for k in keys)

    out = model(data)[0]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    out.sum().backward()
    for k, p in model.named_parameters():
        if k in ref_grads:
            torch.testing.assert_close(p.grad, ref_grads[k], rtol=1e-9, atol=1e-12, msg=k)

    assert unpatch_model(model).total == 4
    assert not {"FusedSymmetricContraction", "FusedConvTP"} & {
        type(m).__name__ for m in model.modules()
    }
    torch.testing.assert_close(model(data)[0], ref, rtol=1e-12, atol=1e-14)
