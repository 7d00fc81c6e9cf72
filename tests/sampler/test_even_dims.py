"""Bins even in atoms and edges together (pack_even_dims): as many bins as
Algorithm 1, every sample once, no bin over its limits, and both paddings small where bins even
in one size pad the other a lot."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.sampler.even_dims import check_dims, pack_even_dims
from cfm_plugins.sampler.packing import pack, pack_even
from cfm_plugins.static_shapes.budget import bin_sizes


def mixed_density_set(n=120, seed=0):
    """Structures of 1..300 atoms at 2..80 neighbours each: sparse clusters and dense bulk mixed."""
    rng = np.random.default_rng(seed)
    atoms = rng.integers(1, 301, n)
    edges = atoms * rng.integers(2, 81, n)
    return atoms, edges


def worst_pad(p, atoms, edges, limits=None):
    a, e, _ = bin_sizes(p, atoms, edges)
    la, le = (a.max(), e.max()) if limits is None else limits
    return len(a) * la / a.sum() - 1, len(e) * le / e.sum() - 1


def test_joint_bins_are_as_many_hold_every_sample_once_and_stay_within_their_limits():
    atoms, edges = mixed_density_set()
    capacity = 8 * atoms.mean()
    for seed in (None, 0, 1):
        p = pack_even_dims(atoms, np.column_stack([atoms, edges]), capacity, 2, seed=seed)
        assert p.limits is not None and len(p) == len(pack(atoms, capacity, 2, seed=seed))
        assert sorted(p.indices.tolist()) == list(range(len(atoms)))
        a, e, _ = bin_sizes(p, atoms, edges)
        assert a.max() <= p.limits[1] <= capacity and e.max() <= p.limits[2]
        assert p.limits[0] == p.limits[1]  # the cost is the atoms here
        again = pack_even_dims(atoms, np.column_stack([atoms, edges]), capacity, 2, seed=seed)
        assert again.checksum() == p.checksum()  # deterministic: every rank computes the same plan


def test_joint_bins_pad_both_sizes_less_than_bins_even_in_atoms_or_in_edges_alone():
    atoms, edges = mixed_density_set()
    capacity = 8 * atoms.mean()
    joint = pack_even_dims(atoms, np.column_stack([atoms, edges]), capacity, 2, seed=0)
    ja, je = worst_pad(joint, atoms, edges, joint.limits[1:])
    by_atoms = worst_pad(pack_even(atoms, capacity, 2, seed=0), atoms, edges)
    by_edges = worst_pad(pack_even(edges, 8 * edges.mean(), 2, seed=0), atoms, edges)
    assert max(ja, je) <= 0.05
    assert by_atoms[1] > 2 * max(ja, je) and by_edges[0] > 2 * max(ja, je)


def test_bins_full_to_the_capacity_fall_back_to_bins_even_in_the_cost():
    atoms = np.full(64, 100)
    edges = np.arange(64) * 50 + 1
    p = pack_even_dims(atoms, np.column_stack([atoms, edges]), 400, 2, seed=0)
    assert p.limits is None and len(p) == 16  # four structures fill a bin exactly: nothing can move
    assert sorted(p.indices.tolist()) == list(range(64))


def test_bad_dims_name_the_sample():
    with pytest.raises(ValueError, match="sample 2 has sizes"):
        check_dims(np.array([[1, 2], [3, 4], [5, -1]]), 3)
    with pytest.raises(ValueError, match="one row of sizes per sample"):
        check_dims(np.zeros((2, 2)), 3)
