"""Balanced bin packing of graphs into mini-batches: Algorithm 1 of the MACE paper, vectorized.

Pure numpy (no torch import here). ``pack(costs, capacity, world_size, seed)`` returns a
:class:`Packing`: CSR arrays ``indices``/``offsets`` whose bins ``[s*W:(s+1)*W]`` form step ``s``
(one bin per rank, ``W = world_size``). The graphs are dealt largest first into ``B`` bins
(``ceil(total / capacity)`` rounded up to a multiple of ``W``, more where needed) as the paper's
Algorithm 1 does (:func:`deal` states it and how it is vectorized); the bins are then sorted by
cost and cut into steps of ``W`` bins, so the ranks of a step get nearly equal work. With a seed,
ties between equal costs, the step order and the bin-to-rank mapping inside a step are shuffled.

:func:`pack_even` (bins of nearly equal cost rather than full ones), :func:`pack_levels`
(calibration steps at several capacities) and the helpers for small sets
(:func:`deal_over_ranks`, :func:`fill_with_repeats`) build on it.
"""

from __future__ import annotations

import logging
import math

import numpy as np

# the plan and the checks every packer shares live in a leaf (``bins.py``); they stay importable
# from here, where they were first defined
from .bins import (
    Packing,
    arrange_steps,
    check_capacity,
    check_world_size,
    packing_from_bins,
    validate_costs,
    validate_step_sizes,
)
from .bins import offsets_from_counts as offsets_from_counts

log = logging.getLogger("cfm_plugins.sampler")

OVERSIZE_POLICIES = ("error", "skip", "solo")
FLOAT_TIE_RESOLUTION = 1e-3  # relative width of the cost buckets used to rank non-integer costs


# --------------------------------------------------------------------------------------------
# Sorting helpers


def _stable_argsort_int(key: np.ndarray, max_key: int) -> np.ndarray:
    """Stable argsort of non-negative integer keys; radix sort (16-bit passes) when they fit."""
    if max_key < 1 << 16:
        return np.argsort(key if key.dtype == np.uint16 else key.astype(np.uint16), kind="stable")
    if max_key < 1 << 32:
        k = key.astype(np.uint32)
        o = np.argsort((k & 0xFFFF).astype(np.uint16), kind="stable")
        o2 = np.argsort((k[o] >> 16).astype(np.uint16), kind="stable")
        return o[o2]
    return np.argsort(key, kind="stable")


def _rank_keys(costs: np.ndarray) -> tuple[np.ndarray, int, bool]:
    """Integer sort keys, larger cost -> smaller key; and whether keys are exact (integer costs)."""
    top_f = float(costs.max())
    if top_f < 2**52 and np.all(costs == np.floor(costs)):
        top = int(top_f)
        dtype = np.uint16 if top < 1 << 16 else (np.uint32 if top < 1 << 32 else np.int64)
        return (top_f - costs).astype(dtype), top, True
    # buckets of FLOAT_TIE_RESOLUTION relative width: costs inside one bucket count as ties
    b = np.floor(np.log(costs) / math.log1p(FLOAT_TIE_RESOLUTION)).astype(np.int64)
    top, low = int(b.max()), int(b.min())
    return top - b, top - low, False


def sort_descending(costs: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, bool]:
    """Order of ``costs``, largest first; ties in random order (``rng``) or index order.

    Returns the order and whether the sorted costs are exactly non-increasing.
    """
    key, max_key, exact = _rank_keys(costs)
    if rng is None:
        order = _stable_argsort_int(key, max_key)
    else:  # LSD radix: a random 16-bit key first, then the cost key (stable) -> random ties
        pre = np.argsort(rng.integers(0, 1 << 16, len(costs), dtype=np.uint16), kind="stable")
        order = pre[_stable_argsort_int(key[pre], max_key)]
    if not exact:  # inside a bucket the order is random: the deal checks every fit
        return order, bool(np.all(np.diff(costs[order]) <= 0))
    return order, True


# --------------------------------------------------------------------------------------------
# Algorithm 1


