"""Loss weighting from the plan: per_sample makes every graph and atom weigh the same over an epoch.

These tests check the arithmetic against plans of the packer; the real mace loss under two real
ranks is checked in tests/adapters/mace/test_weighting.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.workload import paper_mix
from cfm_plugins.sampler import BinPackBatchSampler, pack
from cfm_plugins.sampler.packing import packing_from_bins
from cfm_plugins.sampler.weighting import (
    denominators,
    epoch_weights,
    per_sample_scales,
    weight_spread,
)


@pytest.fixture(scope="module")
def atoms():
    return paper_mix(2000, seed=5)  # 1..768 atoms: the spread that makes weighting matter


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("reduction", ["step", "batch"])
def test_per_sample_gives_every_graph_and_atom_the_same_epoch_weight(atoms, world_size, reduction):
    plan = pack(atoms, 4000, world_size, seed=3)
    steps = plan.num_steps()
    graph_w, atom_w = epoch_weights(
        plan, atoms, reduction, per_sample_scales(plan, atoms, reduction)
    )
    # every graph weighs S / N in the graph terms, every atom S / A in the atom terms
    np.testing.assert_allclose(graph_w, steps / len(atoms), rtol=1e-12)
    np.testing.assert_allclose(atom_w, steps / atoms.sum(), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["step", "batch"])
def test_stock_weighting_under_binpack_favours_large_graphs(atoms, reduction):
    """The bias the weighting removes: with token batches the trainer's per-batch mean gives a
    graph of a sparsely populated batch (a large one) far more weight than a small one."""
    plan = pack(atoms, 4000, 2, seed=3)
    graph_w, atom_w = epoch_weights(plan, atoms, reduction)
    big, small = atoms >= np.quantile(atoms, 0.9), atoms <= np.quantile(atoms, 0.1)
    assert graph_w[big].mean() > 1.5 * graph_w[small].mean()
    spread_g, spread_a = weight_spread(plan, atoms, reduction)
    assert spread_g > 2.5
    # atoms: every step holds about the capacity, so per-atom weights are nearly equal already
    assert spread_a < 1.1


def test_fixed_graph_count_batches_need_no_scaling():
    """Stock batching (the same number of graphs in every batch) already weighs every graph alike:
    its per_sample graph factors are exactly 1."""
    rng = np.random.default_rng(0)
    atoms = rng.integers(1, 300, 48)
    bins = [np.arange(i, i + 4) for i in range(0, 48, 4)]  # 12 batches of 4 graphs, 2 ranks
    plan = packing_from_bins(bins, 2)
    for reduction in ("step", "batch"):
        np.testing.assert_allclose(per_sample_scales(plan, atoms, reduction)[:, 0], 1.0, rtol=1e-14)
        graph_w, _ = epoch_weights(plan, atoms, reduction)
        np.testing.assert_allclose(graph_w, graph_w[0], rtol=1e-14)


def test_denominators_are_what_the_trainer_divides_by():
    atoms = np.array([10, 1, 2, 3, 100, 5])
    plan = packing_from_bins([[0, 1], [2, 3, 5], [4], [1]], 2)  # step 0: bins 0,1; step 1: bins 2,3
    np.testing.assert_array_equal(
        denominators(plan, atoms, "step"), [[5, 21], [5, 21], [2, 101], [2, 101]]
    )
    np.testing.assert_array_equal(
        denominators(plan, atoms, "batch"), [[4, 22], [6, 20], [2, 200], [2, 2]]
    )


def test_input_errors_name_the_problem():
    plan = packing_from_bins([[0, 1], [2]], 2)
    with pytest.raises(ValueError, match="one atom count per sample"):
        per_sample_scales(plan, [3, 4], "step")
    with pytest.raises(ValueError, match="sample 1 has 0 atoms"):
        per_sample_scales(plan, [3, 0, 2], "step")
    with pytest.raises(ValueError, match="reduction='mean'"):
        per_sample_scales(plan, [3, 1, 2], "mean")
    with pytest.raises(ValueError, match=r"expected \(2, 2\)"):
        epoch_weights(plan, [3, 1, 2], "step", np.ones((3, 2)))


def test_sampler_gives_each_yielded_batch_its_scale_in_order(atoms):
    """Over a DataLoader-like pass, next_loss_scale follows the yielded batches; the scales of
    rank 0 and 1 together give equal per-graph and per-atom weights."""
    per_rank = []
    for rank in (0, 1):
        s = BinPackBatchSampler(
            atoms, 4000, rank=rank, world_size=2, seed=1, atoms=atoms, loss_weighting="per_sample"
        )
        s.set_epoch(2)
        got = []
        for batch in s:
            scale = s.next_loss_scale("step")
            got.append((batch, scale.graphs, scale.atoms))
        with pytest.raises(RuntimeError, match="no batch was yielded"):
            s.next_loss_scale("step")
        per_rank.append(got)
    graph_w, atom_w = np.zeros(len(atoms)), np.zeros(len(atoms))
    for step in zip(*per_rank):
        n_graphs = sum(len(b) for b, _, _ in step)  # mace's step-wide means over both ranks
        n_atoms = sum(atoms[b].sum() for b, _, _ in step)
        for b, g, a in step:
            graph_w[b] += g / n_graphs
            atom_w[b] += a / n_atoms
    np.testing.assert_allclose(graph_w, graph_w[0], rtol=1e-12)
    np.testing.assert_allclose(atom_w, atom_w[0], rtol=1e-12)


def test_sampler_stock_weighting_scales_are_one_and_per_sample_needs_atoms(atoms):
    s = BinPackBatchSampler(atoms, 4000, rank=0, world_size=2, seed=1)
    assert s.loss_weighting == "stock"
    np.testing.assert_array_equal(s.loss_scales("batch"), 1.0)
    with pytest.raises(ValueError, match="needs the atom count"):
        BinPackBatchSampler(atoms, 4000, rank=0, world_size=2, loss_weighting="per_sample")
    with pytest.raises(ValueError, match="expected one of stock, per_sample"):
        BinPackBatchSampler(atoms, 4000, rank=0, world_size=2, atoms=atoms, loss_weighting="mean")


def test_an_abandoned_pass_leaves_no_stale_scale(atoms):
    s = BinPackBatchSampler(
        atoms, 4000, rank=0, world_size=2, seed=1, atoms=atoms, loss_weighting="per_sample"
    )
    it = iter(s)
    next(it), next(it)  # two batches yielded, their scales never taken
    first = next(iter(s))  # a new pass of the same epoch
    assert first is not None
    expected = s.loss_scales("step")[0]  # step 0, rank 0: bin 0
    scale = s.next_loss_scale("step")
    assert (scale.graphs, scale.atoms) == tuple(expected)
