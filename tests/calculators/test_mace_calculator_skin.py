"""CFMCalculator(skin=...): MD with the neighbour list kept between steps follows the trajectory of
mace's conversion from scratch; the default keeps it on CUDA only; a bad skin is refused when the
calculator is made."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cfm_plugins.calculators import CFMCalculator
from cfm_plugins.calculators.skin_list import CUDA_SKIN, default_skin
from tests.helpers.mace_models import structures


def md_run(calc, atoms, steps: int = 8):
    """(forces [steps + 1, N, 3], energies) of VelocityVerlet (2 fs) from ``atoms`` with seeded
    velocities."""
    from ase import units
    from ase.md.verlet import VelocityVerlet

    a = atoms.copy()
    a.calc = calc
    a.set_velocities(np.random.default_rng(0).normal(scale=0.02, size=a.positions.shape))
    forces, energies = [], []
    dyn = VelocityVerlet(a, timestep=2 * units.fs)
    dyn.attach(
        lambda a=a: (forces.append(a.get_forces()), energies.append(a.get_potential_energy()))
    )
    dyn.run(steps)
    return np.array(forces), np.array(energies)


@pytest.mark.parametrize("static_shapes", [False, True], ids=["eager", "padded"])
def test_md_with_a_kept_neighbour_list_follows_the_same_trajectory(model_files, static_shapes):
    """VelocityVerlet with skin=1: the forces of every step equal those of a calculator that builds
    the list from scratch, to round-off, also padded to static shapes (the captured path's input);
    the list is built a few times only."""
    atoms = structures()[0]
    runs = {}
    for skin in (None, 1.0):
        calc = CFMCalculator(
            str(model_files["m64"]),
            device="cpu",
            default_dtype="float64",
            skin=skin,
            static_shapes=static_shapes,
        )
        runs[skin] = (*md_run(calc, atoms), calc)
    (f0, e0, _), (f1, e1, calc) = runs[None], runs[1.0]
    np.testing.assert_allclose(f1, f0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(e1, e0, rtol=1e-12)
    nl = calc.md_graphs.neighbours
    assert nl.builds >= 1 and nl.reuses >= 5, (nl.builds, nl.reuses)


def test_skin_is_checked_when_the_calculator_is_made(model_files):
    with pytest.raises(ValueError, match="skin must be a finite distance >= 0"):
        CFMCalculator(str(model_files["m64"]), device="cpu", skin=-1)
    with pytest.raises(ValueError, match="compile_mode"):
        CFMCalculator(
            str(model_files["m64"]), device="cpu", skin=1.0, fused=False, compile_mode="default"
        )


def test_the_default_skin_is_kept_on_cuda_only():
    """``skin="auto"`` (the default): CUDA_SKIN on a CUDA device, none on a CPU or with mace's
    compile_mode; None and numbers pass through, checked."""
    for device in ("cuda", "cuda:1", torch.device("cuda", 0)):
        assert default_skin("auto", device) == CUDA_SKIN == 1.0
    assert default_skin("auto", "cuda", compile_mode="default") is None
    assert default_skin("auto", "cpu") is None and default_skin("auto", torch.device("cpu")) is None
    assert default_skin(None, "cuda") is None
    assert default_skin(0.5, "cpu") == 0.5
    with pytest.raises(ValueError, match="skin must be 'auto', None or a distance"):
        default_skin("on", "cuda")
    with pytest.raises(ValueError, match="finite distance >= 0"):
        default_skin(float("nan"), "cuda")


def test_on_a_cpu_the_default_converts_every_evaluation_as_mace(model_files):
    assert CFMCalculator(str(model_files["m64"]), device="cpu").md_graphs is None


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (the default skin applies on cuda)"
)
def test_cuda_keeps_the_list_by_default_and_follows_the_same_trajectory(model_files):
    """On cuda the default keeps the neighbour list (skin 1.0): float64 MD forces equal those of a
    calculator that converts every step (skin=None), to round-off."""
    atoms = structures()[0]
    auto = CFMCalculator(str(model_files["m64"]), device="cuda", default_dtype="float64")
    assert auto.md_graphs is not None and auto.md_graphs.neighbours.skin == CUDA_SKIN
    f1, e1 = md_run(auto, atoms)
    f0, e0 = md_run(
        CFMCalculator(str(model_files["m64"]), device="cuda", default_dtype="float64", skin=None),
        atoms,
    )
    np.testing.assert_allclose(f1, f0, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(e1, e0, rtol=1e-12)
    assert auto.md_graphs.neighbours.reuses >= 5
