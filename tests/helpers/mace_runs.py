"""Short ``mace_run_train`` runs of a real, unmodified mace-torch for the plugins (helpers of the
tests in ``tests/adapters/mace/``): a tiny CuNi set with EMT labels, mace's command-line arguments
for it, and its epoch losses."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from tests.helpers import BIN

CFM_RUN = str(BIN / "cfm-run")
MACE_RUN_TRAIN = str(BIN / "mace_run_train")


def make_tiny_set(folder: Path, n_train: int = 24, n_valid: int = 6, seed: int = 0) -> None:
    """CuNi cells of 1 to 72 atoms with EMT energies, forces and stress (plus isolated atoms)."""
    from ase import Atoms
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.io import write

    rng = np.random.default_rng(seed)
    frames = []
    for s in ("Cu", "Ni"):
        at = Atoms(s, cell=[20, 20, 20], pbc=False)
        at.calc = EMT()
        at.info.update(REF_energy=at.get_potential_energy(), config_type="IsolatedAtom")
        at.calc = None
        frames.append(at)
    for i in range(n_train + n_valid):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(
            (int(rng.integers(1, 4)), int(rng.integers(1, 3)), 1 + i % 2)
        )
        sym = np.array(a.get_chemical_symbols())
        sym[rng.random(len(a)) < 0.3] = "Ni"
        a.set_chemical_symbols(sym)
        a.rattle(0.05, seed=i)
        a.calc = EMT()
        a.info.update(REF_energy=a.get_potential_energy(), REF_stress=a.get_stress())
        a.arrays["REF_forces"] = a.get_forces()
        a.calc = None
        frames.append(a)
    write(folder / "train.xyz", frames[: 2 + n_train])
    write(folder / "valid.xyz", frames[2 + n_train :])


def mace_args(
    folder: Path, name: str, epochs: int = 2, dtype: str = "float64", batch_size: int = 4
) -> list[str]:
    return [
        f"--name={name}",
        f"--train_file={folder / 'train.xyz'}",
        f"--valid_file={folder / 'valid.xyz'}",
        "--E0s=isolated",
        "--model=MACE",
        "--hidden_irreps=8x0e+8x1o",
        "--r_max=4.0",
        "--max_L=1",
        "--correlation=3",
        "--num_interactions=2",
        f"--max_num_epochs={epochs}",
        f"--batch_size={batch_size}",
        f"--valid_batch_size={batch_size}",
        "--device=cpu",
        f"--default_dtype={dtype}",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--stress_key=REF_stress",
        "--seed=7",
        "--eval_interval=1",
        "--num_workers=0",
        "--save_cpu",
        "--lr=0.01",
        f"--work_dir={folder}",
        f"--model_dir={folder}",
    ]


def epoch_losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"Epoch \d+: head: Default, loss=([0-9.eE+-]+)", log)]


TINY_MODEL = ["--hidden_irreps=8x0e", "--max_L=0", "--correlation=2", "--num_interactions=1"]


def tiny_args(folder: Path, name: str, epochs: int, batch_size: int = 4) -> list[str]:
    """mace_args with the smallest model (these tests check loaders and resuming, not accuracy)."""
    drop = ("--hidden_irreps", "--max_L", "--correlation", "--num_interactions")
    return [
        a
        for a in mace_args(folder, name, epochs=epochs, batch_size=batch_size)
        if not a.startswith(drop)
    ] + TINY_MODEL
