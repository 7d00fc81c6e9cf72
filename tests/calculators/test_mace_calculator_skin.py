"""CFMCalculator(skin=...): MD with the neighbour list kept between steps follows the trajectory of
mace's conversion from scratch; a bad skin is refused when the calculator is made."""
from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.calculators import CFMCalculator
from tests.helpers.mace_models import structures


@pytest.mark.parametrize("static_shapes", [False, True], ids=["eager", "padded"])
def test_md_with_a_kept_neighbour_list_follows_the_same_trajectory(model_files, static_shapes):
    """VelocityVerlet with skin=1: the forces of every step equal those of a calculator that builds
    the list from scratch, to round-off, also padded to static shapes (the captured path's input);
    the list is built a few times only."""
    from ase import units
    from ase.md.verlet import VelocityVerlet

    atoms = structures()[0]
    runs = {}
    for skin in (None, 1.0):
        calc = CFMCalculator(str(model_files["m64"]), device="cpu", default_dtype="float64", skin=skin,
                             static_shapes=static_shapes)
        a = atoms.copy()
        a.calc = calc
        a.set_velocities(np.random.default_rng(0).normal(scale=0.02, size=a.positions.shape))
        forces, energies = [], []
        dyn = VelocityVerlet(a, timestep=2 * units.fs)
        dyn.attach(lambda a=a: (forces.append(a.get_forces()), energies.append(a.get_potential_energy())))
        dyn.run(8)
        runs[skin] = (np.array(forces), np.array(energies), calc)
    (f0, e0, _), (f1, e1, calc) = runs[None], runs[1.0]
    np.testing.assert_allclose(f1, f0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(e1, e0, rtol=1e-12)
    nl = calc.md_graphs.neighbours
    assert nl.builds >= 1 and nl.reuses >= 5, (nl.builds, nl.reuses)


def test_skin_is_checked_when_the_calculator_is_made(model_files):
    with pytest.raises(ValueError, match="skin must be a finite distance >= 0"):
        CFMCalculator(str(model_files["m64"]), device="cpu", skin=-1)
    with pytest.raises(ValueError, match="compile_mode"):
        CFMCalculator(str(model_files["m64"]), device="cpu", skin=1.0, fused=False, compile_mode="default")
