"""The binpack plugin's sampler hook: training loaders repeat a few samples where a set cannot give
every rank a batch (as DistributedSampler pads) and say how many; evaluation loaders do not repeat."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from cfm_plugins.sizes import GraphSizes


def batch_sampler(role: str, n: int, rank: int = 0, world_size: int = 2):
    config = Config(enabled=["binpack"], options={"max_tokens": "10"})
    pm = create_manager(config)
    return pm.hook.cfm_batch_sampler(dataset=None, sizes=GraphSizes(np.full(n, 9)), config=config,
                                     dist=DistInfo(rank=rank, world_size=world_size), role=role,
                                     trainer=TrainerSettings(seed=0))


def test_a_training_set_smaller_than_the_ranks_trains_with_a_repeat_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    samplers = [batch_sampler("train", 1, rank) for rank in (0, 1)]
    assert [list(s) for s in samplers] == [[[0]], [[0]]]  # both ranks train on the one structure
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2 and "binpack train: 1 sample(s) do not give each of 2 ranks a batch at every step: " \
                              "1 of them repeated" in said[0], said


def test_evaluation_and_large_enough_sets_are_not_repeated(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    assert batch_sampler("train", 4).repeated == 0
    valid = [batch_sampler("valid", 3, rank) for rank in (0, 1)]
    assert valid[0].repeated == 0 and sorted(i for s in valid for b in s for i in b) == [0, 1, 2]  # once each
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    with pytest.raises(ValueError, match="non-empty batch"):  # the sampler without repeat (a library user's)
        from cfm_plugins.sampler import BinPackBatchSampler

        BinPackBatchSampler(np.full(1, 9.0), 10, rank=0, world_size=2)
