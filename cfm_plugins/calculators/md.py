"""Timed molecular dynamics with any ASE calculator: seconds per VelocityVerlet step.

``examples/md.py`` is the command line (``CFMCalculator`` against mace's ``MACECalculator``); the
demos and ``benchmarks/mace_train.py`` time NequIP's and mace's calculators with the same function.
Needs ASE only.
"""

from __future__ import annotations

import time

import numpy as np
from ase import units
from ase.md.verlet import VelocityVerlet

try:  # ase >= 3.29
    from ase.md.velocitydistribution import thermalize_momenta
except ImportError:  # older ase
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution as thermalize_momenta


def time_md(
    calc,
    atoms,
    steps: int = 20,
    timestep_fs: float = 2.0,
    temperature_K: float = 300.0,
    seed: int = 0,
    warmup: int = 1,
) -> float:
    """Seconds per VelocityVerlet step of ``atoms`` (a copy) with ``calc``, after ``warmup`` steps.

    Velocities are drawn from a Maxwell-Boltzmann distribution with ``seed``, so two calculators
    timed with the same arguments run the same trajectory (up to their numerical differences).
    """
    atoms = atoms.copy()
    atoms.calc = calc
    thermalize_momenta(atoms, temperature_K=temperature_K, rng=np.random.default_rng(seed))
    dyn = VelocityVerlet(atoms, timestep=timestep_fs * units.fs)
    if warmup:
        dyn.run(warmup)  # first evaluation: allocations, one-off set-up
    t0 = time.perf_counter()
    dyn.run(steps)
    return (time.perf_counter() - t0) / max(steps, 1)
