"""``step_sizes``: the packers' bins cut into steps by their sums of a second size (edges where the
cost counts atoms): the same bins, every sample once, steps more even in that size; the checks of
the values; the batch sampler's cross-rank check covers them."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.sampler import BinPackBatchSampler, pack, pack_even, pack_even_dims

W, CAP = 8, 600


@pytest.fixture(scope="module")
def sizes():
    """Atoms of 1-59 and edges at a density of 5-40 neighbours per atom, drawn independently: full
    bins of equal atoms differ in edges."""
    rng = np.random.default_rng(1)
    atoms = rng.integers(1, 60, 3000).astype(float)
    return atoms, atoms * rng.uniform(5, 40, len(atoms))


def bin_set(plan):
    return sorted(tuple(sorted(b.tolist())) for b in plan)


def step_spread(plan, values):
    """Mean over the steps of (largest - smallest bin sum of ``values``)."""
    s = plan.step_costs(values, W)
    return float((s.max(axis=1) - s.min(axis=1)).mean())


@pytest.mark.parametrize("packer", [pack, pack_even])
@pytest.mark.parametrize("seed", [None, 3])
def test_the_same_bins_cut_into_steps_more_even_in_the_step_sizes(sizes, packer, seed):
    atoms, edges = sizes
    plain = packer(atoms, CAP, W, seed)
    by_edges = packer(atoms, CAP, W, seed, step_sizes=edges)
    assert np.array_equal(np.sort(by_edges.indices), np.arange(len(atoms)))  # every sample once
    assert bin_set(by_edges) == bin_set(plain) and by_edges.capacity == plain.capacity
    assert step_spread(by_edges, edges) < 0.5 * step_spread(plain, edges)
    assert ranges_apart(by_edges, edges, W) and not ranges_apart(plain, edges, W)


def test_without_step_sizes_the_plan_is_todays(sizes):
    atoms, _ = sizes
    assert pack(atoms, CAP, W, 3, step_sizes=None).checksum() == pack(atoms, CAP, W, 3).checksum()


def test_pack_even_dims_cuts_its_bins_by_the_step_sizes(sizes):
    """Bins even in atoms and edges (``limits`` set: its own deal, not pack_even's fallback),
    the steps chosen by a third size."""
    atoms, edges = sizes
    rng = np.random.default_rng(2)
    graphs = rng.integers(1, 9, len(atoms)).astype(float)
    dims = np.column_stack([atoms, edges])
    plain = pack_even_dims(atoms, dims, 2000, W, 3)
    by_graphs = pack_even_dims(atoms, dims, 2000, W, 3, step_sizes=graphs)
    assert plain.limits is not None and by_graphs.limits == plain.limits
    assert bin_set(by_graphs) == bin_set(plain)
    assert step_spread(by_graphs, graphs) < step_spread(plain, graphs)


def ranges_apart(plan, values, w):
    """Whether the steps' ranges of bin sums of ``values`` do not overlap (ties aside): bins
    sorted by ``values`` before they were cut into steps."""
    steps = plan.step_costs(values, w)
    ranges = steps[np.argsort(steps.min(axis=1))]
    return bool(np.all(ranges.max(axis=1)[:-1] <= ranges.min(axis=1)[1:]))


def test_the_repeats_of_a_small_training_set_are_cut_by_the_step_sizes_too():
    """10 structures for 12 bins (4 ranks): 2 repeated (fill_with_repeats), steps by edges."""
    atoms, edges = np.full(10, 5.0), np.arange(1.0, 11.0) ** 2
    p = pack(atoms, 5, 4, 0, repeat=True, step_sizes=edges)
    assert len(p.repeated) == 2 and set(p.indices.tolist()) == set(range(10))
    assert ranges_apart(p, edges, 4)
    assert not ranges_apart(pack(atoms, 5, 4, 0, repeat=True), edges, 4)


@pytest.mark.parametrize(
    "bad, match",
    [
        ([1.0, 2.0, np.nan, 4.0], r"sample 2 has step size nan"),
        (
            [1.0, -3.0, 1.0, -1.0],
            r"sample 1 has step size -3.0: every step size must be finite "
            r"and >= 0 \(2 bad sample\(s\)",
        ),
        ([1.0, 2.0, 3.0], r"one size per sample \(4\)"),
        (["a", "b", "c", "d"], "must be numeric"),
    ],
)
def test_bad_step_sizes_are_refused_naming_the_first_bad_sample(bad, match):
    with pytest.raises(ValueError, match=match):
        pack(np.full(4, 2.0), 4, 2, step_sizes=np.asarray(bad))
    with pytest.raises(ValueError, match=match):
        BinPackBatchSampler(np.full(4, 2.0), 4, rank=0, world_size=2, step_sizes=np.asarray(bad))


def test_zero_step_sizes_are_allowed(sizes):
    atoms, _ = sizes
    p = pack(atoms, CAP, W, 3, step_sizes=np.zeros(len(atoms)))
    assert bin_set(p) == bin_set(pack(atoms, CAP, W, 3))


def test_the_batch_sampler_plans_with_them_and_the_ranks_compare_them(sizes):
    atoms, edges = sizes
    s = BinPackBatchSampler(atoms, CAP, rank=0, world_size=W, seed=3, step_sizes=edges)
    assert s.plan().checksum() == pack(atoms, CAP, W, 3, step_sizes=edges).checksum()
    options = dict(s._options())
    other = dict(
        BinPackBatchSampler(
            atoms, CAP, rank=0, world_size=W, seed=3, step_sizes=2 * edges
        )._options()
    )
    none = dict(BinPackBatchSampler(atoms, CAP, rank=0, world_size=W, seed=3)._options())
    assert options["step_sizes"] != other["step_sizes"] and none["step_sizes"] is None
    # a shard of one process (no communicator) is put in place like the costs; the shards of
    # real ranks: tests/sampler/test_batch_sampler_mpi.py
    sharded = BinPackBatchSampler(
        atoms[::-1],
        CAP,
        rank=0,
        world_size=W,
        seed=3,
        local_indices=np.arange(len(atoms))[::-1],
        step_sizes=edges[::-1],
    )
    assert sharded.plan().checksum() == s.plan().checksum()
