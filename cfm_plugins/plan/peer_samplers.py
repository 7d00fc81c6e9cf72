"""Models of the other trainers' batch samplers, for ``cfm-plan --compare`` and the benchmark.

Each gives, as a :class:`~cfm_plugins.sampler.Packing` in binpack's step convention (bin
``s*W + r`` is rank ``r``'s batch of step ``s``), the batches the peer's sampler yields on every
rank for the same sizes, budget, seed and epoch. Where the peer shuffles with torch's generator
the model calls the same ``torch.randperm``, so the batches match exactly
(``tests/plan/test_peer_samplers*.py`` check them against the peers' own classes where those
import); the rest is numpy.

- :func:`distributed_fixed`: torch's ``DistributedSampler`` cut into batches of a fixed size;
- :func:`hydragnn_cost_aware`: HydraGNN's ``DistributedCostAwareBatchSampler``;
- :func:`fairchem_max_atoms`, :func:`metatrain_max_atoms`: ``MaxAtomDistributedBatchSampler``.

The MACE paper's Algorithm 1 is binpack itself (:func:`cfm_plugins.sampler.pack`).
"""

from __future__ import annotations

import math

import numpy as np

from cfm_plugins.sampler import Packing, fixed_count_batches
from cfm_plugins.sampler.bins import offsets_from_counts


def _torch_perm(n: int, seed: int) -> np.ndarray:
    """``torch.randperm(n)`` from a fresh ``torch.Generator().manual_seed(seed)``, as numpy."""
    import torch

    g = torch.Generator()
    g.manual_seed(int(seed))
    return torch.randperm(int(n), generator=g).numpy().astype(np.int64)


def _atoms(costs) -> np.ndarray:
    """The peers' integer costs (atom counts)."""
    c = np.asarray(costs)
    if c.ndim != 1 or (len(c) and (not np.isfinite(c).all() or c.min() <= 0)):
        raise ValueError("costs must be a vector of positive atom counts")
    return np.rint(c).astype(np.int64)


def next_fit(costs, budget: float, max_graphs: int | None = None):
    """Next-fit packing of ``costs`` in the order given: a batch takes the next structure while
    its total stays <= ``budget`` (and it holds fewer than ``max_graphs``), else a new batch
    starts; a structure over the budget is a batch of its own. Returns ``(starts, ends)``: batch
    ``k`` is positions ``starts[k]:ends[k]``."""
    c = np.asarray(costs, dtype=np.float64)
    n = len(c)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cs = np.concatenate([[0.0], np.cumsum(c)])
    room = cs + budget  # a batch from i ends before the first j with cs[j] > cs[i] + budget
    starts, ends, i = [], [], 0
    while i < n:
        j = max(int(cs.searchsorted(room[i], side="right")) - 1, i + 1)
        if max_graphs is not None:
            j = min(j, i + int(max_graphs))
        starts.append(i)
        ends.append(j)
        i = j
    return np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)


def _gather(order: np.ndarray, starts, ends, picks, world_size: int) -> Packing:
    """The Packing whose bin ``b`` is batch ``picks[b]`` (positions ``starts:ends`` of
    ``order``)."""
    picks = np.asarray(picks, dtype=np.int64)
    st, ln = np.asarray(starts)[picks], (np.asarray(ends) - np.asarray(starts))[picks]
    offsets = offsets_from_counts(ln)
    pos = np.repeat(st - offsets[:-1], ln) + np.arange(offsets[-1])
    return Packing(order[pos], offsets, world_size=world_size)


def _empty(world_size: int) -> Packing:
    return Packing(np.zeros(0, np.int64), np.zeros(1, np.int64), world_size=world_size)


