"""The static plugin's budget hook: binpack packs even bins for padded batches, so that the padding
stays a few percent of the atoms at binpack's default capacity, and the budget covers every bin."""

from __future__ import annotations

from benchmarks.static_shapes import cuni_sizes
from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.graph_sizes import GraphSizes
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from cfm_plugins.static_shapes.budget import bin_sizes, padding_overhead


def test_padded_budget_of_the_example_cuni_set_at_the_default_capacity_pads_under_three_percent():
    atoms, edges = cuni_sizes(
        100
    )  # the CuNi example structures (1..~340 atoms), edges at r_max 5 A
    config = Config(enabled=["binpack", "static"], options={})
    pm = create_manager(config)
    dist = DistInfo(rank=0, world_size=2)
    sampler = pm.hook.cfm_batch_sampler(
        dataset=None,
        sizes=GraphSizes(atoms, edges),
        config=config,
        dist=dist,
        role="train",
        trainer=TrainerSettings(batch_size=4, seed=0),
    )
    steps = len(sampler)
    full_plan_pad = bin_sizes(sampler.plan(), atoms, edges)[0]
    tracker = pm.hook.cfm_batch_budget(
        batch_sampler=sampler,
        sizes=GraphSizes(atoms, edges),
        config=config,
        dist=dist,
        role="train",
    )
    assert sampler.even and len(sampler) == steps  # as many steps as the full bins
    budget = tracker.budget
    assert budget.atoms - 1 <= sampler.capacity
    plans = [sampler.packing_of_epoch(e) for e in range(config.get("budget_epochs"))]
    for p in plans:
        for a, e, g in zip(*bin_sizes(p, atoms, edges)):
            assert budget.fits(int(a), int(e), int(g))
    assert padding_overhead(plans, atoms, edges, budget).atoms <= 0.03
    # the plain plan (full bins and light ones) would pad the light ones up to the capacity
    assert (sampler.capacity + 1) * len(full_plan_pad) / full_plan_pad.sum() - 1 > 0.03


def test_bins_packed_by_edges_give_a_tight_edge_budget_and_cover_the_atoms():
    """cost=edges (what MACE's per-edge work wants): the edge budget is the capacity the even bins
    were dealt to, a few percent over their mean; atoms come from the fullest bin with headroom."""
    atoms, edges = cuni_sizes(100)
    config = Config(enabled=["binpack", "static"], options={"cost": "edges"})
    pm = create_manager(config)
    dist = DistInfo(rank=0, world_size=2)
    sizes = GraphSizes(atoms, edges)
    sampler = pm.hook.cfm_batch_sampler(
        dataset=None,
        sizes=sizes,
        config=config,
        dist=dist,
        role="train",
        trainer=TrainerSettings(batch_size=4, seed=0),
    )
    budget = pm.hook.cfm_batch_budget(
        batch_sampler=sampler, sizes=sizes, config=config, dist=dist, role="train"
    ).budget
    plans = [sampler.packing_of_epoch(e) for e in range(config.get("budget_epochs"))]
    for p in plans:
        assert all(
            budget.fits(int(a), int(e), int(g)) for a, e, g in zip(*bin_sizes(p, atoms, edges))
        )
    assert (
        budget.edges <= max(p.capacity for p in plans) + 64
    )  # the dealt capacity, rounded up to 64 edges
    assert padding_overhead(plans, atoms, edges, budget).edges <= 0.03


def small_diverse_set(n: int = 24, seed: int = 0):
    """n structures of 4 to 140 atoms, about 12 edges per atom (a small, size-diverse set)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    atoms = np.concatenate([[4, 140], rng.integers(4, 141, n - 2)])
    return atoms, atoms * rng.integers(8, 16, n)


def budget_of(atoms, edges, options, world_size=2, batch_size=3):
    config = Config(enabled=["binpack", "static"], options={"device": "cpu", **options})
    pm = create_manager(config)
    dist = DistInfo(rank=0, world_size=world_size)
    sizes = GraphSizes(atoms, edges)
    sampler = pm.hook.cfm_batch_sampler(
        dataset=None,
        sizes=sizes,
        config=config,
        dist=dist,
        role="train",
        trainer=TrainerSettings(batch_size=batch_size, seed=0),
    )
    for _ in range(2):  # mace builds its training loader twice: said once
        tracker = pm.hook.cfm_batch_budget(
            batch_sampler=sampler, sizes=sizes, config=config, dist=dist, role="train"
        )
    return tracker, sampler


def test_heavy_padding_is_a_warning_saying_what_lowers_it(caplog):
    """24 structures of 4-140 atoms, batch size 3, 2 ranks: every batch padded to the largest
    structure, a third of the atoms padding, which was said only as an INFO line."""
    import logging

    caplog.set_level(logging.INFO, logger="cfm_plugins")
    atoms, edges = small_diverse_set()
    tracker, sampler = budget_of(atoms, edges, {})
    plans = [sampler.packing_of_epoch(e) for e in range(3)]
    pad = padding_overhead(plans, atoms, edges, tracker.budget)
    assert pad.atoms > 0.10
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum("static shapes (train): every batch padded to" in m for m in infos) == 1, infos
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert f"the padding is {100 * pad.atoms:.0f}% of the atoms" in warned[0], warned
    for remedy in ("A larger max_tokens", "or fewer ranks (now 2)", "leaving static off"):
        assert remedy in warned[0], warned
    # more structures per batch: the padding falls under the limit and nothing is warned
    caplog.clear()
    tracker, sampler = budget_of(atoms, edges, {"max_tokens": str(12 * atoms.max())})
    plans = [sampler.packing_of_epoch(e) for e in range(3)]
    pad = padding_overhead(plans, atoms, edges, tracker.budget)
    assert pad.atoms <= 0.10 and pad.edges <= 0.25, pad
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
