"""enable_CFMFused, the nequip model modifier (adapters/nequip/modifier.py, registered by the
nequip.extension entry point): same energies, forces and gradients as stock, same state_dict.

nequip needs e3nn 0.6 and mace-torch pins 0.4.4, so these run in .venv-nequip (`make test-nequip`,
part of `make test`); in the main .venv they skip, saying so.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

import torch  # noqa: E402

from tests.helpers.nequip_models import rel, run_model, tiny_batch, tiny_model  # noqa: E402


def test_modifier_matches_stock_and_keeps_the_state_dict():
    from nequip.model import modify
    from nequip.nn._tp_scatter_base import TensorProductScatter

    from cfm_plugins_adapters.nequip.modifier import fused_class, unfuse

    assert hasattr(TensorProductScatter, "enable_CFMFused"), (
        "the nequip.extension entry point did not register it"
    )
    stock, fused = tiny_model(), tiny_model()
    fused = modify(
        fused, [{"modifier": "enable_CFMFused"}]
    )  # the config form, as nequip applies it
    n_fused = sum(isinstance(m, fused_class()) for m in fused.modules())
    assert n_fused == 2
    sd_s, sd_f = stock.state_dict(), fused.state_dict()
    assert list(sd_s) == list(sd_f)
    assert all(torch.equal(sd_s[k], sd_f[k]) for k in sd_s)

    batch = tiny_batch()
    e0, f0, g0 = run_model(stock, batch)
    e1, f1, g1 = run_model(fused, batch)
    assert rel(e1, e0) < 1e-10 and rel(f1, f0) < 1e-10
    for a, b in zip(g1, g0):
        assert (a is None) == (b is None)
        if a is not None and b.abs().max() > 0:
            assert rel(a, b) < 1e-10

    # a stock checkpoint loads into the fused model, and unfusing gives stock modules back
    fused.load_state_dict(stock.state_dict(), strict=True)
    assert unfuse(fused) == 2
    assert not any(isinstance(m, fused_class()) for m in fused.modules())
    e2, f2, _ = run_model(fused, batch)
    assert rel(e2, e0) < 1e-12 and rel(f2, f0) < 1e-12


def test_model_without_the_module_says_so_and_runs_stock(caplog):
    from cfm_plugins_adapters.nequip.modifier import fuse

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="cfm_plugins.nequip"):
        assert fuse(model) == 0
    assert "no nequip TensorProductScatter" in caplog.text and "runs stock" in caplog.text
    assert isinstance(model[0], torch.nn.Linear)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_toy_kernel_entry_is_swapped_in_a_nequip_model_through_the_hook(caplog):
    """The kernel table's promise: a third kernel is one entry. The nequip adapter's Trainer
    callback asks cfm_patch_model, which swaps the toy kernel's modules and the fused
    TensorProductScatter, and reports the symmetric contraction a NequIP model has none of."""
    from e3nn import o3

    from cfm_plugins.manager import Session
    from cfm_plugins_adapters import nequip as adapter
    from cfm_plugins_adapters.nequip.callbacks import FuseOnSetup
    from cfm_plugins_adapters.nequip.modifier import fused_class
    from tests.helpers.toy_kernel import NAME, ToyFusedLinear, fused_config, toy_kernel_registered

    model, batch = tiny_model(), tiny_batch()
    e0, f0, g0 = run_model(model, batch)
    keys = list(model.state_dict())
    linears = sum(isinstance(m, o3.Linear) for m in model.modules())
    assert linears > 0
    with toy_kernel_registered():
        config = fused_config("nequip", f"{NAME},conv_tp,symmetric_contraction")
        adapter._STATE["session"] = Session(config)
        try:
            with caplog.at_level(logging.INFO, logger="cfm_plugins.fused"):
                FuseOnSetup().setup(None, model, "fit")  # what nequip-train's Trainer calls
        finally:
            adapter._STATE.pop("session")
        assert sum(isinstance(m, ToyFusedLinear) for m in model.modules()) == linears
        assert sum(isinstance(m, fused_class()) for m in model.modules()) == 2
        assert list(model.state_dict()) == keys
        assert "has no module for symmetric_contraction" in caplog.text
        ToyFusedLinear.calls = 0
        e1, f1, g1 = run_model(model, batch)
        assert ToyFusedLinear.calls >= linears
    assert rel(e1, e0) < 1e-10 and rel(f1, f0) < 1e-10
    for a, b in zip(g1, g0):
        if a is not None and b.abs().max() > 0:
            assert rel(a, b) < 1e-10