def distributed_fixed(
    costs,
    capacity=None,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    *,
    batch_size: int = 8,
    drop_last: bool = False,
    loader_drop_last: bool = False,
) -> Packing:
    """torch's ``DistributedSampler(shuffle=True, seed=seed, drop_last=drop_last)`` at ``epoch``
    with ``DataLoader(batch_size=batch_size, drop_last=loader_drop_last)`` on every rank (mace,
    HydraGNN without ``Batching``): :func:`cfm_plugins.plan.planning.distributed_orders` cut by
    :func:`cfm_plugins.sampler.fixed_count_batches`. ``capacity`` is not used. With
    ``drop_last=False`` the sampler repeats the start of its order to fill the last step."""
    from .planning import distributed_orders

    n, w = len(_atoms(costs)), int(world_size)
    per = math.ceil((n - w) / w) if drop_last and n % w else math.ceil(n / w)
    if per <= 0:
        return _empty(w)
    orders = distributed_orders(n, w, int(seed) + int(epoch), drop_last)
    return fixed_count_batches(orders, batch_size, loader_drop_last)


def hydragnn_cost_aware(
    costs,
    capacity,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    *,
    max_graphs: int | None = None,
    shuffle: bool = True,
    oversized_sample: str = "error",
    pad_batches: bool = True,
) -> Packing:
    """HydraGNN's ``DistributedCostAwareBatchSampler`` (ORNL/HydraGNN d251f81,
    ``hydragnn/preprocess/batch_sampler.py``; a config's ``Training: Batching: {mode:
    node_budget, max_nodes: capacity, ...}`` selects it in ``hydragnn/preprocess/load_data.py``).

    The structures in the order of ``torch.randperm`` seeded ``seed + epoch``, packed next-fit
    up to ``capacity`` nodes (and ``max_graphs``); ``oversized_sample``: ``error`` raises,
    ``single`` makes a batch of it alone, ``skip`` drops it. The batch count is padded to a
    multiple of the ranks by repeating batches from the first (``pad_batches``; else the last
    batches are dropped); the batches are sorted by cost (stably), cut into steps of one batch per
    rank, the steps shuffled by a second ``randperm`` of the same seed, and rank ``r`` takes
    member ``(r + step) % ranks`` of each step."""
    c = _atoms(costs)
    w, n, cap = int(world_size), len(c), int(capacity)
    order = _torch_perm(n, seed + epoch) if shuffle else np.arange(n, dtype=np.int64)
    over = c[order] > cap
    if over.any():
        if oversized_sample == "error":
            i = int(order[np.flatnonzero(over)[0]])
            raise ValueError(f"sample {i} has cost {int(c[i])}, exceeding max_cost {cap}")
        if oversized_sample == "skip":
            order = order[~over]
        elif oversized_sample != "single":
            raise ValueError("oversized_sample must be one of: error, single, skip")
    co = c[order]
    starts, ends = next_fit(co, cap, max_graphs)
    b = len(starts)
    ids = np.arange(b)
    if b % w:
        if pad_batches:
            ids = np.concatenate([ids, np.arange(w - b % w) % b])
        else:
            ids = ids[: b - b % w]
    if len(ids) == 0:
        return _empty(w)
    cs = np.concatenate([[0], np.cumsum(co)])
    cost = (cs[ends] - cs[starts])[ids]
    steps = ids[np.argsort(cost, kind="stable")].reshape(-1, w)
    if shuffle:
        steps = steps[_torch_perm(len(steps), seed + epoch)]
    rot = (np.arange(w)[None, :] + np.arange(len(steps))[:, None]) % w
    picks = np.take_along_axis(steps, rot, axis=1).reshape(-1)
    return _gather(order, starts, ends, picks, w)


def _max_atom_batches(c, order, capacity, min_atoms):
    """fairchem's ``get_batches`` (and metatrain's port): structures over the budget dropped, the
    rest packed next-fit, batches under ``min_atoms`` dropped; ``(starts, ends, order)``."""
    order = order[c[order] <= capacity]
    starts, ends = next_fit(c[order], capacity)
    if min_atoms > 0 and len(starts):
        cs = np.concatenate([[0], np.cumsum(c[order])])
        keep = cs[ends] - cs[starts] >= min_atoms
        starts, ends = starts[keep], ends[keep]
    return starts, ends, order


