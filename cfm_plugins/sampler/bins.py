"""The plan every packer returns (:class:`Packing`) and what packers share to build one.

A leaf of the sampler: numpy only, no import of the other sampler modules. The packers
(:func:`~cfm_plugins.sampler.packing.pack`, :func:`~cfm_plugins.sampler.packing.pack_even`,
:func:`~cfm_plugins.sampler.even_dims.pack_even_dims`, ...) check their inputs with
:func:`validate_costs`, :func:`check_capacity` and :func:`check_world_size`, and turn dealt bins
into a plan with :func:`arrange_steps` (bins sorted by cost, or by the sums of ``step_sizes``
(:func:`validate_step_sizes`), cut into steps of ``world_size``) or :func:`packing_from_bins`
(bins already in step order).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

# --------------------------------------------------------------------------------------------
# The result


@dataclass(eq=False)
class Packing:
    """A plan: bins of sample indices in CSR form, cut into steps of ``world_size`` bins.

    ``indices[offsets[b]:offsets[b+1]]`` are the samples of bin ``b`` (indices into the costs
    the packer was given); bins ``[s*world_size:(s+1)*world_size]`` form step ``s``, bin
    ``s*world_size + r`` going to rank ``r``. Iterating yields the bins in order; ``plan[b]`` is
    bin ``b``; ``len(plan)`` is the number of bins.

    Args:
        indices: the samples of every bin, bin after bin.
        offsets: ``num_bins + 1`` CSR offsets into ``indices``, from 0 to ``len(indices)``.
        world_size: ranks (bins per step).
        solo: oversize samples placed alone in a bin (``oversize="solo"``).
        skipped: oversize samples dropped (``oversize="skip"``).
        repeated: samples placed a second time so that every rank has a batch at every step
            (``repeat=True``), once per extra copy.
        capacity: the capacity the bins were dealt to (no bin exceeds it but ``solo`` ones and
            the merged bins of a tiny evaluation set; :func:`~cfm_plugins.sampler.packing.pack_even`
            lowers it); ``None``: not known.
        limits: for bins even in several sizes
            (:func:`~cfm_plugins.sampler.even_dims.pack_even_dims`) the limit of each, the
            cost's first; no bin but a ``solo`` one exceeds them. ``None``: one cost.

    Raises:
        ValueError: ``offsets`` that do not start at 0 and end at ``len(indices)``.
    """

    indices: np.ndarray
    offsets: np.ndarray
    world_size: int = 1
    solo: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    skipped: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    repeated: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    capacity: float | None = None
    limits: tuple | None = None

    def __post_init__(self):
        self.indices = np.ascontiguousarray(self.indices, dtype=np.int64)
        self.offsets = np.ascontiguousarray(self.offsets, dtype=np.int64)
        if (
            self.offsets.ndim != 1
            or len(self.offsets) < 1
            or self.offsets[0] != 0
            or self.offsets[-1] != len(self.indices)
        ):
            raise ValueError("Packing: offsets must start at 0 and end at len(indices)")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __iter__(self):
        for b in range(len(self)):
            yield self.indices[self.offsets[b] : self.offsets[b + 1]]

    def __getitem__(self, b: int) -> np.ndarray:
        if b < 0:
            b += len(self)
        if not 0 <= b < len(self):
            raise IndexError(f"bin {b} out of range ({len(self)} bins)")
        return self.indices[self.offsets[b] : self.offsets[b + 1]]

    @property
    def num_bins(self) -> int:
        return len(self)

    def bin_sizes(self) -> np.ndarray:
        """Number of samples in each bin."""
        return np.diff(self.offsets)

    def bin_ids(self) -> np.ndarray:
        """The bin of each entry of ``indices``."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.bin_sizes())

    def bin_costs(self, costs) -> np.ndarray:
        """Total cost of each bin (``costs`` indexed like the array given to :func:`pack`)."""
        costs = np.asarray(costs, dtype=np.float64)
        return np.bincount(self.bin_ids(), weights=costs[self.indices], minlength=len(self))

    def num_steps(self, world_size: int | None = None) -> int:
        w = self.world_size if world_size is None else int(world_size)
        if len(self) % w:
            raise ValueError(f"{len(self)} bins do not split into steps of {w} ranks")
        return len(self) // w

    def step(self, s: int, world_size: int | None = None) -> list[np.ndarray]:
        """The bins of step ``s``: element ``r`` goes to rank ``r``."""
        w = self.world_size if world_size is None else int(world_size)
        return [self[b] for b in range(s * w, (s + 1) * w)]

    def step_costs(self, costs, world_size: int | None = None) -> np.ndarray:
        """Bin costs as a ``(num_steps, world_size)`` matrix."""
        w = self.world_size if world_size is None else int(world_size)
        return self.bin_costs(costs).reshape(self.num_steps(w), w)

    def rank_bins(self, rank: int, world_size: int | None = None) -> list[np.ndarray]:
        """The batches of one rank, in step order."""
        w = self.world_size if world_size is None else int(world_size)
        return [self[b] for b in range(rank, len(self), w)]

    def sample_bins(self, num_samples: int) -> np.ndarray:
        """For each sample, its bin (``-1`` if it is in none; the last bin if it is in several)."""
        out = np.full(int(num_samples), -1, dtype=np.int64)
        out[self.indices] = self.bin_ids()
        return out

    def checksum(self) -> str:
        """A digest of the plan (bins, their order and content); equal plans have equal digests."""
        h = hashlib.blake2b(digest_size=16)
        h.update(np.int64(self.world_size).tobytes())
        h.update(self.offsets.tobytes())
        h.update(self.indices.tobytes())
        return h.hexdigest()


