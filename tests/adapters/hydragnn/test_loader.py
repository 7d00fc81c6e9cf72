"""The hydragnn adapter's loaders: HydraGNN's own set_epoch calls reach the bin-packing batch sampler."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)")
pytest.importorskip("torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)")


def test_epoch_forwarder_reaches_the_batch_sampler():
    from cfm_plugins.sampler import BinPackBatchSampler
    from cfm_plugins_adapters.hydragnn.loader import EpochForwarder

    costs = np.arange(1, 41, dtype=float)
    bs = BinPackBatchSampler(costs, 60, rank=0, world_size=1, seed=3)
    fwd = EpochForwarder(bs, len(costs))
    first = list(bs)
    fwd.set_epoch(1)
    assert bs.epoch == 1 and list(bs) != first
    assert list(fwd) == list(range(40)) and len(fwd) == 40
