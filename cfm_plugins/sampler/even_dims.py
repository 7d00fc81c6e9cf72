"""Bins even in several sizes at once (atoms and edges): what a batch padded to one budget wants.

A batch padded to one budget (the ``static`` feature) costs the budget in every dimension: atoms
*and* edges. Bins packed even in one cost (:func:`~cfm_plugins.sampler.packing.pack_even`) vary in
the other as much as the structures' densities do. :func:`pack_even_dims` gives every bin about
the mean of every dimension, dense structures going with sparse ones, in as many bins as
:func:`~cfm_plugins.sampler.packing.pack` makes at ``capacity``; where it cannot, the plan is
``pack_even``'s. It says how the samples are dealt. Deterministic: every rank computes the same
plan.
"""

from __future__ import annotations

import numpy as np

from .bins import Packing, arrange_steps, check_capacity, validate_costs, validate_step_sizes
from .packing import even_out, pack

#: slacks over the mean fill of the cost tried in turn (as
#:func:`~cfm_plugins.sampler.packing.pack_even`'s), : and for each, those of the other sizes (a bin
# may exceed the mean of a dimension by this much)
COST_SLACKS = (0.01, 0.02, 0.04)
DIMS_SLACKS = (0.02, 0.04, 0.08, 0.16)
#: bins each sample chooses from when there are more (the least loaded, by their fullest dimension)
CANDIDATES = 256
#: samples placed between two refreshes of the candidate bins
REFRESH = 32


def check_dims(dims, n: int) -> np.ndarray:
    """``dims`` as an ``(n, k)`` float array of finite sizes >= 0, or a ``ValueError`` naming the
    first bad sample."""
    d = np.asarray(dims, dtype=np.float64)
    if d.ndim == 1:
        d = d[:, None]
    if d.ndim != 2 or d.shape[0] != n:
        raise ValueError(
            f"dims: expected one row of sizes per sample ({n} rows), got shape {np.shape(dims)}"
        )
    bad = np.flatnonzero(~np.isfinite(d).all(axis=1) | (d < 0).any(axis=1))
    if len(bad):
        raise ValueError(
            f"dims: sample {int(bad[0])} has sizes {d[bad[0]].tolist()}; every size must be finite "
            f"and >= 0 ({len(bad)} bad sample(s))"
        )
    return d


def _best_bin(load, size, limits, inv, bins) -> int:
    """Of ``bins`` (indices into ``load``), the one whose fullest dimension relative to
    ``limits`` is lowest after taking ``size``, among those it fits; -1 if it fits none."""
    after = load[bins] + size
    fits = (after <= limits * (1 + 1e-12)).all(axis=1)
    if not fits.any():
        return -1
    return int(bins[np.argmin(np.where(fits, (after * inv).max(axis=1), np.inf))])


def _assign(sizes: np.ndarray, limits: np.ndarray, n_bins: int, order: np.ndarray):
    """Bin of every sample of ``order`` (greedy: :func:`_best_bin` among the candidates, else
    among all bins), and each sample's slot in its bin; ``None`` when a sample fits no bin."""
    load = np.zeros((n_bins, sizes.shape[1]))
    count = np.zeros(n_bins, np.int64)
    item_bin = np.empty(len(order), np.int64)
    slot = np.empty(len(order), np.int64)
    inv = 1.0 / limits
    every = cand = np.arange(n_bins)
    for j, i in enumerate(order):
        if n_bins > CANDIDATES and j % REFRESH == 0:
            cand = np.argpartition((load * inv).max(axis=1), CANDIDATES)[:CANDIDATES]
        b = _best_bin(load, sizes[i], limits, inv, cand)
        if b < 0 and cand is not every:
            b = _best_bin(load, sizes[i], limits, inv, every)
        if b < 0:
            return None
        load[b] += sizes[i]
        item_bin[j], slot[j] = b, count[b]
        count[b] += 1
    return item_bin, slot


