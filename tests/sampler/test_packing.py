"""pack(): Algorithm 1 against a plain sequential transcription, properties, targets, errors."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from benchmarks.workload import paper_mix
from cfm_plugins.sampler import (
    Packing,
    balance_report,
    load_imbalance_factor,
    lower_bound_bins,
    pack,
)
from cfm_plugins.sampler.balance import repeated_pairs
from cfm_plugins.sampler.packing import deal, pack_even, pack_levels, round_up, sort_descending


def reference_deal(s, cap, nb, add):
    """Algorithm 1 written out loop by loop (the paper's description, no vectorization)."""
    s = list(map(float, s))
    n, s_min = len(s), min(s)
    rem = [float(cap)] * nb
    cnt = [0] * nb
    item_bin, slot = [None] * n, [None] * n
    active, full = list(range(nb)), []
    ptr = 0
    while ptr < n:
        if not active:
            active = sorted(full, key=lambda b: rem[b])
            full = []
            if not active or rem[active[-1]] < s[ptr]:
                active += list(range(len(rem), len(rem) + add))
                rem += [float(cap)] * add
                cnt += [0] * add
            continue
        active = sorted(active, key=lambda b: rem[b])  # stable, fullest first
        kept, failed = [], []
        for b in active:
            if ptr >= n:
                kept.append(b)
            elif rem[b] >= s[ptr]:
                item_bin[ptr], slot[ptr] = b, cnt[b]
                cnt[b] += 1
                rem[b] -= s[ptr]
                ptr += 1
                kept.append(b)
            else:
                failed.append(b)
        full += [b for b in failed if rem[b] >= s_min]  # others can never take a graph
        active = [b for b in kept if rem[b] >= s_min]
        if full and active and min(rem[b] for b in active) < min(rem[b] for b in full):
            active, full = active + full, []
    return np.array(item_bin), np.array(slot), len(rem)


@pytest.mark.parametrize("case", range(40))
def test_vectorized_deal_equals_sequential_algorithm(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(5, 300))
    if case % 2:
        c = rng.integers(1, 60, n).astype(float)
    else:  # float costs: bucketed ties make the order non-monotone inside a bucket
        c = rng.uniform(0.5, 60, n) * (1 + 1e-4 * rng.standard_normal(n))
        c[: n // 3] = np.round(c[: n // 3], 1)
    cap = float(rng.choice([60, 75, 100, 200]))
    w = int(rng.integers(1, 5))
    order, mono = sort_descending(c, rng if case % 3 else None)
    s = c[order]
    nb = round_up(lower_bound_bins(s.sum(), cap), w)
    got = deal(s, cap, nb, w, monotone=mono)
    want = reference_deal(s, cap, nb, w)
    assert got[2] == want[2]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_non_monotone_deal_is_checked_item_by_item():
    # a dealing order that is not descending: the vectorized slice must split where a graph does not
    # fit
    s = np.array([10.0, 10.0, 9.0, 9.5, 9.0, 1.0, 1.0])
    got = deal(s, 20.0, 2, 1, monotone=False)
    want = reference_deal(s, 20.0, 2, 1)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[2] == want[2]


def _check_valid(p: Packing, c, cap, w, n=None):
    n = len(c) if n is None else n
    assert len(p) % w == 0 and p.num_steps(w) == len(p) // w
    np.testing.assert_array_equal(np.sort(p.indices), np.arange(n))  # every sample exactly once
    bc = p.bin_costs(c)
    assert bc.max() <= cap
    assert np.all(p.bin_sizes() > 0)  # no rank gets an empty batch


@pytest.mark.parametrize("w", [1, 3, 8])
@pytest.mark.parametrize("seed", [None, 0, 7])
def test_pack_properties_random(w, seed):
    rng = np.random.default_rng(123)
    c = rng.integers(1, 200, 3000)
    p = pack(c, 500, w, seed=seed)
    _check_valid(p, c, 500, w)
    assert p.indices.dtype == np.int64 and p.offsets.dtype == np.int64


def test_pack_float_costs():
    rng = np.random.default_rng(5)
    c = rng.lognormal(3, 1, 5000)
    c = np.minimum(c, 400)
    p = pack(c, 1000.0, 4, seed=3)
    _check_valid(p, c, 1000.0, 4)
    r = balance_report(p, c, 1000.0, 4)
    assert r.num_bins <= r.min_bins_for_world + 4


def test_pack_deterministic_and_seed_changes_composition():
    c = paper_mix(20_000, seed=1)
    a, b = pack(c, 3072, 8, seed=11), pack(c, 3072, 8, seed=11)
    assert a.checksum() == b.checksum()
    np.testing.assert_array_equal(a.indices, b.indices)
    d = pack(c, 3072, 8, seed=12)
    assert d.checksum() != a.checksum()
    rep, tot, frac = repeated_pairs(a, d, len(c))
    assert tot > 0 and frac < 0.10  # target: at most 10% of co-batched pairs repeated
    # balance does not depend on the seed
    ra, rd = balance_report(a, c, 3072), balance_report(d, c, 3072)
    assert ra.num_bins == rd.num_bins
    assert abs(ra.mean_imbalance - rd.mean_imbalance) < 1e-3
    # without a seed: the same plan every time
    assert pack(c, 3072, 8).checksum() == pack(c, 3072, 8).checksum()


@pytest.mark.parametrize("w", [8, 64])
def test_targets_on_realistic_mix(w):
    c = paper_mix(200_000, seed=0)
    p = pack(c, 3072, w, seed=0)
    _check_valid(p, c, 3072, w)
    r = balance_report(p, c, 3072, w)
    assert r.mean_imbalance <= 1.001
    assert r.padding <= r.min_padding + 0.001
    assert r.samples_lost == 0 and r.samples_duplicated == 0
    assert r.straggler_ratio < 1.01


def test_steps_are_contiguous_chunks_of_the_bins_sorted_by_cost():
    rng = np.random.default_rng(4)
    c = rng.integers(1, 90, 2000).astype(float)
    p = pack(c, 100, 4, seed=2)
    sc = np.sort(p.step_costs(c, 4), axis=1)
    sc = sc[np.lexsort((sc[:, -1], sc[:, 0]))]
    assert np.all(sc[:-1, -1] <= sc[1:, 0])  # no step mixes a costly bin with a lighter one


def test_packing_methods():
    c = np.array([5, 4, 3, 3, 2, 2, 1, 1, 1], float)
    p = pack(c, 8, 2)
    assert len(p) == 4 and p.num_steps() == 2
    assert len(p.step(0)) == 2 and sum(len(b) for b in p) == 9
    assert np.allclose(p.bin_costs(c).sum(), c.sum())
    assert p.step_costs(c).shape == (2, 2)
    sb = p.sample_bins(9)
    assert np.all(sb >= 0)
    for b, items in enumerate(p):
        assert np.all(sb[items] == b)
    np.testing.assert_array_equal(p[-1], list(p)[-1])
    with pytest.raises(IndexError):
        p[4]
    assert [len(x) for x in p.rank_bins(1)] == [len(p[1]), len(p[3])]
    with pytest.raises(ValueError, match="steps of 3"):
        p.num_steps(3)


# -- even bins (padded batches) ------------------------------------------------------------------


@pytest.mark.parametrize("w", [1, 2, 8])
@pytest.mark.parametrize("seed", [None, 3])
def test_even_bins_are_as_many_and_nearly_as_full_as_their_mean(w, seed):
    """pack_even: the same bins count as pack(), every sample once, no bin over the lowered
    capacity it records, and the fullest bin within a few percent of the mean where pack() leaves
    light bins beside full ones (a small set of coarse graphs: ~4 per bin)."""
    c = np.random.default_rng(7).integers(1, 300, 100).astype(float)
    cap = 4 * c.mean()
    plain, even = pack(c, cap, w, seed=seed), pack_even(c, cap, w, seed=seed)
    assert plain.capacity == cap and even.num_bins == plain.num_bins
    _check_valid(even, c, cap, w)
    assert even.capacity <= cap and even.bin_costs(c).max() <= even.capacity
    mean = c.sum() / even.num_bins
    assert even.bin_costs(c).max() <= 1.041 * mean + 1e-9 or even.capacity == c.max()
    assert even.bin_costs(c).max() <= plain.bin_costs(c).max()


def test_even_bins_keep_the_plan_when_no_lower_capacity_fits():
    """A graph as large as the capacity, or a set too small for the ranks: the plain plan."""
    c = np.array([100.0, 100.0, 100.0, 100.0])
    assert pack_even(c, 100, 2).checksum() == pack(c, 100, 2).checksum()
    tiny = pack_even([5.0, 6.0], 100, 4, repeat=True)
    assert (
        tiny.checksum() == pack([5.0, 6.0], 100, 4, repeat=True).checksum()
        and tiny.capacity is None
    )
    solo = pack_even([5.0, 500.0, 7.0, 9.0, 30.0, 20.0], 100, 2, oversize="solo")
    assert sorted(solo.indices.tolist()) == list(range(6)) and len(solo.solo) == 1


# -- calibration plans of several capacities (cost=auto) ------------------------------------------


@pytest.mark.parametrize("w", [1, 2, 4])
@pytest.mark.parametrize("seed", [None, 5])
def test_levels_plan_varies_the_step_totals_and_keeps_each_step_balanced(w, seed):
    """pack_levels: every sample exactly once, no bin over the capacity, the step totals spread
    over the levels (70-100 % of the capacity, where pack() fills all but the leftover steps to
    within a few percent), and the ranks of each step as balanced as in pack()."""
    c = np.random.default_rng(3).integers(3, 300, 1500).astype(float)
    cap = 8 * c.mean()
    plain, levels = pack(c, cap, w, seed=seed), pack_levels(c, cap, w, seed=seed)
    _check_valid(levels, c, cap, w)
    assert levels.capacity == cap

    def full_steps(p):  # the leftover steps of each packing are light in both plans
        mean = p.step_costs(c, w).mean(axis=1)
        return mean[mean >= 0.6 * cap] / cap

    assert np.std(full_steps(plain)) < 0.02
    spread = full_steps(levels)
    assert np.std(spread) > 0.08 and spread.min() < 0.75 and spread.max() > 0.95
    # each level gets about as many steps: the epoch has about 1/mean(levels) = 1.18x the steps
    assert 1.1 < levels.num_steps(w) / plain.num_steps(w) < 1.35
    if w > 1:
        sc = levels.step_costs(c, w)
        assert load_imbalance_factor(sc) < 1.02  # the bins of a step are packed to one capacity


def test_levels_plan_is_deterministic_and_interleaves_the_levels_without_a_seed():
    c = np.random.default_rng(4).integers(3, 300, 900).astype(float)
    cap = 8 * c.mean()
    assert pack_levels(c, cap, 2, seed=9).checksum() == pack_levels(c, cap, 2, seed=9).checksum()
    assert pack_levels(c, cap, 2, seed=9).checksum() != pack_levels(c, cap, 2, seed=10).checksum()
    fixed = pack_levels(c, cap, 2).step_costs(c, 2).mean(axis=1) / cap
    # round robin over the levels: no stretch of the epoch holds one level only (a drift of the
    # step time would look like the effect of a level)
    thirds = np.array_split(fixed, 3)
    assert all(part.max() - part.min() > 0.15 for part in thirds), fixed


def test_levels_plan_falls_back_to_one_capacity_for_a_small_set_and_keeps_the_oversize_policy():
    c = np.random.default_rng(5).integers(3, 300, 40).astype(float)
    cap = 8 * c.mean()  # 5 bins: fewer than 2 steps per level on 2 ranks
    assert pack_levels(c, cap, 2, seed=1).checksum() == pack(c, cap, 2, seed=1).checksum()
    assert (
        pack_levels(c, cap, 2, seed=1, levels=(1.0,)).checksum()
        == pack(c, cap, 2, seed=1).checksum()
    )
    big = np.concatenate([np.random.default_rng(6).integers(3, 300, 900), [5000]]).astype(float)
    cap = 8 * big[:-1].mean()
    with pytest.raises(ValueError, match="sample 900 has cost 5000"):
        pack_levels(big, cap, 2, seed=1)
    solo = pack_levels(big, cap, 2, seed=1, oversize="solo")  # as pack() places it: the plain plan
    assert solo.checksum() == pack(
        big, cap, 2, seed=1, oversize="solo"
    ).checksum() and solo.solo.tolist() == [900]
    # a sample costlier than a low level's capacity is packed in a level it fits
    c = np.concatenate([np.random.default_rng(7).integers(3, 300, 900), [0.9 * cap] * 5])
    p = pack_levels(c, cap, 2, seed=2)
    _check_valid(p, c, cap, 2)


@pytest.mark.parametrize(
    "levels, msg",
    [
        ((0.5, 0.8), "the largest 1.0"),
        ((0.0, 1.0), r"in \(0, 1\]"),
        ((0.7, 0.7, 1.0), "distinct"),
        ((0.5, 1.2), "exceed the capacity"),
        ("high", "fractions of the capacity"),
        ((), "the largest 1.0"),
    ],
)
def test_levels_errors(levels, msg):
    with pytest.raises(ValueError, match=msg):
        pack_levels(np.ones(10), 4, 1, levels=levels)


# -- errors ---------------------------------------------------------------------------------------


def test_oversize_error_names_sample_and_size():
    c = np.array([10.0, 20.0, 5000.0, 7.0])
    with pytest.raises(
        ValueError, match=r"sample 2 has cost 5000 > capacity 3072.*oversize='solo'"
    ):
        pack(c, 3072, 1)


def test_oversize_skip_and_solo(caplog):
    c = np.array([10.0, 20.0, 5000.0, 7.0, 9000.0, 30.0])
    with caplog.at_level("WARNING", logger="cfm_plugins.sampler"):
        p = pack(c, 100, 2, oversize="skip")
    assert "2 (5000)" in caplog.text and "4 (9000)" in caplog.text
    np.testing.assert_array_equal(p.skipped, [2, 4])
    assert sorted(p.indices.tolist()) == [0, 1, 3, 5]
    assert len(p) % 2 == 0
    q = pack(c, 100, 2, oversize="solo")
    np.testing.assert_array_equal(np.sort(q.indices), np.arange(6))
    solo_bins = [b for b in q if len(b) == 1 and c[b[0]] > 100]
    assert len(solo_bins) == 2 and len(q) % 2 == 0
    # the two solo bins are the costliest: sorted into the same step
    sb = q.sample_bins(6)
    assert sb[2] // 2 == sb[4] // 2


@pytest.mark.parametrize(
    "bad, msg",
    [
        ([1.0, 0.0, 2.0], r"sample 1 has cost 0\.0"),
        ([1.0, -3.0], r"sample 1 has cost -3\.0"),
        ([1.0, 2.0, np.nan], r"sample 2 has cost nan"),
        ([np.inf, 2.0], r"sample 0 has cost inf"),
        ([], "empty"),
        ([[1.0, 2.0]], "1-D"),
    ],
)
def test_bad_costs(bad, msg):
    with pytest.raises(ValueError, match=msg):
        pack(np.array(bad, dtype=float), 10, 1)


@pytest.mark.parametrize("cap", [0, -1, float("nan"), float("inf"), "x"])
def test_bad_capacity(cap):
    with pytest.raises(ValueError, match="capacity"):
        pack([1.0, 2.0], cap, 1)


def test_more_ranks_than_bins():
    with pytest.raises(ValueError, match=r"cannot give each of 8 ranks a non-empty batch") as err:
        pack([1.0, 2.0, 3.0], 10, 8)
    assert "use at most 3 rank(s)" in str(err.value) and "a larger capacity cannot help" in str(
        err.value
    )
    # 3 samples near the capacity on 2 ranks: 4 bins needed; a larger capacity does help, and says
    # how much
    with pytest.raises(ValueError, match=r"a capacity of 18 or more packs them into 2 bins"):
        pack([9.0, 9.0, 9.0], 10, 2)
    assert pack([9.0, 9.0, 9.0], 18, 2).num_steps(2) == 1
    with pytest.raises(ValueError, match="world_size"):
        pack([1.0], 10, 0)
    with pytest.raises(ValueError, match="oversize"):
        pack([1.0], 10, 1, oversize="drop")


def test_leftover_bins_are_added_world_size_at_a_time():
    # 10 graphs of 60 with capacity 100: one per bin; lower bound 6 -> add 2 at a time
    c = np.full(10, 60.0)
    p = pack(c, 100, 2)
    _check_valid(p, c, 100, 2)
    assert len(p) == 10


def test_bins_added_for_few_leftovers_are_never_empty():
    # 24 graphs of 30 fill the 8 starting bins to 90; the 20 needs W=4 new bins and is the only
    # graph left: the deal leaves 3 new bins empty, each then gets a graph from a fuller bin
    c = np.r_[np.full(24, 30.0), 20.0]
    s = np.sort(c)[::-1]
    _, _, nb = deal(s, 100.0, 8, 4)
    assert nb == 12 and len(np.unique(deal(s, 100.0, 8, 4)[0])) == 9  # 3 empty before the fix-up
    p = pack(c, 100, 4)
    _check_valid(p, c, 100, 4)
    assert len(p) == 12


def test_packing_module_does_not_import_torch():
    import subprocess

    code = (
        "import sys; import cfm_plugins.sampler as s; s.pack([1.0,2.0],4,1); "
        "from cfm_plugins.sampler import balance, costs; assert 'torch' not in sys.modules, 'torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_math_lower_bound():
    assert lower_bound_bins(3072 * 3, 3072) == 3
    assert lower_bound_bins(3072 * 3 + 1, 3072) == 4
    assert math.isclose(round_up(5, 4), 8)


def test_evaluation_plans_never_leave_a_rank_empty():
    """pack(evaluation=True) on every small case: each step has a non-empty bin per rank; with at
    least as many samples as ranks every sample is in exactly one bin, else in one bin per rank."""
    from cfm_plugins.sampler.packing import deal_over_ranks

    for n in range(1, 25):
        costs = np.random.default_rng(n).integers(1, 30, n).astype(float)
        for w in (2, 3, 4, 7):
            for cap in (30, 45, 100, 1000):
                p = pack(costs, cap, w, evaluation=True)
                assert len(p) % w == 0 and (p.bin_sizes() > 0).all(), (n, w, cap)
                expected = list(range(n)) if n >= w else sorted(list(range(n)) * w)
                assert sorted(p.indices.tolist()) == expected, (n, w, cap)
    # a one-rank plan of fewer bins than ranks is split (within capacity), not replicated
    p = deal_over_ranks(Packing(np.arange(6), np.array([0, 3, 6])), np.ones(6), 4)
    assert p.num_steps(4) == 1 and sorted(p.indices.tolist()) == list(range(6))


def test_training_plans_repeat_a_few_samples_so_no_rank_is_empty():
    """pack(repeat=True), for training loaders (issue 24): where the samples cannot give every
    rank a batch at every step, the one-rank plan is split and a few samples repeated, as torch's
    DistributedSampler pads: every sample at least once, fewer than world_size repeats, each bin
    within capacity, and the repeats listed in Packing.repeated."""
    for n in range(1, 16):
        costs = np.random.default_rng(n).integers(1, 30, n).astype(float)
        for w in (2, 3, 4, 7):
            for cap in (30, 45, 1000):
                for seed in (None, 5):
                    p = pack(costs, cap, w, seed, repeat=True)
                    assert len(p) % w == 0 and (p.bin_sizes() > 0).all(), (n, w, cap)
                    assert (p.bin_costs(costs) <= cap).all()
                    counts = np.bincount(p.indices, minlength=n)
                    assert (counts >= 1).all() and counts.sum() - n == len(p.repeated) < w, (
                        n,
                        w,
                        cap,
                    )
                    np.testing.assert_array_equal(
                        np.sort(p.repeated),
                        np.flatnonzero(counts > 1).repeat(counts[counts > 1] - 1),
                    )
                    if n >= w and not len(
                        p.repeated
                    ):  # a plan without repeats is the plain one when that works
                        assert sorted(p.indices.tolist()) == list(range(n))
    one = pack([5.0], 10, 4, repeat=True)  # one structure, four ranks: each rank trains on it
    assert one.num_steps(4) == 1 and one.indices.tolist() == [0, 0, 0, 0] and len(one.repeated) == 3
    three = pack(
        [9.0, 9.0, 9.0], 10, 2, repeat=True
    )  # the last step needs a fourth bin: one repeat
    assert three.num_steps(2) == 2 and len(three.repeated) == 1
    # random repeats vary with the seed (each epoch repeats others), the plain packing is untouched
    picks = {tuple(pack(np.full(3, 3.0), 3.5, 4, seed, repeat=True).repeated) for seed in range(20)}
    assert len(picks) > 1
    c = np.random.default_rng(0).integers(1, 30, 200).astype(float)
    assert pack(c, 100, 4, 3, repeat=True).checksum() == pack(c, 100, 4, 3).checksum()
