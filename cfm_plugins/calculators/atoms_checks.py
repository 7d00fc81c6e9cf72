"""Checks of an ASE structure before a MACE model sees it, with errors that say what is wrong.

mace's own conversion fails on an element the model was not trained on with ``ValueError:
np.int64(26) is not in list``, evaluates a structure with a NaN coordinate to a NaN energy without a
word, and replaces an all-zero cell of a periodic structure by a 1 A cube (an energy of thousands
of eV, without a word). :func:`check_atoms` names the structure, the atoms, the values and what to
do.
"""

from __future__ import annotations

import numpy as np
from ase.data import chemical_symbols

#: atoms listed by index in an error, at most
SHOWN = 8
#: a periodic cell is degenerate when the volume (area, length) its periodic vectors span is at most
#: this fraction of the product of their lengths (1 for orthogonal vectors, however long)
DEGENERATE = 1e-8


def _indices(mask) -> str:
    where = np.flatnonzero(mask)
    shown = ", ".join(str(i) for i in where[:SHOWN])
    return shown + (f", ... ({len(where)} in all)" if len(where) > SHOWN else "")


def _symbol(z: int) -> str:
    return chemical_symbols[z] if 0 <= z < len(chemical_symbols) else f"Z={z}"


def _named(atoms, label: str) -> str:
    """``label`` and the formula, for a message (only on the error path: the formula is not
    free)."""
    return f"{label} ({atoms.get_chemical_formula()})"


def check_atoms(atoms, known_numbers, label: str = "the structure") -> None:
    """Raise ``ValueError`` if ``atoms`` cannot be evaluated by a model of ``known_numbers``.

    Refused: no atoms; an element outside ``known_numbers`` (the model's atomic numbers), named with
    the atoms that carry it and the elements the model knows; a position that is not finite; a
    cell along the periodic directions that is not finite or is degenerate (zero, flat: its
    periodic vectors do not span as many dimensions as there are periodic directions). ``label``
    names the structure in the message (e.g. ``"structure 3 of the list"``).
    """
    numbers = np.asarray(atoms.numbers)
    if len(numbers) == 0:
        raise ValueError(f"{label} has no atoms: give an Atoms object with at least one atom")
    known = sorted(int(z) for z in known_numbers)
    outside = ~np.isin(numbers, known)
    if outside.any():
        unknown = sorted(set(numbers[outside].tolist()))
        parts = "; ".join(f"{_symbol(z)} (atoms {_indices(numbers == z)})" for z in unknown)
        raise ValueError(
            f"{_named(atoms, label)} has elements the model was not trained on: "
            f"{parts}. The model knows {', '.join(_symbol(z) for z in known)}: use a model trained "
            "on these elements (a foundation model covers most of the periodic table)"
        )
    positions = np.asarray(atoms.positions, dtype=float)
    # the sum first (fast: an MD step at 4000 atoms pays microseconds); it overflows only past 1e308
    with np.errstate(over="ignore"):
        suspect = not np.isfinite(positions.sum())
    bad = ~np.isfinite(positions).all(axis=1) if suspect else np.zeros(0, bool)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{_named(atoms, label)} has positions that are not finite: atoms {_indices(bad)} "
            f"(atom {first} at {positions[first].tolist()}). A diverged MD run or an optimiser "
            "step gone wrong leaves NaN or inf behind: start again from the last good structure, "
            "with a smaller time step"
        )
    pbc = np.asarray(atoms.pbc, dtype=bool)
    if not pbc.any():
        return
    cell = np.asarray(atoms.cell[:], dtype=float)
    vectors = cell[pbc]
    problem = None
    if not np.isfinite(vectors).all():
        problem = "is not finite"
    else:
        gram = vectors @ vectors.T
        squared = np.diag(gram)  # the squared lengths; det(gram) is the squared volume they span
        if not squared.any():
            problem = "is zero"
        elif np.linalg.det(gram) <= DEGENERATE**2 * np.prod(squared):
            problem = "is degenerate (a periodic vector is zero, or they are parallel or coplanar)"
    if problem is not None:
        raise ValueError(
            f"{_named(atoms, label)} is periodic along {pbc.tolist()} but its cell {problem}: "
            f"{cell.tolist()}. Set the cell (atoms.set_cell(...)) or, for a molecule or a "
            "cluster, make it non-periodic (atoms.pbc = False)"
        )


__all__ = ["check_atoms"]
