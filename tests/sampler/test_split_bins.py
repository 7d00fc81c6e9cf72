"""``_split_bins`` (the bins of a set too small for the ranks, split before samples are repeated):
the same bins, in the same order, as splitting the longest bin one sample at a time."""

from __future__ import annotations

import numpy as np

from cfm_plugins.sampler import pack
from cfm_plugins.sampler.packing import _split_bins


def one_at_a_time(bins, target):
    """The definition: split off the last sample of the first longest bin until there are
    ``target`` bins or every bin holds one sample."""
    bins = list(bins)
    while len(bins) < target and any(len(b) > 1 for b in bins):
        k = int(np.argmax([len(b) for b in bins]))
        bins[k : k + 1] = [bins[k][:-1], bins[k][-1:]]
    return bins


def test_split_bins_is_the_one_at_a_time_split():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        sizes = rng.integers(1, 9, int(rng.integers(1, 12)))
        edges = np.concatenate([[0], np.cumsum(sizes)])
        bins = [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])]
        target = int(rng.integers(1, 80))
        want = [b.tolist() for b in one_at_a_time(bins, target)]
        assert [b.tolist() for b in _split_bins(bins, target)] == want, (sizes, target)


def test_a_small_set_on_many_ranks_is_split_then_repeated():
    c = np.random.default_rng(1).integers(3, 300, 500).astype(float)
    p = pack(c, 3072, 4096, seed=0, repeat=True)
    seen = np.bincount(p.indices, minlength=len(c))
    assert len(p) == 4096 and (p.bin_sizes() == 1).all()  # every bin split down to one sample
    assert seen.sum() == 4096 and len(p.repeated) == 4096 - 500
    assert seen.min() >= 1 and seen.max() - seen.min() <= 1  # the repeats cycle through all
    p = pack(c, 3072, 40, seed=0, repeat=True)
    assert len(p) == 40 and len(p.repeated) == 0 and (np.bincount(p.indices) == 1).all()
