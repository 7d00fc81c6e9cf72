"""Budgets of padded batches from bin-packing plans (numpy only)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cfm_plugins.sampler import pack
from cfm_plugins.static_shapes.budget import (
    EDGE_MULTIPLE,
    Budget,
    BudgetTracker,
    bin_sizes,
    budget_for,
    budget_from_plan,
    padding_overhead,
)


def sizes(n=500, seed=0):
    rng = np.random.default_rng(seed)
    atoms = rng.integers(1, 120, n)
    edges = atoms * rng.integers(10, 40, n)  # edges per atom vary between structures
    return atoms, edges


def test_budget_covers_every_bin_of_the_plans_with_one_pad_atom_and_one_pad_graph():
    atoms, edges = sizes()
    plans = [pack(atoms, 600, 2, seed=e) for e in range(3)]
    b = budget_from_plan(plans, atoms, edges, capacity_atoms=600, headroom=0.05)
    assert b.atoms == 601  # the capacity (no bin exceeds it) plus the pad atom
    for p in plans:
        a, e, g = bin_sizes(p, atoms, edges)
        assert a.max() <= 600 and b.fits(int(a.max()), int(e.max()), int(g.max()))
        assert all(b.fits(int(x), int(y), int(z)) for x, y, z in zip(a, e, g))
    worst_e = max(int(bin_sizes(p, atoms, edges)[1].max()) for p in plans)
    assert (
        worst_e * 1.05 <= b.edges < worst_e * 1.05 + EDGE_MULTIPLE and b.edges % EDGE_MULTIPLE == 0
    )
    worst_g = max(int(bin_sizes(p, atoms, edges)[2].max()) for p in plans)
    assert b.graphs == int(np.ceil(worst_g * 1.05)) + 1


def test_bin_sizes_count_what_the_bins_hold():
    atoms, edges = np.array([3, 5, 7, 2]), np.array([10, 20, 30, 5])
    p = pack(atoms, 10, 1)
    a, e, g = bin_sizes(p, atoms, edges)
    assert a.sum() == 17 and e.sum() == 65 and g.sum() == 4
    for b in range(len(p)):
        assert a[b] == atoms[p[b]].sum() and e[b] == edges[p[b]].sum() and g[b] == len(p[b])


def test_budget_by_another_cost_takes_atoms_from_the_bins():
    atoms, edges = sizes()
    p = pack(edges, 8000, 2, seed=1)
    b = budget_from_plan(p, atoms, edges, capacity_atoms=None, headroom=0.1)
    a, _, _ = bin_sizes(p, atoms, edges)
    assert b.atoms == int(np.ceil(a.max() * 1.1)) + 1


def test_padding_overhead_counts_pad_atoms_and_edges():
    atoms, edges = np.array([4, 4, 4, 4]), np.array([40, 40, 40, 40])
    p = pack(atoms, 8, 2)  # two full bins of 8 atoms / 80 edges
    b = Budget(atoms=9, edges=128, graphs=3)
    o = padding_overhead(p, atoms, edges, b)
    assert o.batches == 2
    assert o.atoms == pytest.approx(2 / 16) and o.edges == pytest.approx((256 - 160) / 160)


def test_paper_mix_pads_under_three_percent_of_atoms():
    from benchmarks.workload import paper_mix

    atoms = paper_mix(20000, seed=0)
    p = pack(atoms, 3072, 8, seed=0)
    b = budget_from_plan(p, atoms, atoms, capacity_atoms=3072)
    assert padding_overhead(p, atoms, atoms, b).atoms <= 0.03


def test_tracker_raises_the_budget_once_for_a_batch_that_does_not_fit(caplog):
    t = BudgetTracker(Budget(atoms=101, edges=1024, graphs=5), headroom=0.1, name="train")
    assert (
        t.fit(100, 1024, 4) is t.budget and t.raises == 0
    )  # exactly full still fits (one pad atom, one pad graph)
    with caplog.at_level(logging.INFO, logger="cfm_plugins.static_shapes"):
        new = t.fit(90, 2000, 4)
    assert t.raises == 1 and new.edges >= 2200 and new.atoms == 101 and new.graphs == 5
    assert (
        "over the budget" in caplog.text and "2000 edges" in caplog.text and "train" in caplog.text
    )
    assert (
        t.fit(90, 2000, 4) is new and t.raises == 1
    )  # the raised budget holds it: no second raise
    bigger = t.fit(150, 100, 9)
    assert bigger.fits(150, 100, 9) and bigger.edges == new.edges and t.raises == 2


def test_budget_refuses_nonsense_and_padding_refuses_an_overfull_batch():
    with pytest.raises(ValueError, match="graphs"):
        Budget(atoms=10, edges=10, graphs=1)
    with pytest.raises(ValueError, match="does not fit"):
        Budget(atoms=10, edges=10, graphs=2).padding(10, 5, 1)
    assert Budget(atoms=10, edges=10, graphs=3).padding(7, 4, 1) == (3, 6, 2)
    with pytest.raises(ValueError, match="headroom"):
        budget_for(10, 10, 1, headroom=-1)
