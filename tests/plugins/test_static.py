"""The static plugin's budget hook: binpack packs even bins for padded batches, so that the padding
stays a few percent of the atoms at binpack's default capacity, and the budget covers every bin."""

from __future__ import annotations

from benchmarks.static_shapes import cuni_sizes
from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from cfm_plugins.sizes import GraphSizes
from cfm_plugins.static.budget import bin_sizes, padding_overhead


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
