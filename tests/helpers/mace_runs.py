"""Short ``mace_run_train`` runs of a real, unmodified mace-torch for the plugins (helpers of the
tests in ``tests/adapters/mace/``): a tiny CuNi set with EMT labels, mace's command-line arguments
for it, its epoch losses, and the 2-rank run that several test modules read."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from pathlib import Path

import numpy as np

from tests.helpers import BIN, run_mpi

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


SMALL_MODEL = {"--num_interactions=2": "--num_interactions=1", "--correlation=3": "--correlation=2"}


def small(args: list[str]) -> list[str]:
    """mace_args with a smaller model (one interaction, correlation 2): affordable to compile on 2
    cores, and enough where a test checks the plumbing of a run rather than the model."""
    return [SMALL_MODEL.get(a, a) for a in args]


TINY_MODEL = ["--hidden_irreps=8x0e", "--max_L=0", "--correlation=2", "--num_interactions=1"]


def tiny_args(folder: Path, name: str, epochs: int, batch_size: int = 4) -> list[str]:
    """mace_args with the smallest model (these tests check loaders and resuming, not accuracy)."""
    drop = ("--hidden_irreps", "--max_L", "--correlation", "--num_interactions")
    return [
        a
        for a in mace_args(folder, name, epochs=epochs, batch_size=batch_size)
        if not a.startswith(drop)
    ] + TINY_MODEL


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def binpack_fused_run(tmp_path_factory) -> tuple[Path, int, str]:
    """``mpirun -np 2 cfm-run --enable mace,binpack,fused -- mace_run_train`` with the small model
    for 2 epochs on the tiny set, its step logs in ``FOLDER/steps_both``: ``(FOLDER, exit code,
    output)``. Run once per test session and read by the tests of ``test_adapter.py`` (the run
    trains and saves a stock model) and ``test_static.py`` (the unpadded metrics): under
    pytest-xdist by whichever worker asks first, the other waiting for it (a lock in the folder the
    workers share)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, above each worker's own
    folder = base / "mace_binpack_fused"
    with _locked(base / "mace_binpack_fused.lock"):
        done = folder / "run.json"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            make_tiny_set(folder)
            out = run_mpi(
                [
                    CFM_RUN,
                    "--enable",
                    "mace,binpack,fused",
                    "--",
                    "mace_run_train",
                    *small(mace_args(folder, "both")),
                    f"--cfm-step-log={folder / 'steps_both'}",
                ],
                timeout=600,
            )
            done.write_text(json.dumps({"returncode": out.returncode, "stdout": out.stdout}))
        run = json.loads(done.read_text())
    return folder, run["returncode"], run["stdout"]
