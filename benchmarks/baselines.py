"""Packers the benchmark compares with :func:`~cfm_plugins.sampler.pack`: the models of the peers'
samplers (:mod:`cfm_plugins.plan.peer_samplers`: torch's ``DistributedSampler`` with a fixed batch
size, HydraGNN's ``DistributedCostAwareBatchSampler``) and short re-implementations of the rest.

Every function returns a :class:`Packing` with the same step convention (bins
``[s*W:(s+1)*W]`` are step ``s``, one per rank). Where a method leaves a rank without a batch at
a step, the bin is empty (that rank idles); where the original pads by repeating samples or
batches, the repeats are kept (the benchmark counts them as duplicated).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from cfm_plugins.plan.peer_samplers import distributed_fixed, hydragnn_cost_aware, next_fit
from cfm_plugins.sampler.packing import (
    Packing,
    offsets_from_counts,
    packing_from_bins,
    validate_costs,
)


def _from_bins(bins: list, world_size: int, pad_empty: bool = True) -> Packing:
    """Packing from a list of index arrays (in step order); pad with empty bins to a multiple of
    W."""
    if pad_empty and len(bins) % world_size:
        bins = list(bins) + [np.zeros(0, np.int64)] * (world_size - len(bins) % world_size)
    return packing_from_bins(bins, world_size)


def _csr(indices: np.ndarray, counts: np.ndarray, world_size: int) -> Packing:
    return Packing(indices, offsets_from_counts(counts), world_size=world_size)


def first_fit_decreasing(costs, capacity, world_size=1, seed=0) -> Packing:
    """First-fit decreasing (Garey & Johnson): largest graph first into the first bin it fits.

    Exact FFD, computed per run of equal costs (the graphs of one cost fill the eligible bins in
    index order, then open new bins); fast for integer costs, slow for all-distinct float costs.
    Bins are then shuffled and dealt to ranks W at a time, as a sampler over fixed batches would.
    """
    c = validate_costs(costs)
    cap, w = float(capacity), int(world_size)
    rng = np.random.default_rng(seed)
    pre = rng.permutation(len(c))
    order = pre[np.argsort(-c[pre], kind="stable")]
    s = c[order]
    bounds = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(s)]])
    rem = np.zeros(0)
    item_bin = np.empty(len(s), np.int64)
    for a, b in zip(starts, ends):
        size, cnt = s[a], b - a
        if size > cap:
            raise ValueError(f"sample {int(order[a])} has cost {size:g} > capacity {cap:g}")
        elig = np.flatnonzero(rem >= size)
        take = np.floor(rem[elig] / size + 1e-9).astype(np.int64)
        cum = np.cumsum(take)
        used = int(np.searchsorted(cum, cnt)) + 1 if len(cum) else 0
        used = min(used, len(elig))
        tk = take[:used].copy()
        if used and cum[used - 1] > cnt:
            tk[-1] -= cum[used - 1] - cnt
        placed = int(tk.sum())
        item_bin[a : a + placed] = np.repeat(elig[:used], tk)
        rem[elig[:used]] -= tk * size
        left = cnt - placed
        if left:
            per = int(math.floor(cap / size + 1e-9))
            nnew = -(-left // per)
            new_ids = len(rem) + np.arange(nnew)
            fill = np.full(nnew, per)
            fill[-1] = left - per * (nnew - 1)
            item_bin[a + placed : b] = np.repeat(new_ids, fill)
            rem = np.concatenate([rem, cap - fill * size])
    nb = len(rem)
    shuffled = rng.permutation(nb)
    pos = np.empty(nb, np.int64)
    pos[shuffled] = np.arange(nb)
    key = pos[item_bin]
    g = np.argsort(key, kind="stable")
    counts = np.bincount(key, minlength=nb)
    nb_pad = -(-nb // w) * w
    counts = np.concatenate([counts, np.zeros(nb_pad - nb, np.int64)])
    return _csr(order[g], counts, w)


def greedy_budget(costs, capacity, world_size=1, seed=0) -> Packing:
    """PyG ``DynamicBatchSampler`` style: shuffle, add graphs until the budget would be exceeded.

    Bins are dealt to ranks in the order they are made; the last step is padded with empty
    bins (PyG itself needs ``num_steps`` to give every rank the same count).
    """
    c = validate_costs(costs)
    order = np.random.default_rng(seed).permutation(len(c))
    starts, ends = next_fit(c[order], float(capacity))
    return _from_bins([order[i:j] for i, j in zip(starts, ends)], int(world_size))


def _global_batches(n: int, world_size: int, seed: int, batch_size: int):
    """Shuffled global batches of ``batch_size*world_size`` sample indices (DistributedSampler
    style)."""
    perm = np.random.default_rng(seed).permutation(n)
    g = batch_size * world_size
    for a in range(0, n, g):
        yield perm[a : a + g]


def fairchem_balanced(costs, capacity=None, world_size=1, seed=0, batch_size: int = 8) -> Packing:
    """fairchem ``BalancedBatchSampler`` style: per step, largest-first balancing of a fixed batch.

    Each step takes ``batch_size*W`` shuffled graphs (a DistributedSampler global batch) and
    partitions them over the W ranks greedily: graphs largest first, each to the rank with the
    smallest load so far (a heap). ``capacity`` is ignored.
    """
    c = validate_costs(costs)
    w = int(world_size)
    bins = []
    for chunk in _global_batches(len(c), w, seed, batch_size):
        srt = chunk[np.argsort(-c[chunk], kind="stable")]
        heap = [(0.0, r) for r in range(w)]
        parts = [[] for _ in range(w)]
        for i, cost in zip(srt.tolist(), c[srt].tolist()):
            load, r = heapq.heappop(heap)
            parts[r].append(i)
            heapq.heappush(heap, (load + cost, r))
        bins.extend(np.asarray(p, np.int64) for p in parts)
    return _from_bins(bins, w)


def fastchgnet_pairs(costs, capacity=None, world_size=1, seed=0, batch_size: int = 8) -> Packing:
    """FastCHGNet load-balance sampler (paper 003, section III): sort a global batch ascending,
    then each GPU in turn takes the smallest and the largest remaining graph, until none is left.

    The global batch is ``batch_size*W`` shuffled graphs. ``capacity`` is ignored.
    """
    c = validate_costs(costs)
    w = int(world_size)
    bins = []
    for chunk in _global_batches(len(c), w, seed, batch_size):
        srt = chunk[np.argsort(c[chunk], kind="stable")]
        m = len(srt)
        take = np.empty(m, np.int64)
        take[0::2] = np.arange((m + 1) // 2)  # smallest, largest, next smallest, ...
        take[1::2] = m - 1 - np.arange(m // 2)
        pair = np.arange(m) // 2
        seq = srt[take]
        rank = pair % w
        bins.extend(seq[rank == r] for r in range(w))
    return _from_bins(bins, w)


BASELINES = {
    "fixed-count (8/rank)": distributed_fixed,
    "first-fit decreasing": first_fit_decreasing,
    "greedy budget (PyG)": greedy_budget,
    "fairchem balanced": fairchem_balanced,
    "FastCHGNet pairs": fastchgnet_pairs,
    "HydraGNN cost-aware": hydragnn_cost_aware,
}