def deal(
    sizes: np.ndarray, capacity: float, num_bins: int, add_bins: int, monotone: bool = True
) -> tuple[np.ndarray, np.ndarray, int]:
    """Algorithm 1 on graphs already in dealing order.

    Returns the bin of each graph, its slot in that bin (0 for the first graph the bin received)
    and the number of bins.

    Algorithm 1 (paper section 3.2), as implemented here:

    1. Sort the graphs by cost, descending (ties: random order from ``seed``; index order without
       one): :func:`sort_descending`, before this function.
    2. Start with ``B`` bins, ``B`` = ``ceil(total / capacity)`` rounded up to a multiple of ``W``.
    3. Each iteration stably sorts the active bins by remaining capacity, fullest first, and
       steps through them once: the next graph goes into the bin if it fits, and the pointer
       advances; else the bin is marked full (the same graph is offered to the next bin).
    4. Re-admission: when a not-full bin becomes fuller than every bin marked full, all full bins
       go back to the active pool (they may take the now smaller graphs). Bins that cannot take
       even the smallest graph are closed for good (an optimisation: they would fail every time).
    5. When no active bin remains, every full bin is re-admitted; if none can take the next
       graph, ``W`` (``add_bins``) empty bins are added and the deal goes on with the leftovers.

    Vectorization. The bins are kept sorted by remaining capacity and the graphs sorted by cost,
    so within one iteration the bins that fail are a prefix (remaining < cost of the current
    graph, found by binary search) and every later bin succeeds (it has at least as much room as
    the one before it, for a graph no larger): an iteration assigns a contiguous slice of graphs
    to the active bins in order, one array operation. The order of the bins survives the
    iteration (a fuller bin receives a larger graph), so the "stable sort" is only needed when
    bins re-enter. When costs are not integers they are ranked in buckets of 0.1 % (so that ties
    exist to randomize); graphs are then not exactly monotone (``monotone=False``), and the
    iteration falls back to checking each slice and splitting it where a graph does not fit
    (still the same sequential semantics).
    """
    n = len(sizes)
    s = sizes
    rem = np.full(max(num_bins, 1) * 2, capacity, dtype=np.float64)  # grows as bins are added
    nb = num_bins
    item_bin = np.empty(n, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    cnt = np.zeros(len(rem), dtype=np.int64)
    active = np.arange(nb, dtype=np.int64)  # sorted by remaining capacity, ascending (stable)
    full: list[np.ndarray] = []
    full_min_rem = math.inf
    s_min = float(s.min())
    ptr = 0
    while ptr < n:
        if len(active) == 0:
            # no active bin: re-admit every full bin; add W bins if none can take the next graph
            if full:
                allb = np.concatenate(full)
                active = allb[np.argsort(rem[allb], kind="stable")]
                full, full_min_rem = [], math.inf
            if len(active) == 0 or rem[active[-1]] < s[ptr]:
                if nb + add_bins > len(rem):
                    rem = np.concatenate([rem, np.full(len(rem) + add_bins, capacity)])
                    cnt = np.concatenate([cnt, np.zeros(len(cnt) + add_bins, np.int64)])
                active = np.concatenate([active, np.arange(nb, nb + add_bins, dtype=np.int64)])
                nb += add_bins
            continue
        # one iteration: step once through the active bins (fullest first)
        ra = rem[active]
        m = len(active)
        j = 0
        failed, kept = [], []
        while j < m and ptr < n:
            # bins too full for graph `ptr`: a run of the (sorted) active order
            k = int(np.searchsorted(ra[j:], s[ptr], side="left"))
            if k:
                failed.append(active[j : j + k])
                j += k
            c = min(m - j, n - ptr)
            if c > 0 and not monotone:
                c = _fitting_run(ra, s, j, ptr, c)
            if c > 0:
                tgt = active[j : j + c]
                item_bin[ptr : ptr + c] = tgt
                slot[ptr : ptr + c] = cnt[tgt]
                cnt[tgt] += 1
                rem[tgt] -= s[ptr : ptr + c]
                kept.append(tgt)
                j += c
                ptr += c
            if monotone:  # every bin after the failed run fits: the iteration is done
                break
        if j < m:
            kept.append(active[j:])  # not reached (no graph left)
        if failed:
            f = np.concatenate(failed)
            f = f[rem[f] >= s_min]  # the others can never take a graph: closed for good
            if len(f):
                full.append(f)
                full_min_rem = min(full_min_rem, float(rem[f].min()))
        active = kept[0] if len(kept) == 1 else (np.concatenate(kept) if kept else active[:0])
        if not monotone and len(active) > 1:
            r2 = rem[active]
            if np.any(r2[1:] < r2[:-1]):
                active = active[np.argsort(r2, kind="stable")]
        if len(active):  # bins that cannot take even the smallest graph: closed for good
            k0 = int(np.searchsorted(rem[active], s_min, side="left"))
            if k0:
                active = active[k0:]
        # re-admission: a not-full bin passed the occupancy of every full bin
        if full and len(active) and rem[active[0]] < full_min_rem:
            allb = np.concatenate([active] + full)
            active = allb[np.argsort(rem[allb], kind="stable")]
            full, full_min_rem = [], math.inf
    return item_bin, slot, nb


def _fitting_run(ra, s, j, ptr, c_max, window=1024) -> int:
    """Length of the run of bins ``j..`` that each fit graph ``ptr..`` (graphs not monotone)."""
    c = 0
    while c < c_max:
        e = min(c_max, c + window)
        ok = ra[j + c : j + e] >= s[ptr + c : ptr + e]
        if not ok.all():
            return c + int(np.argmin(ok))
        c = e
        window *= 2
    return c


def _fill_empty_bins(item_bin: np.ndarray, slot: np.ndarray, num_bins: int) -> None:
    """Give each empty bin the last-dealt graph of one of the bins holding the most graphs (in
    place).

    A rank cannot train on an empty batch. An empty bin can appear when W bins were added for
    fewer than W leftover graphs; moving a graph into an empty bin always respects capacity.
    """
    counts = np.bincount(item_bin, minlength=num_bins)
    empty = np.flatnonzero(counts == 0)
    while len(empty):
        donors = np.argsort(-counts, kind="stable")[: len(empty)]
        donors = donors[counts[donors] >= 2]
        if not len(donors):
            raise ValueError(
                f"cannot fill {num_bins} bins with {len(item_bin)} samples; use fewer ranks"
            )
        is_donor = np.zeros(num_bins, dtype=bool)
        is_donor[donors] = True
        moved = np.flatnonzero(is_donor[item_bin] & (slot == counts[item_bin] - 1))
        targets = empty[: len(moved)]
        counts[item_bin[moved]] -= 1
        item_bin[moved] = targets
        slot[moved] = 0
        counts[targets] = 1
        empty = empty[len(moved) :]


def lower_bound_bins(total: float, capacity: float) -> int:
    """``ceil(total / capacity)``: no packing can use fewer bins."""
    return max(1, math.ceil(total / capacity - 1e-12))


def round_up(x: int, m: int) -> int:
    return -(-int(x) // m) * m


#: :func:`pack_even` tries these slacks over the mean fill, in turn
EVEN_SLACKS = (0.01, 0.02, 0.04)


def pack(
    costs,
    capacity,
    world_size,
    seed=None,
    *,
    oversize: str = "error",
    evaluation: bool = False,
    repeat: bool = False,
    step_sizes=None,
) -> Packing:
    """Pack samples into bins of at most ``capacity`` total cost, ``world_size`` bins per step.

    Algorithm 1 of the MACE paper (:func:`deal`). A pure function: the same inputs give
    the same plan on every rank. Bins of nearly equal cost rather than full ones (for batches
    padded to one budget) are :func:`pack_even` and
    :func:`~cfm_plugins.sampler.even_dims.pack_even_dims`, same arguments.

    Args:
        costs: per-sample cost (atoms, edges or a calibrated cost), finite and > 0.
        capacity: the bin budget in the same unit (e.g. 3072 atoms).
        world_size: ranks; the number of bins is a multiple of it.
        seed: ``None`` for the deterministic plan; an int randomizes ties between equal costs,
            the step order and the bin-to-rank mapping (re-pack every epoch from
            ``seed + epoch``). Inside a bin samples stay in dealing order (largest first);
            :class:`~cfm_plugins.sampler.BinPackBatchSampler` shuffles each batch as it yields it.
        oversize: what to do with a sample costlier than ``capacity``: ``"error"`` (raise),
            ``"skip"`` (drop it, logged) or ``"solo"`` (alone in its own bin, logged; that bin
            exceeds the capacity).
        evaluation: for evaluation loaders, which must not refuse a small set. When the samples
            cannot fill ``world_size`` non-empty bins per step within the capacity, the plan of
            one rank is dealt over the ranks (:func:`deal_over_ranks`): with at least
            ``world_size`` samples the bins of a last partial step are merged into the cheapest
            others (which may then exceed the capacity, logged) and every sample is in exactly
            one bin; with fewer samples than ranks every rank gets every bin. Every rank has a
            non-empty bin at every step, as trainers' evaluation code under DDP needs.
        repeat: for training loaders. When the samples cannot fill ``world_size`` non-empty bins
            per step, the plan of one rank is split and, where that is not enough, samples are
            repeated until every rank has a batch at every step, as torch's
            ``DistributedSampler`` pads (:func:`fill_with_repeats`).
        step_sizes: ``None`` (the bins of a step are chosen by their cost), or a size per
            sample, finite and >= 0 (e.g. edges, where the cost counts atoms): the bins are
            sorted by their sums of it before they are cut into steps, so the ranks of a step
            get bins of nearly equal ``step_sizes`` (the same bins as without it).

    Returns:
        A :class:`Packing`: bins ``[s*world_size:(s+1)*world_size]`` form step ``s``, bin
        ``s*world_size + r`` goes to rank ``r``; ``capacity`` is ``capacity``; ``solo``,
        ``skipped`` and ``repeated`` list the samples the options above placed alone, dropped
        or repeated.

    Raises:
        ValueError: a bad cost or step size (naming the sample), a capacity or ``world_size``
            that is not a positive number, an unknown ``oversize``, a sample costlier than
            ``capacity`` under ``oversize="error"`` (naming it and the capacity that fits it),
            every sample skipped, or a set too small to give every rank a non-empty batch at
            every step without ``evaluation`` or ``repeat`` (saying what helps).
    """
    c = validate_costs(costs)
    steps_by = validate_step_sizes(step_sizes, len(c))
    cap = check_capacity(capacity)
    w = check_world_size(world_size)
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"oversize={oversize!r}: expected one of {', '.join(OVERSIZE_POLICIES)}")
    n = len(c)
    over = np.flatnonzero(c > cap)
    solo = skipped = np.zeros(0, np.int64)
    if len(over):
        i = int(over[0])
        names = ", ".join(f"{int(j)} ({c[j]:g})" for j in over[:5]) + (
            " ..." if len(over) > 5 else ""
        )
        if oversize == "error":
            raise ValueError(
                f"sample {i} has cost {c[i]:g} > capacity {cap:g} ({len(over)} sample(s) exceed "
                f"it: {names}); raise the capacity to at least {c[over].max():g}, or choose "
                "oversize='solo' (alone in its own batch) or oversize='skip' (dropped)"
            )
        if oversize == "skip":
            skipped = over
            log.warning(
                "bin packing: skipping %d sample(s) costlier than capacity %g: %s",
                len(over),
                cap,
                names,
            )
        else:
            solo = over
            log.warning(
                "bin packing: %d sample(s) costlier than capacity %g each get a batch of "
                "their own: %s",
                len(over),
                cap,
                names,
            )
    normal = np.flatnonzero(c <= cap) if len(over) else None  # None: every sample
    cn = c if normal is None else c[normal]
    n_norm, n_solo = len(cn), len(solo)
    if n_norm + n_solo == 0:
        raise ValueError(
            f"no sample left to pack: all {n} samples are costlier than capacity {cap:g} "
            "and oversize='skip' dropped them"
        )
    total = float(cn.sum()) if n_norm else 0.0
    lb = lower_bound_bins(total, cap) if n_norm else 0
    n_bins = round_up(lb + n_solo, w) - n_solo
    if n_norm + n_solo < w or n_bins > n_norm:
        return _too_few_samples(
            c, cap, w, seed, oversize, evaluation, repeat, n_bins + n_solo, total, steps_by
        )
    rng = np.random.default_rng(seed) if seed is not None else None

    if n_norm:
        order, monotone = sort_descending(cn, rng)
        sizes = cn[order]
        if normal is not None:
            order = normal[order]
        item_bin, slot, n_bins = deal(sizes, cap, n_bins, w, monotone=monotone)
        if n_bins > n_norm:  # only possible for tiny inputs
            return _too_few_samples(
                c, cap, w, seed, oversize, evaluation, repeat, n_bins + n_solo, total, steps_by
            )
        _fill_empty_bins(item_bin, slot, n_bins)
    else:
        order = sizes = np.zeros(0, np.int64)
        item_bin = slot = np.zeros(0, np.int64)
    if n_solo:
        order = np.concatenate([order, solo])
        sizes = np.concatenate([sizes, c[solo]])
        item_bin = np.concatenate([item_bin, np.arange(n_bins, n_bins + n_solo, dtype=np.int64)])
        slot = np.concatenate([slot, np.zeros(n_solo, np.int64)])
        n_bins += n_solo
    return arrange_steps(
        order, sizes, item_bin, slot, n_bins, w, rng, solo, skipped, cap, step_sizes=steps_by
    )


def pack_even(costs, capacity, world_size, seed=None, **kwargs) -> Packing:
    """Bins of nearly equal cost, as many as :func:`pack` makes: Algorithm 1 with the capacity
    lowered to the mean fill of its own bin count.

    Why. Algorithm 1 fills bins up to the capacity and the last bins take what is left, so a set
    of ``B`` bins' worth of cost rounded up to a multiple of the ranks has full bins and light
    ones. Balance inside a step does not suffer (steps group bins of similar cost), but a batch
    padded to one budget (the ``static`` feature) pads every bin up to the fullest: the light
    bins' gap becomes padding. Lowering the capacity to ``total / B`` plus a slack makes every
    bin about as full as the mean.

    How. ``B`` is the bin count of ``pack(costs, capacity, ...)``. For each slack of
    :data:`EVEN_SLACKS` in turn, the costs are packed with capacity ``total / B * (1 + slack)``
    (never below the costliest sample that fits ``capacity``, never above ``capacity``); the
    first plan with no more than ``B`` bins is returned, else the plan at ``capacity``.

    Args:
        costs, capacity, world_size, seed: as :func:`pack`.
        **kwargs: :func:`pack`'s keywords (``oversize``, ``evaluation``, ``repeat``,
            ``step_sizes``).

    Returns:
        A :class:`Packing` whose ``capacity`` is the lowered capacity its bins were dealt to.

    Raises:
        ValueError: as :func:`pack`.
    """
    return even_out(
        pack(costs, capacity, world_size, seed, **kwargs),
        costs,
        capacity,
        world_size,
        seed,
        **kwargs,
    )


def even_out(full: Packing, costs, capacity, world_size, seed=None, **kwargs) -> Packing:
    """:func:`pack_even` of ``full``, the plan ``pack(costs, capacity, world_size, seed,
    **kwargs)``."""
    c = validate_costs(costs)
    cap = check_capacity(capacity)
    fits = c[c <= cap]
    if full.capacity is None or len(fits) == 0:
        return (
            full  # a set too small for the ranks (repeated or merged samples): nothing to even out
        )
    bins = full.num_bins - len(full.solo)
    floor, mean_fill = float(fits.max()), float(fits.sum()) / bins
    for slack in EVEN_SLACKS:
        lowered = min(cap, max(floor, mean_fill * (1.0 + slack)))
        if lowered >= cap:
            break
        p = pack(c, lowered, world_size, seed, **kwargs)
        if (
            p.num_bins <= full.num_bins
            and len(p.solo) == len(full.solo)
            and len(p.skipped) == len(full.skipped)
        ):
            return p
    return full


#: the capacities of ``cost=auto``'s calibration plans, as fractions of the capacity
# (:func:`pack_levels`)
CALIBRATION_LEVELS = (0.7, 0.85, 1.0)


def check_levels(levels) -> tuple:
    """``levels`` as a sorted tuple of distinct fractions of the capacity in (0, 1], the largest
    1.0."""
    try:
        f = sorted(float(x) for x in levels)
    except (TypeError, ValueError):
        raise ValueError(
            f"levels={levels!r}: give a list of fractions of the capacity, e.g. (0.7, 0.85, 1.0)"
        ) from None
    if (
        not f
        or not all(math.isfinite(x) and 0 < x <= 1 for x in f)
        or f[-1] != 1.0
        or len(set(f)) != len(f)
    ):
        raise ValueError(
            f"levels={levels!r}: give distinct fractions of the capacity in (0, 1], the largest "
            "1.0 (no bin may exceed the capacity), e.g. (0.7, 0.85, 1.0); (1.0,) for one capacity"
        )
    return tuple(f)


def pack_levels(
    costs,
    capacity,
    world_size,
    seed=None,
    levels=CALIBRATION_LEVELS,
    *,
    min_steps: int = 2,
    oversize: str = "error",
    repeat: bool = False,
) -> Packing:
    """Steps packed at several capacities: all bins of a step to one capacity, the capacity varying
    between steps.

    Why. ``cost=auto`` fits step times against the atoms, edges and graphs of the batches the run
    trained on. Plans of one capacity give every bin about the capacity in their cost (atoms, say),
    so that count hardly varies between steps and its coefficient cannot be told from the constant
    per-step time: the fit may then give an atom term where there is none, or none where there is
    one, and the plans made with it balance the wrong cost. Here the capacity varies between steps
    (``levels`` x ``capacity``), so the totals of every count vary over the epoch and their terms
    separate from the constant; every bin of a step is packed to the same capacity, so the ranks
    stay as balanced under the cost of the plan as in :func:`pack`. No bin exceeds ``capacity`` (it
    may be a memory bound); the epoch has about ``1 / mean(levels)`` times as many steps.

    How. The samples are split at random (``seed``; index order without one) into one group per
    level, group ``k`` holding a share of the total cost proportional to ``levels[k]`` (so that
    every level gets about as many steps); a sample costlier than its level's capacity moves to the
    lowest level it fits. Each group is packed by :func:`pack` at its capacity; the steps of all
    levels are then shuffled together (with a seed) or interleaved (without), so that a drift of
    the step time over the epoch (warm-up, load) is not mistaken for the effect of a level. Every
    sample is in exactly one bin, and every rank computes the same plan. A set too small for
    ``min_steps`` steps per level, or one with samples costlier than ``capacity`` (``oversize``:
    ``error``, ``skip`` or ``solo`` as in :func:`pack`), gets the plain plan of :func:`pack`.
    """
    c = validate_costs(costs)
    cap = check_capacity(capacity)
    w = check_world_size(world_size)
    f = np.asarray(check_levels(levels), dtype=np.float64)
    if len(f) == 1 or float(c.sum()) / (cap * f.sum() * w) < min_steps or float(c.max()) > cap:
        return pack(c, cap, w, seed, oversize=oversize, repeat=repeat)
    rng = np.random.default_rng(seed) if seed is not None else None
    order = rng.permutation(len(c)) if rng is not None else np.arange(len(c))
    share = np.cumsum(f) / f.sum()  # cost share of the levels up to each
    mid = (np.cumsum(c[order]) - 0.5 * c[order]) / float(c.sum())
    level = np.empty(len(c), dtype=np.int64)
    level[order] = np.minimum(np.searchsorted(share, mid, side="right"), len(f) - 1)
    fits = np.minimum(
        np.searchsorted(f * cap, c, side="left"), len(f) - 1
    )  # lowest level each sample fits
    level = np.maximum(level, fits)
    steps, groups, repeated = [], [0], []
    for k in range(len(f)):
        members = np.flatnonzero(level == k)
        if len(members) == 0:
            continue
        sub = pack(
            c[members],
            f[k] * cap,
            w,
            None if rng is None else int(rng.integers(1 << 31)),
            repeat=repeat,
        )
        steps += [[members[b] for b in sub.step(s, w)] for s in range(sub.num_steps(w))]
        groups.append(len(steps))
        repeated.append(members[sub.repeated])
    if rng is not None:
        ordered = [steps[i] for i in rng.permutation(len(steps))]
    else:  # round robin over the levels
        per_level = [steps[a:b] for a, b in zip(groups[:-1], groups[1:])]
        ordered = [
            g[i] for i in range(max(len(g) for g in per_level)) for g in per_level if i < len(g)
        ]
    return packing_from_bins(
        [b for step in ordered for b in step], w, repeated=np.concatenate(repeated), capacity=cap
    )


def _too_few_samples(
    c, cap, w, seed, oversize, evaluation, repeat, bins_needed, total, step_sizes=None
) -> Packing:
    """The plan for a set that cannot fill ``w`` non-empty bins per step, or the error saying what
    helps."""
    if evaluation:
        return deal_over_ranks(pack(c, cap, 1, seed, oversize=oversize), c, w)
    if repeat:
        return fill_with_repeats(
            pack(c, cap, 1, seed, oversize=oversize), c, w, seed, step_sizes=step_sizes
        )
    n = len(c)
    if n < w:
        helps = (
            f"use at most {n} rank(s) or more samples (a larger capacity cannot help: every rank "
            "needs a sample of its own), or let the sampler repeat samples (repeat=True, as "
            "binpack does for training loaders)"
        )
    else:
        k = n // w * w  # the most bins that n samples fill, a multiple of w
        fits = float(
            np.sort(c)[::-1][: -(-n // k)].sum()
        )  # dealt round-robin into k bins, each fits
        helps = (
            f"a capacity of {fits:g} or more packs them into {k} bins; or use fewer ranks, more "
            "samples, or repeat=True"
        )
    raise ValueError(
        f"cannot give each of {w} ranks a non-empty batch at every step: {n} sample(s) of total "
        f"cost {total:g} need {bins_needed} bins of capacity {cap:g} (a multiple of {w}), more "
        f"than there are samples; {helps}"
    )


def _split_bins(bins: list, target: int) -> list:
    """Split off the last sample of the bin holding the most, until there are ``target`` bins or
    every bin holds one sample (splitting never breaks the capacity)."""
    bins = list(bins)
    lens = np.array([len(b) for b in bins], dtype=np.int64)
    splits = min(target - len(bins), int(np.maximum(lens - 1, 0).sum()))
    if splits <= 0:
        return bins
    # One split at a time takes the first of the longest bins, so the longest are cut down to a
    # level (the lowest with at most ``splits`` samples above it), then the first of those at the
    # level lose one more; a bin's split-off samples follow it one by one, in their order.
    lo, hi = 1, int(lens.max())
    while lo < hi:
        mid = (lo + hi) // 2
        if int(np.maximum(lens - mid, 0).sum()) <= splits:
            hi = mid
        else:
            lo = mid + 1
    keep = np.minimum(lens, lo)
    extra = splits - int((lens - keep).sum())
    keep[np.flatnonzero(lens >= lo)[:extra]] -= 1
    out = []
    for b, k in zip(bins, keep.tolist()):
        out.append(b[:k])
        out.extend(b[j : j + 1] for j in range(k, len(b)))
    return out


def fill_with_repeats(
    packing: Packing, costs, world_size: int, seed=None, step_sizes=None
) -> Packing:
    """Deal the bins of a one-rank ``packing`` over ``world_size`` ranks for training, no rank
    empty.

    The bins are split (within the capacity) until their number is a multiple of ``world_size``
    or each holds one sample; the bins still missing hold one repeated sample each, chosen at
    random from ``seed`` (so each epoch repeats others), in index order without one. Every
    sample is in at least one bin; fewer than ``world_size`` are repeated, as torch's
    ``DistributedSampler`` pads its index list. Bins are sorted by cost (by their sums of
    ``step_sizes`` where given) into steps (shuffled with a seed), as :func:`pack` does.
    """
    w = check_world_size(world_size)
    c = np.asarray(costs, dtype=np.float64)
    target = round_up(max(len(packing), 1), w)
    bins = _split_bins([np.asarray(b) for b in packing], target)
    rng = np.random.default_rng(seed) if seed is not None else None
    pool = np.sort(packing.indices)
    missing = target - len(bins)
    if missing:
        picks = np.resize(rng.permutation(pool) if rng is not None else pool, missing)
        bins += [np.array([i], np.int64) for i in picks]
        log.debug(
            "bin packing: %d sample(s) for %d ranks: %d repeated so that every rank has a batch at "
            "every step",
            len(pool),
            w,
            missing,
        )
    key = c if step_sizes is None else np.asarray(step_sizes, np.float64)
    cost = np.array([key[b].sum() for b in bins])
    if rng is None:
        by_cost = np.argsort(cost, kind="stable")
    else:
        p = rng.permutation(len(bins))
        by_cost = p[np.argsort(cost[p], kind="stable")]
    steps = by_cost.reshape(-1, w)
    if rng is not None:
        steps = rng.permuted(steps[rng.permutation(len(steps))], axis=1)
    repeated = picks if missing else np.zeros(0, np.int64)
    return packing_from_bins(
        [bins[i] for i in steps.ravel()],
        w,
        solo=packing.solo,
        skipped=packing.skipped,
        repeated=np.asarray(repeated, np.int64),
    )


def deal_over_ranks(packing: Packing, costs, world_size: int) -> Packing:
    """Deal the bins of a one-rank ``packing`` over ``world_size`` ranks, no rank ever empty.

    ``B`` bins, ``W`` ranks, at least ``W`` samples: bins with several samples are split until
    there are ``W`` bins (splitting respects the capacity); then the ``floor(B/W)*W`` costliest
    bins are kept and each of the ``B mod W`` others is merged into the cheapest kept bin at that
    moment (a merged bin may exceed the capacity); every sample stays in exactly one bin; bins are
    sorted by cost and cut into steps as :func:`pack` does. Fewer samples than ranks: every rank
    gets every bin, one step per bin, so each sample is in ``W`` bins. For trainers that average
    per-sample errors gathered from all ranks (mace's validation metrics) the values are those of
    counting each sample once, since every sample is counted the same number of times.
    """
    w = check_world_size(world_size)
    c = np.asarray(costs, dtype=np.float64)
    bins = [np.asarray(b) for b in packing]
    if w <= len(packing.indices):
        bins = _split_bins(bins, w)
    if len(bins) < w:
        log.info(
            "evaluation set of %d sample(s) in %d bin(s) for %d ranks: every rank evaluates all "
            "of them (each sample counted %d times; averages are unchanged)",
            len(packing.indices),
            len(bins),
            w,
            w,
        )
        return packing_from_bins(
            [b for b in bins for _ in range(w)], w, solo=packing.solo, skipped=packing.skipped
        )
    cost = np.array([c[b].sum() for b in bins])
    order = np.argsort(-cost, kind="stable")
    keep = [bins[i] for i in order[: len(bins) // w * w]]
    kept_cost = [float(cost[i]) for i in order[: len(keep)]]
    for i in order[len(keep) :]:
        j = int(np.argmin(kept_cost))
        keep[j] = np.concatenate([keep[j], bins[i]])
        kept_cost[j] += float(cost[i])
    if len(keep) < len(bins):
        log.info(
            "evaluation plan: %d bin(s) merged into others so that each of %d ranks has a batch "
            "at every step (largest bin cost now %g)",
            len(bins) - len(keep),
            w,
            max(kept_cost),
        )
    by_cost = np.argsort(kept_cost, kind="stable")
    return packing_from_bins(
        [keep[i] for i in by_cost], w, solo=packing.solo, skipped=packing.skipped
    )