def _max_atom_sampler(costs, capacity, world_size, rng, perm_seed, drop_last, min_atoms, refusal):
    """A ``MaxAtomDistributedBatchSampler``: the structures in the order of ``rng`` (None: as
    given) packed by :func:`_max_atom_batches`; the batch order (a ``randperm`` of ``perm_seed``,
    None: as packed) padded from its start, or cut (``drop_last``), to a multiple of the ranks,
    rank ``r`` taking every ``ranks``-th batch from ``r``; ``refusal`` (with ``{b}`` batches and
    ``{w}`` ranks) where there are fewer batches than ranks."""
    c, w = _atoms(costs), int(world_size)
    order = rng.permutation(len(c)) if rng is not None else np.arange(len(c))
    starts, ends, order = _max_atom_batches(c, order, capacity, min_atoms)
    b = len(starts)
    if b < w:
        raise ValueError(refusal.format(b=b, w=w))
    total = (b // w if drop_last else math.ceil(b / w)) * w
    idx = np.arange(b) if perm_seed is None else _torch_perm(b, perm_seed)
    if total > b:  # pad by repeating the order's start
        idx = np.concatenate([idx, np.tile(idx, math.ceil((total - b) / b))[: total - b]])
    return _gather(order, starts, ends, idx[:total], w)


def fairchem_max_atoms(
    costs,
    capacity,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    min_atoms: int = 0,
) -> Packing:
    """fairchem's ``MaxAtomDistributedBatchSampler`` (fairchem-core 2.24.0,
    ``fairchem/core/datasets/samplers/max_atom_distributed_sampler.py``; facebookresearch/fairchem
    6fc7ff2; a config selects it with ``train_dataloader.batch_sampler_fn``).

    Packed once: the structures in the order of ``np.random.default_rng(seed).permutation``,
    those over ``capacity`` (``max_atoms``) dropped, the rest next-fit, batches under
    ``min_atoms`` dropped. Each epoch the batch order is a ``torch.randperm`` seeded
    ``seed + epoch`` (``shuffle``), padded by repeating its start (or, ``drop_last``, cut) to a
    multiple of the ranks; rank ``r`` takes every ``ranks``-th batch from ``r``.

    Raises:
        ValueError: fewer batches than ranks (fairchem's assertion).
    """
    return _max_atom_sampler(
        costs,
        capacity,
        world_size,
        np.random.default_rng(int(seed)),
        int(seed) + int(epoch) if shuffle else None,
        drop_last,
        min_atoms,
        "fairchem: there are less batches than ranks! ({b} batches, {w} ranks)",
    )


def metatrain_max_atoms(
    costs,
    capacity,
    world_size: int = 1,
    seed: int = 0,
    epoch: int = 0,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    min_atoms: int = 0,
) -> Packing:
    """metatrain's ``MaxAtomDistributedBatchSampler`` (``max_atoms_per_batch``;
    metatensor/metatrain PR #1068, ``src/metatrain/utils/data/samplers.py`` at 03fb08c), a port of
    fairchem's: an atom budget only (no edge budget).

    As :func:`fairchem_max_atoms` but packed from a fixed ``np.random.default_rng(0)`` (the
    dataset order without ``shuffle``) whatever ``seed`` is, and the batch order of each epoch is
    a ``torch.randperm`` seeded with the epoch alone. At seed 0 the two give the same batches.

    Raises:
        ValueError: fewer batches than ranks (metatrain's check).
    """
    return _max_atom_sampler(
        costs,
        capacity,
        world_size,
        np.random.default_rng(0) if shuffle else None,
        int(epoch) if shuffle else None,
        drop_last,
        min_atoms,
        "metatrain: only {b} batches were packed but num_replicas={w}; increase the dataset size "
        "or reduce max_atoms",
    )


#: the models by name, each ``f(costs, capacity, world_size, seed=0, epoch=0, **options)``
PEERS = {
    "distributed": distributed_fixed,
    "hydragnn": hydragnn_cost_aware,
    "fairchem": fairchem_max_atoms,
    "metatrain": metatrain_max_atoms,
}