def _joint(
    c, sizes, keep, full: Packing, n_bins: int, cap: float, rng, step_sizes=None
) -> Packing | None:
    """The samples ``keep`` (sizes ``sizes``: the cost, then the dims) in ``n_bins`` bins even in
    every dimension (the first slacks at which all fit), ``full``'s solo bins after them, cut
    into steps by cost (by ``step_sizes`` where given: :func:`.bins.arrange_steps`); ``None`` if
    none fits them."""
    mean, largest = sizes.sum(axis=0) / n_bins, sizes.max(axis=0)
    same_as_cost = (sizes == sizes[:, :1]).all(axis=0)
    for slack in [
        np.where(same_as_cost, s_cost, s_other) for s_cost in COST_SLACKS for s_other in DIMS_SLACKS
    ]:
        limits = np.maximum(mean * (1.0 + slack), largest)
        limits[same_as_cost] = np.minimum(
            limits[same_as_cost], cap
        )  # the cost (and a column that is it)
        limits = np.where(
            limits > 0, limits, 1.0
        )  # a dimension of zeros (no edges anywhere) never binds
        key = (sizes / limits).sum(axis=1)
        tie = rng.random(len(key)) if rng is not None else np.arange(len(key))
        order = np.lexsort((tie, -key))
        placed = _assign(sizes, limits, n_bins, order)
        if placed is None:
            continue
        item_bin, slot = placed
        idx, solo = keep[order], full.solo
        if len(solo):
            idx = np.concatenate([idx, solo])
            item_bin = np.concatenate([item_bin, np.arange(n_bins, n_bins + len(solo))])
            slot = np.concatenate([slot, np.zeros(len(solo), np.int64)])
        p = arrange_steps(
            idx,
            c[idx],
            item_bin,
            slot,
            n_bins + len(solo),
            full.world_size,
            rng,
            solo,
            full.skipped,
            float(limits[0]),
            step_sizes=step_sizes,
        )
        p.limits = tuple(float(x) for x in limits)
        return p
    return None


def pack_even_dims(costs, dims, capacity, world_size, seed=None, **kwargs) -> Packing:
    """Bins even in ``costs`` and in every column of ``dims`` (e.g. atoms and edges), as many as
    :func:`~cfm_plugins.sampler.packing.pack` makes at ``capacity``.

    ``B`` is the bin count of ``pack`` at ``capacity`` (the same steps as without it). For each
    slack of the cost (:data:`COST_SLACKS`, as ``pack_even``'s) and then of the other sizes
    (:data:`DIMS_SLACKS`) in turn, every dimension ``d`` gets the limit ``max(total_d / B * (1 +
    slack_d), largest sample's d)`` (the cost never above ``capacity``): the cost pads no more
    than bins even in it alone, the other sizes as little as the greedy deal allows. The samples,
    largest first (by the sum of their sizes over the limits; ties in a random order from
    ``seed``), each go to the bin whose fullest dimension, relative to its limit, is lowest after
    taking it, among the bins where it fits every limit. The first slack at which every sample
    fits gives the plan. If none does, or Algorithm 1's bins are already full to ``capacity``
    (no room to move a sample: the Table-3 mix at 4x its mean, where the largest structure is the
    capacity), the plan is :func:`~cfm_plugins.sampler.packing.pack_even`'s. Where the largest
    structure alone sets a limit (its edges above the mean fill), no arrangement pads less in
    that dimension than it does.

    Each sample scans the bins (``B`` of them, or the :data:`CANDIDATES` least loaded, refreshed
    every :data:`REFRESH` samples, when there are more): about a second for 50 000 samples in 500
    bins.

    Args:
        costs, capacity, world_size, seed: as :func:`~cfm_plugins.sampler.packing.pack`.
        dims: per-sample sizes, ``(n, k)`` (or ``(n,)`` for one), finite and >= 0, indexed like
            ``costs``: the dimensions a padded batch pays for besides the cost.
        **kwargs: ``pack``'s keywords (``oversize``, ``evaluation``, ``repeat``,
            ``step_sizes``).

    Returns:
        A :class:`~cfm_plugins.sampler.bins.Packing` whose ``limits`` give each dimension's
        limit (``costs`` first, then the columns of ``dims``; no bin but a ``solo`` one exceeds
        them), or, where no arrangement fits the limits, the plan of
        :func:`~cfm_plugins.sampler.packing.pack_even` (``limits`` ``None``).

    Raises:
        ValueError: as ``pack``; ``dims`` not one row per sample, or a size that is not finite
            and >= 0 (naming the sample).
    """
    full = pack(costs, capacity, world_size, seed, **kwargs)
    c = validate_costs(costs)
    d = check_dims(dims, len(c))
    cap = check_capacity(capacity)
    if full.capacity is None or not (c <= cap).any():
        return (
            full  # a set too small for the ranks (repeated or merged samples): nothing to even out
        )
    keep = np.setdiff1d(np.flatnonzero(c <= cap), full.skipped)
    n_bins = full.num_bins - len(full.solo)
    p = None
    if (
        c[keep].sum() / n_bins * (1.0 + COST_SLACKS[0]) <= cap
    ):  # else Algorithm 1's bins are full: no room
        p = _joint(
            c,
            np.column_stack([c[keep], d[keep]]),
            keep,
            full,
            n_bins,
            cap,
            np.random.default_rng(seed) if seed is not None else None,
            validate_step_sizes(kwargs.get("step_sizes"), len(c)),
        )
    return p if p is not None else even_out(full, c, cap, world_size, seed, **kwargs)
