"""The radial fusion in NequIP models (kernel ``conv_tp_radial``, adapters/nequip/modifier.py's
``radial_form``): each InteractionBlock's ``edge_mlp`` stops at its last hidden layer and the
fused TensorProductScatter makes the per-edge weights inside its kernels. Energies, forces and the
parameter gradients of a force loss equal to stock's (float64 round-off), the state_dict
unchanged, unpatching and unfusing restoring the stock modules, and a clear refusal without
``conv_tp``. Runs in .venv-nequip (skips elsewhere, saying so)."""

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

RADIAL = ("conv_tp", "conv_tp_radial")


def _blocks(model):
    from nequip.nn.interaction_block import InteractionBlock

    return [m for m in model.modules() if isinstance(m, InteractionBlock)]


def _assert_same(got, ref, tol=1e-10):
    (e1, f1, g1), (e0, f0, g0) = got, ref
    assert rel(e1, e0) <= tol and rel(f1, f0) <= tol
    assert len(g1) == len(g0)
    for a, b in zip(g1, g0):
        assert (a is None) == (b is None)
        if a is not None and b.abs().max() > 0:
            assert rel(a, b) <= tol


@pytest.mark.parametrize("depth", [1, 0])
def test_radial_fusion_matches_stock_and_keeps_the_state_dict(depth):
    from cfm_plugins.api import patch_model, unpatch_model
    from cfm_plugins_adapters.nequip.modifier import (
        fused_class,
        radial_hidden_class,
        register_form,
        unfuse,
    )

    register_form()
    # depth 0: edge_mlp is one linear layer, and the fused TP reads the edge embedding itself
    stock, model = tiny_model(radial_depth=depth), tiny_model(radial_depth=depth)
    model.load_state_dict(stock.state_dict())
    batch = tiny_batch()
    ref = run_model(stock, batch)
    keys = list(model.state_dict())

    report = patch_model(model, RADIAL)
    blocks = _blocks(model)
    assert len(report.swapped["conv_tp_radial"]) == len(blocks) == 2
    for block in blocks:
        assert isinstance(block.tp_scatter, fused_class()) and block.tp_scatter.tp.radial
        assert isinstance(block.edge_mlp, radial_hidden_class())
        last = block.edge_mlp.last_layer()
        assert block.tp_scatter.tp.radial_weight is last.weight  # the model's own parameter
    sd = model.state_dict()
    assert list(sd) == keys
    assert all(torch.equal(sd[k], v) for k, v in stock.state_dict().items())
    _assert_same(run_model(model, batch), ref)

    # the hidden layer is what the fused TP reads, not the weights
    block = blocks[0]
    h = block.edge_mlp(torch.randn(5, block.edge_mlp.mlp[0].weight.shape[0], dtype=torch.float64))
    assert h.shape[1] == block.tp_scatter.tp.radial_weight.shape[0]

    # unpatching the radial kernel alone gives the stock MLP back, the fused TP stays
    assert len(unpatch_model(model, ("conv_tp_radial",)).swapped["conv_tp_radial"]) == 2
    for block in blocks:
        assert not isinstance(block.edge_mlp, radial_hidden_class())
        assert isinstance(block.tp_scatter, fused_class()) and not block.tp_scatter.tp.radial
    _assert_same(run_model(model, batch), ref)

    # unfusing (conv_tp only) undoes the radial fusion too
    patch_model(model, RADIAL)
    assert unfuse(model) == 2
    for block in _blocks(model):
        assert type(block.edge_mlp).__name__ == "ScalarMLPFunction"
        assert type(block.tp_scatter).__name__ == "TensorProductScatter"
    _assert_same(run_model(model, batch), ref, tol=1e-12)


def test_radial_fusion_float32():
    from cfm_plugins.api import patch_model
    from cfm_plugins_adapters.nequip.modifier import register_form

    register_form()
    stock, model = tiny_model(dtype="float32"), tiny_model(dtype="float32")
    model.load_state_dict(stock.state_dict())
    batch = tiny_batch()
    e0, f0, _ = run_model(stock, batch)
    assert len(patch_model(model, RADIAL).swapped["conv_tp_radial"]) == 2
    e1, f1, _ = run_model(model, batch)
    assert rel(e1, e0) < 1e-5 and rel(f1, f0) < 1e-4


def test_radial_fusion_without_conv_tp_is_refused(caplog):
    from cfm_plugins.api import patch_model
    from cfm_plugins_adapters.nequip.modifier import register_form

    register_form()
    model, batch = tiny_model(), tiny_batch()
    ref = run_model(model, batch)
    with caplog.at_level(logging.WARNING):
        report = patch_model(model, ("conv_tp_radial",))
    assert not report.swapped["conv_tp_radial"]
    assert "fuse conv_tp too" in caplog.text
    assert all(type(b.edge_mlp).__name__ == "ScalarMLPFunction" for b in _blocks(model))
    _assert_same(run_model(model, batch), ref, tol=0)


def test_radial_fusion_through_the_trainer_callback(caplog):
    """nequip-train's route: the adapter's Trainer callback asks cfm_patch_model with the kernels
    the ``fused_kernels`` option names."""
    from cfm_plugins.manager import Session
    from cfm_plugins_adapters import nequip as adapter
    from cfm_plugins_adapters.nequip.callbacks import FuseOnSetup
    from cfm_plugins_adapters.nequip.modifier import radial_hidden_class
    from tests.helpers.toy_kernel import fused_config

    model, batch = tiny_model(), tiny_batch()
    ref = run_model(model, batch)
    adapter._STATE["session"] = Session(fused_config("nequip", ",".join(RADIAL)))
    try:
        FuseOnSetup().setup(None, model, "fit")
    finally:
        adapter._STATE.pop("session")
    hidden = [b.edge_mlp for b in _blocks(model)]
    assert len(hidden) == 2 and all(isinstance(h, radial_hidden_class()) for h in hidden)
    assert all(h.gpu for h in hidden)  # named: its GPU kernels run too
    _assert_same(run_model(model, batch), ref)
