"""benchmarks/baselines.py: the packers the sampler is compared with follow its step convention."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.baselines import BASELINES, fastchgnet_pairs, first_fit_decreasing
from benchmarks.workload import paper_mix
from cfm_plugins.sampler import balance_report


@pytest.mark.parametrize("name", list(BASELINES))
@pytest.mark.parametrize("w", [1, 4])
def test_baselines_follow_the_step_convention(name, w):
    c = paper_mix(5000, seed=2)
    p = BASELINES[name](c, 3072, w, seed=0)
    assert len(p) % w == 0
    r = balance_report(p, c, 3072, w)
    assert r.samples_lost == 0
    if name in ("first-fit decreasing", "greedy budget (PyG)", "HydraGNN cost-aware"):
        assert r.bins_over_capacity == 0


def test_first_fit_decreasing_is_first_fit():
    c = np.array([6, 5, 4, 3, 2, 2, 1], float)
    p = first_fit_decreasing(c, 7, 1, seed=0)
    got = sorted(sorted(c[b].tolist()) for b in p)
    # FFD by hand: [6,1], [5,2], [4,3], [2]
    assert got == [[1.0, 6.0], [2.0], [2.0, 5.0], [3.0, 4.0]]


def test_fastchgnet_pairs_smallest_with_largest():
    c = np.arange(1.0, 9.0)  # one global batch of 8 on 2 ranks (batch_size 4)
    p = fastchgnet_pairs(c, None, 2, seed=0, batch_size=4)
    got = sorted(sorted(c[b].tolist()) for b in p)
    assert got == [[1.0, 3.0, 6.0, 8.0], [2.0, 4.0, 5.0, 7.0]]
