"""The plan of one epoch (``cfm_plugins.plan.planning``): binpack's bins are the training sampler's
own, the trainer's own batches are ``DistributedSampler``'s, and the figures are the sampler
report's."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cfm_plugins.plan.planning import (
    PlanOptions,
    binpack_plan,
    distributed_orders,
    make_plan,
    memory_check,
    packing_costs,
)
from cfm_plugins.plugins.binpack import default_capacity
from cfm_plugins.sampler import BinPackBatchSampler, balance_report, fixed_count_batches


@pytest.mark.parametrize(
    "n,ranks,seed,drop_last",
    [(103, 4, 0, True), (103, 4, 3, False), (5, 8, 1, False), (64, 8, 2, True), (7, 7, 5, True)],
)
def test_distributed_orders_are_distributed_samplers(n, ranks, seed, drop_last):
    from torch.utils.data.distributed import DistributedSampler

    want = []
    for r in range(ranks):
        s = DistributedSampler(
            range(n), num_replicas=ranks, rank=r, shuffle=True, seed=seed, drop_last=drop_last
        )
        s.set_epoch(0)
        want.append(list(s))
    got = distributed_orders(n, ranks, seed, drop_last)
    assert got.tolist() == want


def test_binpack_plan_is_the_training_samplers():
    rng = np.random.default_rng(0)
    atoms = rng.integers(1, 200, 500)
    opts = PlanOptions(batch_size=6, seed=3, epoch=2, device="cuda", dtype="float32")
    costs, capacity, rule = packing_costs(atoms, None, opts)
    assert capacity == default_capacity(atoms.mean(), atoms.max(), 6, "cuda", "float32") == 800
    assert "clamped" in rule
    sampler = BinPackBatchSampler(costs, capacity, rank=1, world_size=4, seed=3, repeat=True)
    sampler.set_epoch(2)
    plan = binpack_plan(costs, capacity, 4, opts)
    assert plan.checksum() == sampler.plan().checksum()
    assert [sorted(b) for b in plan.rank_bins(1)] == [sorted(b) for b in sampler]


def test_a_saved_fit_packs_as_cost_auto_does():
    from cfm_plugins.sampler.autocost import StepCost, fitted_costs

    rng = np.random.default_rng(1)
    atoms = rng.integers(1, 100, 300).astype(float)
    edges = atoms * rng.uniform(5, 40, 300)
    fit = StepCost(c0=0.01, a=1e-4, b=2e-5, g=1e-3)
    opts = PlanOptions(batch_size=4, cost="fit", fit=fit, device="cpu")
    costs, capacity, _ = packing_costs(atoms, edges, opts)
    initial_capacity = default_capacity(atoms.mean(), atoms.max(), 4)
    np.testing.assert_allclose(costs, fitted_costs(fit, atoms, edges, atoms))
    assert capacity == max(initial_capacity, costs.max())


def test_make_plan_figures():
    rng = np.random.default_rng(2)
    atoms = rng.integers(1, 300, 2000)
    opts = PlanOptions(batch_size=8, seed=0, device="cpu", seeds=3)
    out = make_plan(atoms, None, [2, 16], opts)
    costs, capacity, _ = packing_costs(atoms, None, opts)
    for r in out["results"]:
        w = r["ranks"]
        plan = binpack_plan(costs, capacity, w, opts)
        rep = balance_report(plan, costs, capacity, w)
        assert r["binpack"]["steps"] == rep.num_steps and r["binpack"]["lif"] == rep.lif
        assert r["stock"]["steps"] == math.ceil((2000 // w) / 8)
        assert r["stock"]["dropped"] == 2000 % w and r["stock"]["orders"] == 3
        fixed = fixed_count_batches(distributed_orders(2000, w, 0, True), 8)
        assert r["stock"]["lif_min"] <= balance_report(fixed, costs, capacity, w).lif
        assert r["stock"]["lif"] > r["binpack"]["lif"]
        assert "speedup" not in r  # no step-time model


def test_make_plan_with_a_step_time_and_an_allreduce():
    from cfm_plugins.sampler.autocost import StepCost

    atoms = np.random.default_rng(3).integers(1, 300, 3000)
    model = StepCost(c0=0.03, a=2e-5, b=0.0, g=0.0)
    opts = PlanOptions(batch_size=8, device="cuda", dtype="float32", max_tokens=3072, seeds=2)
    out = make_plan(atoms, None, [4, 8], opts, model, allreduce=lambda w: 1e-3)
    for r in out["results"]:
        b = r["binpack"]
        assert b["epoch_s"] == pytest.approx(b["compute_s"] + b["steps"] * 1e-3)
        assert r["speedup"] == pytest.approx(r["stock"]["epoch_s"] / b["epoch_s"])
    assert set(out["efficiency"]["binpack"]) == {4, 8} and out["efficiency"]["binpack"][4] == 1.0


def test_the_memory_range_of_the_paper():
    assert memory_check(3000, 3072, "cuda", "float32", "atoms") is None
    assert "above the 2000 atoms" in memory_check(3000, 3072, "cuda", "float64", "atoms")
    assert "below the 800 atoms" in memory_check(500, 500, "cuda", "float32", "atoms")
    assert memory_check(3000, 3072, "cpu", "float64", "atoms") is None


def test_under_cost_atoms_binpack_plans_its_steps_even_in_the_edges_as_the_sampler_does():
    rng = np.random.default_rng(5)
    atoms = rng.integers(1, 200, 800)
    edges = atoms * rng.integers(4, 60, 800)
    opts = PlanOptions(batch_size=6, seed=3, epoch=1, device="cpu")
    costs, capacity, _ = packing_costs(atoms, edges, opts)
    sampler = BinPackBatchSampler(
        costs, capacity, rank=0, world_size=4, seed=3, repeat=True, step_sizes=edges
    )
    sampler.set_epoch(1)
    plan = binpack_plan(costs, capacity, 4, opts, edges)
    assert plan.checksum() == sampler.plan().checksum()
    by_cost = binpack_plan(
        costs, capacity, 4, PlanOptions(**{**vars(opts), "step_balance": "cost"}), edges
    )
    assert by_cost.checksum() == binpack_plan(costs, capacity, 4, opts).checksum()  # no edges
    assert by_cost.checksum() != plan.checksum()
    # cost=edges: the cost holds the edges already; no step sizes
    e_opts = PlanOptions(batch_size=6, seed=3, epoch=1, device="cpu", cost="edges")
    e_costs, e_cap, _ = packing_costs(atoms, edges, e_opts)
    assert binpack_plan(e_costs, e_cap, 4, e_opts, edges).checksum() == (
        binpack_plan(e_costs, e_cap, 4, e_opts).checksum()
    )
    # make_plan's binpack row is this plan
    out = make_plan(atoms, edges, [4], opts)
    rep = balance_report(plan, costs, capacity, 4)
    assert out["results"][0]["binpack"]["lif"] == rep.lif
