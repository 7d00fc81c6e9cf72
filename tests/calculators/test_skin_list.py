"""SkinNeighbourList: the pairs of a neighbour list built with a skin and kept, at every step the
pairs of mace's list built from scratch; built again when atoms moved far or the cell changed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mace.data.neighborhood import get_neighborhood

from cfm_plugins.calculators.skin_list import SkinNeighbourList, check_skin
from tests.helpers.mace_models import random_walk, structures

CUTOFF = 5.0


def edge_set(edge_index, unit_shifts) -> set:
    edge_index, unit_shifts = np.asarray(edge_index), np.rint(np.asarray(unit_shifts)).astype(int)
    return {
        (int(i), int(j), *map(int, s)) for i, j, s in zip(edge_index[0], edge_index[1], unit_shifts)
    }


def fresh(positions, pbc, cell):
    edge_index, _, unit_shifts, _ = get_neighborhood(
        positions, CUTOFF, tuple(bool(p) for p in pbc), np.array(cell)
    )
    return edge_set(edge_index, unit_shifts)


@pytest.mark.parametrize(
    "index", range(5), ids=["cubic", "primitive", "slab", "cluster", "hand-made"]
)
def test_kept_list_has_a_fresh_lists_edges_at_every_step_and_is_rebuilt_when_atoms_moved_far(index):
    atoms = structures()[index]
    nl = SkinNeighbourList(CUTOFF, skin=1.0)
    for positions in random_walk(atoms, 12, 0.03):
        edge_index, shifts, unit_shifts = nl.edges(positions, atoms.pbc, atoms.cell.array)
        assert edge_set(edge_index, unit_shifts) == fresh(positions, atoms.pbc, atoms.cell.array)
        assert len(edge_set(edge_index, unit_shifts)) == edge_index.shape[1]  # no pair twice
        assert edge_index.dtype == torch.long and shifts.dtype == unit_shifts.dtype == torch.float64
        np.testing.assert_allclose(
            shifts.numpy(), unit_shifts.numpy() @ atoms.cell.array, atol=1e-12
        )
    assert nl.builds < nl.reuses  # about 0.1 A per atom over 12 steps: mostly kept
    moved = atoms.positions.copy()
    moved[0] += 0.6  # more than skin / 2
    edge_index, _, unit_shifts = nl.edges(moved, atoms.pbc, atoms.cell.array)
    builds = nl.builds
    assert edge_set(edge_index, unit_shifts) == fresh(moved, atoms.pbc, atoms.cell.array)
    nl.edges(moved, atoms.pbc, atoms.cell.array)
    assert nl.builds == builds  # then kept again


def test_a_changed_cell_periodicity_or_atom_count_builds_the_list_again():
    atoms = structures()[0]
    nl = SkinNeighbourList(CUTOFF, skin=1.0)
    nl.edges(atoms.positions, atoms.pbc, atoms.cell.array)
    strained = atoms.cell.array * 1.01
    edge_index, _, unit_shifts = nl.edges(atoms.positions, atoms.pbc, strained)
    assert nl.builds == 2 and edge_set(edge_index, unit_shifts) == fresh(
        atoms.positions, atoms.pbc, strained
    )
    nl.edges(atoms.positions, (True, True, False), strained)
    nl.edges(atoms.positions[:-1], (True, True, False), strained)
    assert nl.builds == 4 and nl.reuses == 0


def test_skin_zero_builds_at_every_step_and_bad_skins_say_what_is_expected():
    atoms = structures()[1]
    nl = SkinNeighbourList(CUTOFF, skin=0)
    for positions in random_walk(atoms, 3, 0.01):
        edge_index, _, unit_shifts = nl.edges(positions, atoms.pbc, atoms.cell.array)
        assert edge_set(edge_index, unit_shifts) == fresh(positions, atoms.pbc, atoms.cell.array)
    assert (nl.builds, nl.reuses) == (3, 0)
    for bad in (-0.5, float("nan"), float("inf"), "wide", None):
        with pytest.raises(ValueError, match="skin must be"):
            check_skin(bad)
    assert check_skin("1.5") == 1.5
