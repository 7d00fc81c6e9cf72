"""A neighbour list kept between MD steps: built with a skin, filtered at each step.

mace's calculator builds the neighbour list of every structure it evaluates from scratch (matscipy,
on the CPU). In MD the atoms move little per step, so :class:`SkinNeighbourList` builds the list
with ``cutoff + skin`` (mace's own ``get_neighborhood``, so the same pairs and periodic shifts),
and at each later step keeps the candidate pairs closer than ``cutoff`` at the current positions.
That is exactly the list a fresh build gives, as long as no atom has moved more than ``skin / 2``
since the build: a pair outside ``cutoff + skin`` then, whose two atoms each moved less than
``skin / 2``, is still outside ``cutoff`` (the Verlet-list argument). When one has, or the cell,
the periodic directions or the number of atoms changed, the list is built again.

Only the order of the pairs may differ from a fresh build's (each atom's neighbours in the order
the candidates had), which changes sums over edges at round-off level.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

__all__ = ["SkinNeighbourList", "check_skin", "default_skin", "CUDA_SKIN"]

#: the skin ``CFMCalculator(skin="auto")`` keeps on CUDA (Angstrom): an H100 timed MD at 4000 atoms
#: with it in 0.38x the step without, and in 0.19x with the step captured (docs/benchmarks.md)
CUDA_SKIN = 1.0

#: ``build(positions, cutoff, pbc, cell) -> (edge_index [2, E], shifts [E, 3], unit_shifts [E, 3],
# cell)``
Build = Callable[..., tuple]


def check_skin(skin) -> float:
    """``skin`` as a float, or a ValueError saying what is expected."""
    try:
        value = float(skin)
    except (TypeError, ValueError):
        raise ValueError(
            f"skin must be a distance in Angstrom (a number >= 0), got {skin!r}"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(
            "skin must be a finite distance >= 0 (Angstrom; 0 rebuilds the neighbour list at "
            f"every step), got {skin!r}; 0.5-2 A suits MD at room temperature with 1-2 fs steps"
        )
    return value


def default_skin(skin, device, compile_mode=None) -> float | None:
    """The skin of ``CFMCalculator(skin=...)``: ``"auto"`` is :data:`CUDA_SKIN` on a CUDA device and
    ``None`` (mace's conversion at every evaluation) elsewhere or with mace's ``compile_mode``,
    which
    pads its batches its own way; ``None`` stays; a number is checked (:func:`check_skin`)."""
    if isinstance(skin, str):
        if skin != "auto":
            raise ValueError(
                f"skin must be 'auto', None or a distance in Angstrom (a number >= 0), got {skin!r}"
            )
        on_cuda = str(device).startswith("cuda")
        return CUDA_SKIN if on_cuda and compile_mode is None else None
    return None if skin is None else check_skin(skin)


def _mace_build(positions, cutoff, pbc, cell):
    from mace.data.neighborhood import get_neighborhood

    return get_neighborhood(positions=positions, cutoff=cutoff, pbc=pbc, cell=cell)


class SkinNeighbourList:
    """Pairs closer than ``cutoff``, from a list built with ``cutoff + skin`` and kept while it
    holds.

    Args:
        cutoff: the model's cutoff (Angstrom).
        skin: the margin of the kept list (Angstrom, >= 0; 0 builds at every call).
        build: the neighbour list builder (default: mace's ``get_neighborhood``).

    ``builds`` and ``reuses`` count what :meth:`edges` did. The kept pairs are torch tensors on the
    CPU, filtered with torch's kernels (at 4000 atoms and a 6 A cutoff, 14 ms on 2 cores, where
    numpy's fancy indexing took 30).
    """

    def __init__(self, cutoff: float, skin: float, build: Build | None = None):
        self.cutoff = float(cutoff)
        self.skin = check_skin(skin)
        self._build = build or _mace_build
        self.builds = 0
        self.reuses = 0
        self._key = None  # (number of atoms, pbc, cell) of the kept list
        self._ref = None  # positions at the build [N, 3], float64 tensor
        self._pairs = (
            None  # (edge_index [2, E], unit_shifts [E, 3], shifts [E, 3]) within cutoff + skin
        )

    def _matches(self, positions: torch.Tensor, pbc: tuple, cell: np.ndarray) -> bool:
        if self._key is None or self.skin == 0:
            return False
        n, kept_pbc, kept_cell = self._key
        if len(positions) != n or pbc != kept_pbc or not np.array_equal(cell, kept_cell):
            return False
        moved = (positions - self._ref).square().sum(1).max() if n else torch.tensor(0.0)
        return bool(moved < (self.skin / 2) ** 2)

    def edges(
        self, positions, pbc, cell, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(edge_index [2, E] int64, shifts [E, 3], unit_shifts [E, 3])`` (CPU tensors, the shifts
        in ``dtype``) of the pairs closer than the cutoff: what mace's ``get_neighborhood(positions,
        cutoff, pbc, cell)`` returns, up to the order of the pairs. ``cell`` may be None (nothing
        periodic)."""
        positions = torch.as_tensor(np.asarray(positions, dtype=float))
        pbc = tuple(bool(p) for p in pbc)
        cell = np.zeros((3, 3)) if cell is None else np.array(cell, dtype=float)
        if self._matches(positions, pbc, cell):
            self.reuses += 1
        else:
            self._rebuild(positions, pbc, cell)
        edge_index, unit_shifts, shifts = self._pairs
        d = (
            positions.index_select(0, edge_index[1])
            - positions.index_select(0, edge_index[0])
            + shifts
        )
        keep = torch.nonzero(d.square().sum(1) < self.cutoff**2).squeeze(1)
        return (
            edge_index.index_select(1, keep),
            shifts.index_select(0, keep).to(dtype),
            unit_shifts.index_select(0, keep).to(dtype),
        )

    def _rebuild(self, positions: torch.Tensor, pbc: tuple, cell: np.ndarray) -> None:
        # get_neighborhood may write into the cell it is given (non-periodic directions): a copy
        edge_index, shifts, unit_shifts, _ = self._build(
            positions.numpy(), self.cutoff + self.skin, pbc, cell.copy()
        )
        self._pairs = (
            torch.as_tensor(np.ascontiguousarray(edge_index), dtype=torch.long),
            torch.as_tensor(np.asarray(unit_shifts, dtype=float)),
            torch.as_tensor(np.asarray(shifts, dtype=float)),
        )
        self._key, self._ref = (len(positions), pbc, cell), positions.clone()
        self.builds += 1
