"""The non-finite loss guard the trainer adapters share: where a sample comes from, how a batch's
structures are named, stopping, skipping and the summary. (Real runs: the adapters' tests.)"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch.utils.data import ConcatDataset, Subset

from cfm_plugins.nonfinite import LossGuard, NonFiniteLossError, dataset_source, name_structures


class FileSet(torch.utils.data.Dataset):
    """A dataset read from a file, as NequIP's ASEDataset: sample i is frame i of ``file_path``."""

    def __init__(self, path, n):
        self.file_path, self.n = path, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_dataset_source_walks_subsets_and_concatenations_to_the_file():
    a, b = FileSet("a.xyz", 5), FileSet("b.xyz", 4)
    both = ConcatDataset([a, b])  # 0..4 from a, 5..8 from b
    split = Subset(both, [8, 0, 6, 3])  # a random split, as nequip's
    assert [dataset_source(split, i) for i in range(4)] == [
        ("b.xyz", 3),
        ("a.xyz", 0),
        ("b.xyz", 1),
        ("a.xyz", 3),
    ]
    assert dataset_source(Subset(split, [2]), 0) == ("b.xyz", 1)
    # an in-memory list: the adapter's resolver, else unknown
    items = [object(), object()]
    known = {id(items[1]): ("c.xyz", 7)}
    assert dataset_source(items, 1, lambda ds, i: known.get(id(ds[i]))) == ("c.xyz", 7)
    assert dataset_source(items, 0, lambda ds, i: known.get(id(ds[i]))) is None


def test_structures_are_named_by_file_and_index():
    text = name_structures([("t.xyz", 5), ("t.xyz", 2), ("v.xyz", 0), None])
    assert text == (
        "t.xyz: structures 5, 2; v.xyz: structure 0; 1 structure(s) of the training set whose "
        "file is not known (counted from 0, in file order)"
    )
    many = name_structures([("t.xyz", i) for i in range(20)])
    assert many.startswith("t.xyz: structures 0, 1,") and "and 8 more" in many


def test_error_mode_stops_naming_the_batch_and_what_to_do():
    guard = LossGuard("error", rank=1, world_size=2, trainer="mace_run_train")
    with pytest.raises(NonFiniteLossError) as err:
        guard.stop(float("nan"), 0, 3, "t.xyz: structure 5 (counted from 0, in file order)")
    text = str(err.value)
    assert text.startswith("rank 1 of 2: the training loss of mace_run_train is nan at epoch 0")
    assert "step 3" in text and "t.xyz: structure 5" in text
    assert "before any checkpoint was written" in text and "nonfinite=skip" in text
    # the trainer's own batches: says how to have them named
    stock = LossGuard("error", named=False)
    with pytest.raises(NonFiniteLossError, match=r"not known with the trainer's own batches"):
        stock.stop(math.inf, 1, 0)
    # another rank's batch gave it (a loss averaged over the ranks)
    with pytest.raises(NonFiniteLossError, match=r"gave finite values.*another rank's batch"):
        guard.stop(float("nan"), 0, 3, "t.xyz: structure 1", own=False)


def test_skip_mode_counts_names_and_gives_up_after_an_epoch_of_skips(caplog):
    guard = LossGuard("skip", rank=0, world_size=2, trainer="nequip-train")
    assert guard.summary() is None
    with caplog.at_level(logging.WARNING, logger="cfm_plugins"):
        guard.skip(float("nan"), 0, 1, "t.xyz: structure 4")
    assert "epoch 0, step 1" in caplog.text and "t.xyz: structure 4" in caplog.text
    guard.passed()
    guard.skip(float("inf"), 1, 0, None, own=False)  # another rank's batch
    summary = guard.summary()
    assert "2 training step(s) of nequip-train skipped on rank 0" in summary
    assert "epoch 0, step 1 (loss nan: t.xyz: structure 4)" in summary
    assert "1 for another rank's" in summary
    guard.check_not_all_skipped(2)  # 1 in a row: not yet
    guard.skip(float("nan"), 1, 1, "t.xyz: structure 4")
    with pytest.raises(NonFiniteLossError, match=r"an epoch's worth\) were all skipped"):
        guard.check_not_all_skipped(2)


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="nonfinite='ignore': expected one of error, skip"):
        LossGuard("ignore")
