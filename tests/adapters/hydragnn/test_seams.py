"""The hydragnn adapter's get_distributed_model seam with fused: cfm_patch_model swaps MACE-style
modules by their layout (a vendored SymmetricContraction is not mace's class), or says once per
stack that it has none."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip("mace", reason="mace-torch is not installed (the [mace] extra)")

import hydragnn  # noqa: E402
import torch  # noqa: E402

from tests.helpers.hydragnn_models import build, vendored_symmetric_contraction_class  # noqa: E402


def test_adapter_seam_swaps_through_the_hook_or_says_once_which_stack_has_nothing(f64, caplog):
    from cfm_plugins.config import Config
    from cfm_plugins.manager import Session, create_manager
    from cfm_plugins_adapters.hydragnn.seams import make_get_distributed_model

    config = Config(enabled=["hydragnn", "fused"])
    create_manager(config)  # the declared defaults (fused_kernels: both kernels)
    session = Session(config)
    stock_wrap = (
        hydragnn.utils.distributed.get_distributed_model
    )  # no process group: returns the model
    caplog.set_level(logging.INFO, logger="cfm_plugins.fused")

    model = make_get_distributed_model(stock_wrap, session, None)(
        build(vendored_symmetric_contraction_class())
    )
    assert "fused kernels swapped in MaceStyleStack: symmetric_contraction: 2" in caplog.text
    assert sum(type(m).__name__ == "FusedSymmetricContraction" for m in model.modules()) == 2

    caplog.clear()
    gin = hydragnn.models.GINStack(
        1,
        8,
        [1],
        ["graph"],
        {
            "graph": {
                "num_sharedlayers": 1,
                "dim_sharedlayers": 8,
                "num_headlayers": 1,
                "dim_headlayers": [8],
            }
        },
        "relu",
        "mse",
        False,
        loss_weights=[1.0],
        num_conv_layers=2,
    )
    seam = make_get_distributed_model(stock_wrap, session, None)
    before = {k: v.clone() for k, v in gin.state_dict().items()}
    seam(gin)
    seam(gin)  # said once only
    msgs = [r.getMessage() for r in caplog.records if "has no module" in r.getMessage()]
    assert len(msgs) == 1 and "GINStack" in msgs[0] and "nothing was swapped" in msgs[0]
    assert "symmetric_contraction, conv_tp" in msgs[0]
    assert all(torch.equal(gin.state_dict()[k], v) for k, v in before.items())
