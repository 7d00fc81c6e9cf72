"""Checks of an ASE structure before a MACE model sees it, with errors that say what is wrong.

mace's own conversion fails on an element the model was not trained on with ``ValueError:
np.int64(26) is not in list``, and evaluates a structure with a NaN coordinate to a NaN energy
without a word. :func:`check_atoms` names the structure, the atoms, the values and what to do.
"""
from __future__ import annotations

import numpy as np
from ase.data import chemical_symbols

#: atoms listed by index in an error, at most
SHOWN = 8


def _indices(mask) -> str:
    where = np.flatnonzero(mask)
    shown = ", ".join(str(i) for i in where[:SHOWN])
    return shown + (f", ... ({len(where)} in all)" if len(where) > SHOWN else "")


def _symbol(z: int) -> str:
    return chemical_symbols[z] if 0 <= z < len(chemical_symbols) else f"Z={z}"


def _named(atoms, label: str) -> str:
    """``label`` and the formula, for a message (only on the error path: the formula is not free)."""
    return f"{label} ({atoms.get_chemical_formula()})"


def check_atoms(atoms, known_numbers, label: str = "the structure") -> None:
    """Raise ``ValueError`` if ``atoms`` cannot be evaluated by a model of ``known_numbers``.

    Refused: no atoms; an element outside ``known_numbers`` (the model's atomic numbers), named with
    the atoms that carry it and the elements the model knows; a position that is not finite; a
    non-finite cell along a periodic direction. ``label`` names the structure in the message (e.g.
    ``"structure 3 of the list"``).
    """
    numbers = np.asarray(atoms.numbers)
    if len(numbers) == 0:
        raise ValueError(f"{label} has no atoms: give an Atoms object with at least one atom")
    known = sorted(int(z) for z in known_numbers)
    outside = ~np.isin(numbers, known)
    if outside.any():
        unknown = sorted(set(numbers[outside].tolist()))
        parts = "; ".join(f"{_symbol(z)} (atoms {_indices(numbers == z)})" for z in unknown)
        raise ValueError(f"{_named(atoms, label)} has elements the model was not trained on: "
                         f"{parts}. The model knows {', '.join(_symbol(z) for z in known)}: use a model trained "
                         "on these elements (a foundation model covers most of the periodic table)")
    positions = np.asarray(atoms.positions, dtype=float)
    # the sum first (fast: an MD step at 4000 atoms pays microseconds); it overflows only past 1e308
    with np.errstate(over="ignore"):
        suspect = not np.isfinite(positions.sum())
    bad = ~np.isfinite(positions).all(axis=1) if suspect else np.zeros(0, bool)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{_named(atoms, label)} has positions that are not finite: atoms "
                         f"{_indices(bad)} (atom {first} at {positions[first].tolist()}). A diverged MD run or an "
                         "optimiser step gone wrong leaves NaN or inf behind: start again from the last good "
                         "structure, with a smaller time step")
    pbc = np.asarray(atoms.pbc, dtype=bool)
    cell = np.asarray(atoms.cell[:], dtype=float)
    if pbc.any() and not np.isfinite(cell[pbc]).all():
        raise ValueError(f"{_named(atoms, label)} is periodic along {pbc.tolist()} but its cell "
                         f"is not finite: {cell.tolist()}")


__all__ = ["check_atoms"]
