"""The models of the peers' samplers (``cfm_plugins.plan.peer_samplers``) on small cases: every
structure once or the peer's documented repeats and drops (counted), the peer's batch counts, and
the same batches as the peers' own classes where they import (torch's ``DistributedSampler`` here;
fairchem's where fairchem-core is installed; HydraGNN's in ``test_peer_samplers_hydragnn.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cfm_plugins.plan.peer_samplers import (
    PEERS,
    distributed_fixed,
    fairchem_max_atoms,
    hydragnn_cost_aware,
    metatrain_max_atoms,
    next_fit,
)


def sizes(n=97, seed=0, hi=60):
    return np.random.default_rng(seed).integers(1, hi, n)


def per_rank(p, w):
    """Rank ``r``'s batches, step after step, as lists."""
    return [[p[s * w + r].tolist() for s in range(p.num_steps(w))] for r in range(w)]


def seen(p, n):
    return np.bincount(p.indices, minlength=n)


def test_next_fit_by_hand():
    starts, ends = next_fit([5, 3, 2, 7, 1, 9, 4], 8)
    # [5,3] full, 2 then 7 does not fit, [7,1], 9 alone (over the budget), [4]
    assert list(zip(starts.tolist(), ends.tolist())) == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]
    starts, ends = next_fit([1, 1, 1, 1, 1], 10, max_graphs=2)
    assert (ends - starts).tolist() == [2, 2, 1]


@pytest.mark.parametrize("w", [1, 2, 5])
def test_distributed_fixed_is_torchs_distributed_sampler_and_loader(w):
    import torch
    from torch.utils.data import BatchSampler, DistributedSampler

    c = sizes()
    for drop_last in (False, True):
        p = distributed_fixed(c, None, w, seed=3, epoch=2, batch_size=4, drop_last=drop_last)
        want = []
        for r in range(w):
            s = DistributedSampler(
                torch.arange(len(c)), num_replicas=w, rank=r, seed=3, drop_last=drop_last
            )
            s.set_epoch(2)
            want.append([list(b) for b in BatchSampler(s, 4, drop_last=False)])
        assert per_rank(p, w) == want
        n = len(c)
        got = seen(p, n)
        if drop_last:  # the last n % w of the order left out
            assert (got == 0).sum() == n % w and got.max() == 1
        else:  # the start of the order repeated to fill the last step
            assert (got == 0).sum() == 0 and got.sum() - n == -n % w


@pytest.mark.parametrize("w", [1, 3, 8])
def test_hydragnn_packs_next_fit_pads_with_batches_and_deals_sorted_steps(w):
    import torch

    c = sizes(200, seed=w)
    cap = 150
    p = hydragnn_cost_aware(c, cap, w, seed=1, epoch=2)
    order = torch.randperm(len(c), generator=torch.Generator().manual_seed(3)).numpy()
    starts, ends = next_fit(c[order], cap)
    batches = [tuple(order[i:j].tolist()) for i, j in zip(starts, ends)]
    b = len(batches)
    assert p.num_steps(w) == math.ceil(b / w)  # HydraGNN's __len__
    got = [tuple(x.tolist()) for x in p]
    assert set(got) == set(batches)
    # padding: the first batches of the packing repeated, the fewest that fill the last step
    extra = [x for x in batches if got.count(x) > 1]
    assert extra == batches[: -b % w] and all(got.count(x) == 2 for x in extra)
    assert seen(p, len(c)).sum() == len(c) + sum(len(x) for x in extra)
    bc = p.bin_costs(c)
    assert bc.max() <= cap
    # steps of neighbours in cost order: no batch of a step is cheaper than any of a cheaper step
    steps = np.sort(bc.reshape(-1, w), axis=1)
    steps = steps[np.argsort(steps[:, 0], kind="stable")]
    assert (steps[1:, 0] >= steps[:-1, -1]).all()


def test_hydragnn_rotates_the_rank_of_each_steps_members():
    c = np.array([10, 20, 30, 40, 50, 60, 70, 80])
    p = hydragnn_cost_aware(c, 10_000, 2, shuffle=False, max_graphs=1)
    # batches sorted by cost: steps (10,20), (30,40), ...; rank r takes member (r + step) % 2
    assert p.bin_costs(c).tolist() == [10, 20, 40, 30, 50, 60, 80, 70]


def test_hydragnn_oversized_policies():
    c = np.array([5, 50, 5, 5])
    with pytest.raises(ValueError, match="sample 1 has cost 50, exceeding max_cost 20"):
        hydragnn_cost_aware(c, 20, 1, shuffle=False)
    single = hydragnn_cost_aware(c, 20, 1, shuffle=False, oversized_sample="single")
    assert sorted(x.tolist() for x in single) == [[0], [1], [2, 3]]
    skip = hydragnn_cost_aware(c, 20, 1, shuffle=False, oversized_sample="skip")
    assert seen(skip, 4).tolist() == [1, 0, 1, 1]
    cut = hydragnn_cost_aware([5] * 10, 10, 3, shuffle=False, pad_batches=False)
    assert len(cut) == 3 and seen(cut, 10).sum() == 6  # 5 batches, the last 2 dropped


