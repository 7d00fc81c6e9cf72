"""check_atoms alone (no model): what it refuses, what it lets through, how it names the atoms."""

from __future__ import annotations

import numpy as np
import pytest
from ase import Atoms
from ase.build import bulk

from cfm_plugins.calculators.atoms_checks import SHOWN, check_atoms

CUNI = (28, 29)


def cell(n=2):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((n, n, n))
    atoms.symbols[::2] = "Ni"
    return atoms


def test_good_structures_pass():
    check_atoms(cell(), CUNI)
    cluster = Atoms("CuNi", positions=[[0, 0, 0], [2.5, 0, 0]])  # no cell, not periodic
    check_atoms(cluster, CUNI)
    far = cell()
    far.positions += 1e307  # finite, however far: only the sum overflows, not a coordinate
    check_atoms(far, CUNI)


def test_unknown_elements_name_every_element_and_at_most_shown_atoms():
    atoms = cell(3)  # 108 atoms
    atoms.symbols[: SHOWN + 4] = "Fe"
    atoms.symbols[-1] = "O"
    with pytest.raises(ValueError) as err:
        check_atoms(atoms, CUNI, "frame 7")
    msg = str(err.value)
    assert msg.startswith("frame 7 (")
    shown = ", ".join(str(i) for i in range(SHOWN))
    assert (
        f"O (atoms {len(atoms) - 1}); Fe (atoms {shown}, ... ({SHOWN + 4} in all))" in msg
    )  # by atomic number
    assert "The model knows Ni, Cu" in msg


def test_non_finite_positions_and_periodic_cells_are_refused():
    atoms = cell()
    atoms.positions[[2, 6], 0] = [np.inf, -np.inf]
    with pytest.raises(ValueError, match=r"not finite: atoms 2, 6 \(atom 2 at \[inf, "):
        check_atoms(atoms, CUNI)
    atoms = cell()
    atoms.cell[2, 2] = np.nan
    with pytest.raises(ValueError, match="periodic along .* but its cell is not finite"):
        check_atoms(atoms, CUNI)
    atoms.pbc = [True, True, False]  # the NaN row is along a direction that is not periodic
    check_atoms(atoms, CUNI)


def test_no_atoms_is_refused():
    with pytest.raises(ValueError, match="the structure has no atoms"):
        check_atoms(Atoms(), CUNI)


def test_zero_and_flat_periodic_cells_are_refused():
    # mace alone turns an all-zero periodic cell into a 1 A cube: an energy of thousands of eV
    atoms = cell()
    atoms.set_cell(np.zeros((3, 3)))
    zero = r"periodic along \[True, True, True\] but its cell is zero: .*atoms.pbc = False"
    with pytest.raises(ValueError, match=zero):
        check_atoms(atoms, CUNI)
    atoms = cell()
    atoms.cell[2] = (
        atoms.cell[0] + atoms.cell[1]
    )  # coplanar: mace's neighbour list said 'Singular matrix'
    with pytest.raises(ValueError, match="its cell is degenerate"):
        check_atoms(atoms, CUNI)
    one_zero = cell()
    one_zero.cell[1] = 0
    with pytest.raises(ValueError, match=r"its cell is degenerate \(a periodic vector is zero"):
        check_atoms(one_zero, CUNI)
    atoms.pbc = [
        True,
        True,
        False,
    ]  # a slab: the third vector is not periodic, the other two span a plane
    check_atoms(atoms, CUNI)
    atoms.pbc = [True, False, True]  # a wire and a slab need only their own periodic vectors
    check_atoms(atoms, CUNI)
    cluster = Atoms("CuNi", positions=[[0, 0, 0], [2.5, 0, 0]], cell=np.zeros((3, 3)), pbc=False)
    check_atoms(cluster, CUNI)
    long_cell = cell()
    long_cell.cell[2] *= 1000  # elongated is fine: only degenerate is refused
    check_atoms(long_cell, CUNI)