def offsets_from_counts(counts) -> np.ndarray:
    """CSR offsets (``len(counts) + 1`` entries, starting at 0) of bins holding ``counts`` samples
    each."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def packing_from_bins(bins, world_size: int, **kwargs) -> Packing:
    """A :class:`Packing` whose bins are ``bins`` (index arrays, in step order)."""
    counts = [len(b) for b in bins]
    indices = (
        np.concatenate([np.asarray(b, np.int64) for b in bins])
        if len(bins)
        else np.zeros(0, np.int64)
    )
    return Packing(indices, offsets_from_counts(counts), world_size=world_size, **kwargs)


# --------------------------------------------------------------------------------------------
# Input checks


def validate_costs(costs) -> np.ndarray:
    """``costs`` as a float64 vector; ``ValueError`` naming the first bad sample otherwise."""
    arr = np.asarray(costs)
    if arr.ndim != 1:
        raise ValueError(f"costs must be a 1-D array of per-sample costs, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("costs is empty: the dataset has no samples to batch")
    return _finite_numbers(
        arr,
        "costs",
        "cost",
        "> 0",
        "; check the atom/edge counts of these samples or remove them from the dataset",
    )


def _finite_numbers(arr: np.ndarray, name: str, what: str, rule: str, hint: str = ""):
    """``arr`` as float64, finite and ``rule`` (``"> 0"`` or ``">= 0"``); ``ValueError`` naming
    the first bad sample otherwise."""
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    arr = arr.astype(np.float64, copy=False)
    bad = ~np.isfinite(arr) | ((arr <= 0) if rule == "> 0" else (arr < 0))
    if bad.any():
        where = np.flatnonzero(bad)
        i = int(where[0])
        raise ValueError(
            f"sample {i} has {what} {float(arr[i])!r}: every {what} must be finite and {rule} "
            f"({len(where)} bad sample(s), first ones {where[:5].tolist()}){hint}"
        )
    return arr


def validate_step_sizes(step_sizes, n: int) -> np.ndarray | None:
    """``step_sizes`` (``None`` or one size per sample, finite and >= 0) as a float64 vector;
    ``ValueError`` naming the first bad sample otherwise."""
    if step_sizes is None:
        return None
    arr = np.asarray(step_sizes)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(
            f"step_sizes must hold one size per sample ({n}), got shape {np.shape(step_sizes)}"
        )
    return _finite_numbers(arr, "step_sizes", "step size", ">= 0")


def check_capacity(capacity) -> float:
    try:
        cap = float(capacity)
    except (TypeError, ValueError):
        raise ValueError(f"capacity must be a positive number, got {capacity!r}") from None
    if not math.isfinite(cap) or cap <= 0:
        raise ValueError(f"capacity must be a finite number > 0, got {capacity!r}")
    return cap


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or int(world_size) != world_size or int(world_size) < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    return int(world_size)


# --------------------------------------------------------------------------------------------
# Steps


def arrange_steps(
    order, sizes, item_bin, slot, n_bins, w, rng, solo, skipped, capacity=None, step_sizes=None
) -> Packing:
    """The plan of samples dealt into bins: bins sorted by cost and cut into steps of ``w``
    (ranks of a step get bins of nearly equal cost), the step order and the bin-to-rank mapping
    shuffled with ``rng``. With ``step_sizes`` the bins are sorted by their sums of it instead
    (full bins all cost about the capacity in atoms; sorted by their edges, the ranks of a step
    get bins of nearly equal edges too).

    No sort over the samples: each goes to ``offsets[its bin's position] + its slot``. Inside a
    bin samples keep the order they were dealt in; the batch sampler shuffles each batch as it
    yields it.

    Args:
        order: the sample of each dealt entry (indices into the packer's costs).
        sizes: the cost of each entry of ``order``.
        item_bin, slot: each entry's bin (``0..n_bins-1``) and its position in that bin.
        n_bins: the number of bins, a multiple of ``w``.
        w: ranks (bins per step).
        rng: a ``numpy.random.Generator``, or ``None`` for the deterministic order.
        solo, skipped, capacity: recorded in the plan (see :class:`Packing`).
        step_sizes: ``None``, or a size per sample (indexed like the packer's costs, checked by
            :func:`validate_step_sizes`) whose bin sums choose the bins of each step.

    Returns:
        The :class:`Packing`.
    """
    key = sizes if step_sizes is None else np.asarray(step_sizes, np.float64)[order]
    bin_cost = np.bincount(item_bin, weights=key, minlength=n_bins)
    if rng is None:
        by_cost = np.argsort(bin_cost, kind="stable")
    else:
        p = rng.permutation(n_bins)
        by_cost = p[np.argsort(bin_cost[p], kind="stable")]
    steps = by_cost.reshape(n_bins // w, w)
    if rng is not None:
        steps = rng.permuted(steps[rng.permutation(len(steps))], axis=1)
    pos = np.empty(n_bins, dtype=np.int64)
    pos[steps.ravel()] = np.arange(n_bins, dtype=np.int64)
    counts = np.bincount(item_bin, minlength=n_bins)
    offsets = offsets_from_counts(counts[steps.ravel()])
    dest = offsets[pos[item_bin]]
    dest += slot
    indices = np.empty(len(order), dtype=np.int64)
    indices[dest] = order
    return Packing(
        indices,
        offsets,
        world_size=w,
        solo=np.asarray(solo, np.int64),
        skipped=np.asarray(skipped, np.int64),
        capacity=capacity,
    )