@pytest.mark.parametrize("w", [1, 2, 7])
def test_fairchem_packs_once_and_deals_a_shuffled_batch_order(w):
    c = sizes(150, seed=w)
    c[[3, 40]] = 200  # over the budget: dropped, not batched
    cap = 120
    p = fairchem_max_atoms(c, cap, w, seed=4, epoch=1)
    order = np.random.default_rng(4).permutation(len(c))
    order = order[c[order] <= cap]
    starts, ends = next_fit(c[order], cap)
    batches = {tuple(order[i:j].tolist()) for i, j in zip(starts, ends)}
    b = len(batches)
    assert p.num_steps(w) == math.ceil(b / w)
    assert {tuple(x.tolist()) for x in p} == batches  # the same batches, only their order dealt
    counts = seen(p, len(c))
    assert counts[[3, 40]].tolist() == [0, 0] and (np.delete(counts, [3, 40]) >= 1).all()
    assert len(p) - b == -b % w  # whole batches repeated from the start of the order
    other = fairchem_max_atoms(c, cap, w, seed=4, epoch=2)
    assert {tuple(x.tolist()) for x in other} == batches  # packed once: epochs reorder only
    cut = fairchem_max_atoms(c, cap, w, seed=4, epoch=1, drop_last=True)
    assert cut.num_steps(w) == b // w


def test_fairchem_refuses_fewer_batches_than_ranks_and_drops_small_batches():
    with pytest.raises(ValueError, match="less batches than ranks"):
        fairchem_max_atoms([10] * 6, 30, 4)
    c = sizes(60, seed=5, hi=25)
    p = fairchem_max_atoms(c, 40, 1, shuffle=False, min_atoms=30)
    order = np.random.default_rng(0).permutation(len(c))
    starts, ends = next_fit(c[order], 40)
    small = [order[i:j] for i, j in zip(starts, ends) if c[order[i:j]].sum() < 30]
    assert small  # batches under min_atoms are dropped with their structures
    dropped = np.sort(np.concatenate(small))
    assert np.flatnonzero(seen(p, len(c)) == 0).tolist() == dropped.tolist()
    assert p.bin_costs(c).min() >= 30


def test_metatrain_is_fairchems_port_with_fixed_packing_and_epoch_seeded_order():
    c = sizes(300, seed=9)
    for w in (1, 4):
        assert per_rank(metatrain_max_atoms(c, 150, w), w) == per_rank(
            fairchem_max_atoms(c, 150, w), w
        )
        a = metatrain_max_atoms(c, 150, w, seed=5, epoch=3)
        b = metatrain_max_atoms(c, 150, w, seed=0, epoch=3)
        assert per_rank(a, w) == per_rank(b, w)  # the seed changes nothing
        e = metatrain_max_atoms(c, 150, w, seed=0, epoch=4)
        assert {tuple(x.tolist()) for x in e} == {tuple(x.tolist()) for x in b}
        assert per_rank(e, w) != per_rank(b, w)
    with pytest.raises(ValueError, match="only 2 batches were packed but num_replicas=3"):
        metatrain_max_atoms([10] * 4, 20, 3)


@pytest.mark.parametrize("name", list(PEERS))
def test_every_model_places_each_structure_once_on_one_rank(name):
    c = sizes(240, seed=1)
    p = PEERS[name](c, 400, 1, seed=2)
    assert seen(p, len(c)).tolist() == [1] * len(c)


def test_the_models_match_fairchems_own_sampler():
    pytest.importorskip(
        "fairchem.core.datasets.samplers.max_atom_distributed_sampler",
        reason="fairchem-core is not installed (pip install 'cfm-plugins[fairchem]' in an "
        "environment without mace-torch: fairchem-core needs e3nn >= 0.5, mace-torch pins 0.4.4)",
    )
    from fairchem.core.datasets.samplers.max_atom_distributed_sampler import (
        MaxAtomDistributedBatchSampler,
    )

    class Sizes:
        def __init__(self, n):
            self.n = np.asarray(n)

        def __len__(self):
            return len(self.n)

        def get_metadata(self, key, idx):
            return self.n[idx]

    rng = np.random.default_rng(3)
    for case in range(12):
        c = rng.integers(1, 60, int(rng.integers(40, 300)))
        w, cap, seed, epoch = (
            int(rng.integers(1, 6)),
            int(rng.integers(70, 300)),
            case % 4,
            case % 3,
        )
        drop_last, min_atoms = case % 2 == 0, 30 if case % 3 == 0 else 0
        c[int(rng.integers(len(c)))] = cap + 1
        want = []
        for r in range(w):
            s = MaxAtomDistributedBatchSampler(
                Sizes(c), cap, w, r, seed, drop_last=drop_last, min_atoms=min_atoms
            )
            s.set_epoch_and_start_iteration(epoch, 0)
            want.append([[int(i) for i in b] for b in s])
        p = fairchem_max_atoms(
            c, cap, w, seed=seed, epoch=epoch, drop_last=drop_last, min_atoms=min_atoms
        )
        assert per_rank(p, w) == want, case
