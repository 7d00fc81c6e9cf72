"""balance_report numbers on hand-computed cases, the picture (stock batches beside the bins),
pair repetition, one LIF definition."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.baselines import BASELINES
from benchmarks.workload import paper_mix
from cfm_plugins.sampler import Packing, balance_report, pack, plot_batches
from cfm_plugins.sampler.balance import co_batched_pairs, fixed_count_batches, repeated_pairs

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


@pytest.mark.parametrize("length,batch,drop_last", [(10, 3, False), (10, 3, True), (9, 3, False)])
def test_fixed_count_batches_of_an_array_are_those_of_lists(length, batch, drop_last):
    orders = np.random.default_rng(length).permutation(4 * length).reshape(4, length)
    fast = fixed_count_batches(orders, batch, drop_last=drop_last)
    slow = fixed_count_batches([list(o) for o in orders], batch, drop_last=drop_last)
    assert fast.checksum() == slow.checksum() and fast.world_size == 4


def test_fixed_count_batches_cut_each_ranks_order_into_batches():
    """A stock loader's batches: rank r's step s is batch s of rank r's sampler order."""
    p = fixed_count_batches([[5, 1, 7, 3, 0], [2, 4, 6, 8, 9]], 2)
    assert p.world_size == 2 and p.num_steps() == 3
    assert [b.tolist() for b in p] == [[5, 1], [2, 4], [7, 3], [6, 8], [0], [9]]
    dropped = fixed_count_batches([[5, 1, 7, 3, 0], [2, 4, 6, 8, 9]], 2, drop_last=True)
    assert [b.tolist() for b in dropped] == [[5, 1], [2, 4], [7, 3], [6, 8]]
    with pytest.raises(ValueError, match=r"\[2, 1\] batches: every rank needs the same number"):
        fixed_count_batches([[0, 1, 2], [3]], 2)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        fixed_count_batches([[0, 1]], 0)


def test_the_picture_sets_the_trainers_batches_beside_the_bins_with_each_sides_lif():
    """Figure 12's two panels: stock batches left, bins right; each title names its side and
    its LIF over the epoch; every sample is one bar on each side, as long as its cost; a rank
    that waits for its step's slowest rank gets a hatched bar."""
    import matplotlib.pyplot as plt

    from cfm_plugins.sampler.balance import draw_batches, load_imbalance_factor

    rng = np.random.default_rng(3)
    c = rng.integers(4, 300, 30).astype(float)
    plan = pack(c, 4 * c.mean(), 2, seed=0)
    order = rng.permutation(30)
    stock = fixed_count_batches([order[:15], order[15:]], 4)
    fig = draw_batches(
        plan, c, 2, steps=None, baseline=stock, capacity=4 * c.mean(), titles=("stock", "bins")
    )
    try:
        assert len(fig.axes) == 2
        for ax, side, name in zip(fig.axes, (stock, plan), ("stock", "bins")):
            lif = load_imbalance_factor(side.step_costs(c, 2))
            assert ax.get_title().startswith(name) and f"LIF {lif:.3f}" in ax.get_title()
            bars = [p for p in ax.patches if (p.get_gid() or "").startswith("sample ")]
            drawn = sorted(int(p.get_gid().split()[1]) for p in bars)
            assert drawn == list(range(30))  # every sample once
            assert all(p.get_width() == c[int(p.get_gid().split()[1])] for p in bars)
            assert len(ax.get_yticklabels()) == 2 * side.num_steps()
            waits = sum(1 for p in ax.patches if p.get_hatch())
            steps = side.step_costs(c, 2)
            assert waits == int((steps < steps.max(axis=1, keepdims=True)).sum())
        assert load_imbalance_factor(stock.step_costs(c, 2)) > load_imbalance_factor(
            plan.step_costs(c, 2)
        )
    finally:
        plt.close(fig)
    part = draw_batches(plan, c, 2, steps=range(2), baseline=stock)
    try:
        assert f"steps 0-1 of {plan.num_steps()} shown" in part.axes[1].get_title()
        assert len(part.axes[0].get_yticklabels()) == 4
    finally:
        plt.close(part)


def test_measured_and_planned_lif_are_one_definition():
    """The mace step logs' LIF (per-rank times, steps every rank ran) is the report's LIF."""
    from cfm_plugins.sampler.balance import load_imbalance_factor
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


def test_counts_are_said_in_the_singular_or_the_plural():
    from cfm_plugins.sampler.balance import count

    assert [count(1, "step"), count(2, "step"), count(0, "epoch"), count(3, "pass")] == [
        "1 step",
        "2 steps",
        "0 epochs",
        "3 passes",
    ]
