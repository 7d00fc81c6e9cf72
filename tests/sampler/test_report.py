"""balance_report numbers on hand-computed cases, the PNG picture, pair repetition, one LIF
definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.baselines import BASELINES
from benchmarks.workload import paper_mix
from cfm_plugins.sampler import Packing, balance_report, pack, plot_batches
from cfm_plugins.sampler.report import co_batched_pairs, repeated_pairs

C = np.array([5, 4, 3, 3, 2, 2, 1, 1, 1], float)  # total 22


def csr(bins, w):
    offsets = np.r_[0, np.cumsum([len(b) for b in bins])]
    return Packing(np.concatenate(bins), offsets, world_size=w)


def test_report_hand_computed():
    p = csr([[0, 5], [1, 2], [3, 4, 6], [7, 8]], 2)  # bin costs 7, 7 | 6, 2
    r = balance_report(p, C, 8)
    assert (r.num_bins, r.num_steps, r.lower_bound_bins, r.min_bins_for_world) == (4, 2, 3, 4)
    assert math.isclose(r.padding, 1 - 22 / 32) and math.isclose(r.min_padding, 1 - 22 / 32)
    np.testing.assert_allclose(r.step_max, [7, 6])
    np.testing.assert_allclose(r.step_mean, [7, 4])
    assert math.isclose(r.mean_imbalance, 1.25) and math.isclose(r.max_imbalance, 1.5)
    assert math.isclose(r.lif, 13 / 11) and math.isclose(r.straggler_ratio, 13 / 11)
    assert (r.samples_lost, r.samples_duplicated, r.bins_over_capacity) == (0, 0, 0)
    d = r.to_dict()
    assert d["step_max"] == [7.0, 6.0] and d["num_bins"] == 4
    text = r.to_text()
    assert "bins 4 = 2 steps (lower bound 3" in text and "LIF 1.18182" in text


def test_report_counts_lost_duplicated_and_overfull():
    p = csr([[0, 1], [0, 2], [3], [4, 5, 6, 7]], 2)  # 0 twice, 8 missing, bin 1 = 8 > capacity 7
    r = balance_report(p, C, 7)
    assert r.samples_lost == 1 and r.samples_duplicated == 1 and r.bins_over_capacity == 2


def test_repeated_pairs_exact():
    a = csr([[0, 1, 2], [3, 4], [5, 6, 7, 8]], 1)
    b = csr([[0, 1, 3], [2, 4], [5, 6, 7], [8]], 1)
    rep, tot, frac = repeated_pairs(a, b, 9)
    # pairs of a: 3 + 1 + 6 = 10; repeated: (0,1), (5,6), (5,7), (6,7)
    assert (rep, tot) == (4, 10) and math.isclose(frac, 0.4)
    assert co_batched_pairs(b) == 3 + 1 + 3


def test_plot_batches_writes_png(tmp_path):
    c = paper_mix(4000, seed=0)
    p = pack(c, 3072, 8, seed=0)
    base = BASELINES["fixed-count (8/rank)"](c, 3072, 8, seed=0)
    out = plot_batches(
        p, c, 8, tmp_path / "fig12.png", steps=range(2), baseline=base, capacity=3072
    )
    data = open(out, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_measured_and_planned_lif_are_one_definition():
    """The mace step logs' LIF (per-rank times, steps every rank ran) is the report's LIF."""
    from cfm_plugins.sampler.report import load_imbalance_factor
    from cfm_plugins.steplog import load_imbalance

    ranks = [
        [{"forward_s": 1.0}, {"forward_s": 3.0}],
        [{"forward_s": 2.0}, {"forward_s": 1.0}, {"forward_s": 9.0}],
    ]
    assert math.isclose(load_imbalance(ranks), (2 + 3) / (1.5 + 2))
    assert math.isclose(load_imbalance(ranks), load_imbalance_factor([[1.0, 2.0], [3.0, 1.0]]))
    assert math.isnan(load_imbalance_factor([[0.0, 0.0]]))
    with pytest.raises(ValueError, match="0 steps were logged"):
        load_imbalance([[], [{"forward_s": 1.0}]])


def test_lif_of_the_epochs_after_the_calibration():
    """The demos' cost=auto figure: the LIF of the steps from epoch 1 on (the fitted plans)."""
    from cfm_plugins.steplog import load_imbalance, records_from_epoch

    ranks = [
        [{"epoch": 0, "t": 1.0}, {"epoch": 1, "t": 2.0}, {"epoch": 2, "t": 2.0}],
        [{"epoch": 0, "t": 3.0}, {"epoch": 1, "t": 2.0}, {"epoch": 2, "t": 1.0}],
    ]
    later = records_from_epoch(ranks, 1)
    assert [[r["t"] for r in rank] for rank in later] == [[2.0, 2.0], [2.0, 1.0]]
    assert math.isclose(load_imbalance(later, "t"), (2 + 2) / (2 + 1.5))
    assert math.isclose(load_imbalance(ranks, "t"), (3 + 2 + 2) / (2 + 2 + 1.5))
