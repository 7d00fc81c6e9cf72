"""The hydragnn adapter's loaders: HydraGNN's own set_epoch calls reach the bin-packing batch
sampler."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)


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


def test_loader_seam_serves_the_source_keywords_and_names_what_it_cannot():
    """HydraGNN's source adds keyword arguments to create_dataloaders: the shuffle flags and its own
    batching are served by binpack's plan; a process group, oversampling or an unknown argument
    send the call back to HydraGNN's own loaders, named in the warning."""
    from cfm_plugins_adapters.hydragnn.loader import unserved_arguments

    assert unserved_arguments((), {}) == []
    assert (
        unserved_arguments(
            (), {"train_sampler_shuffle": False, "batching": {"mode": "node_budget"}}
        )
        == []
    )
    assert unserved_arguments((True, True, True, None, False), {}) == []
    assert unserved_arguments((), {"oversampling": True, "group": "g"}) == [
        "oversampling=True",
        "group='g'",
    ]
    assert unserved_arguments((True, True, True, None, False, None, None, 8), {"later": 1}) == [
        "8",
        "later=1",
    ]
