"""Short ``mace_run_train`` runs of a real, unmodified mace-torch for the plugins (helpers of the
tests in ``tests/adapters/mace/``): a tiny CuNi set with EMT labels, mace's command-line arguments
for it, its epoch losses, the 2-rank run that several test modules read, and the launcher runs
(one tiny run under mpirun, torchrun and srun's variables) with their comparison."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np

from cfm_plugins.testing import run_as_srun_tasks, torchrun_command
from tests.helpers import BIN, ROOT, clean_env, run_mpi, run_process

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


def run_tiny(
    folder: Path, enable: str, options=(), extra=(), epochs: int = 1
) -> subprocess.CompletedProcess:
    """One process: ``cfm-run --enable ENABLE OPTIONS -- mace_run_train`` with :func:`tiny_args`
    (and ``extra``) in ``folder``; its output (stdout and stderr) in ``.stdout``."""
    return run_process(
        [CFM_RUN, "--enable", enable, *options, "--", "mace_run_train"]
        + [*tiny_args(folder, "x", epochs), *extra],
        timeout=570,
        cwd=folder,
    )


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
                timeout=570,
            )
            done.write_text(json.dumps({"returncode": out.returncode, "stdout": out.stdout}))
        run = json.loads(done.read_text())
    return folder, run["returncode"], run["stdout"]


# ------------------------------------------------------------------ one run, several launchers
# The launcher tests (tests/test_launchers.py) and the GPU test of ranks sharing a GPU
# (tests/test_distributed.py) train one tiny float64 model on 2 ranks under each launcher and
# compare with the mpirun run: the same plan (the capacity pinned: its default depends on the
# device), the same seeds, so the same losses, weights and batches.

LAUNCH_MODEL = ["--hidden_irreps=8x0e+8x1o", "--max_L=1", "--correlation=2", "--num_interactions=1"]
LAUNCH_OPTIONS = ["--enable", "mace,binpack,fused", "-o", "max_tokens=100"]
LAUNCHERS = ("mpirun", "torchrun", "srun")


def launch_args(folder: Path, device: str = "cpu") -> list[str]:
    """mace_run_train's arguments of the launcher runs: the tiny model, 2 epochs, float64."""
    drop = ("--hidden_irreps", "--max_L", "--correlation", "--num_interactions")
    args = [a for a in mace_args(folder, "launch", epochs=2) if not a.startswith(drop)]
    return [f"--device={device}" if a == "--device=cpu" else a for a in args] + LAUNCH_MODEL


def launched_run(
    tmp_path_factory, launcher: str = "mpirun", device: str = "cpu", options=(), env=None
) -> tuple[Path, int, str]:
    """``cfm-run --enable mace,binpack,fused -o max_tokens=100 [options] -- mace_run_train`` on 2
    ranks started by ``launcher`` (mpirun; torchrun; srun: two processes with srun's variables)
    with the tiny model on ``device``, its step logs in ``FOLDER/steps``: ``(FOLDER, exit code,
    output)``, run once per test session and name (as :func:`binpack_fused_run`). ``env``: extra
    variables of the ranks (``{"CUDA_VISIBLE_DEVICES": "0"}``)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    env = dict(env or {})
    name = "_".join(
        ["launch", launcher, device]
        + [o.replace("=", "-") for o in options if o != "-o"]
        + [f"{k}-{v}" for k, v in sorted(env.items())]
    )

    def run(folder: Path) -> tuple[int, str]:
        make_tiny_set(folder, n_train=12, n_valid=4)
        cfm = [CFM_RUN, *LAUNCH_OPTIONS, *options, "--"]
        trainer = ["mace_run_train", *launch_args(folder, device), f"--cfm-step-log={folder}/steps"]
        if launcher == "mpirun":
            out = run_mpi(cfm + trainer, timeout=570, env=clean_env(**env))
            return out.returncode, out.stdout
        if launcher == "torchrun":
            out = subprocess.run(
                [*torchrun_command(2), *cfm, *trainer],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=570,
                env=clean_env(**env),
                cwd=ROOT,
            )
            return out.returncode, out.stdout
        tasks = run_as_srun_tasks(
            cfm + trainer, 2, step=LAUNCHERS.index(launcher), timeout=570, **env
        )
        return max(abs(code) for code, _ in tasks), "".join(text for _, text in tasks)

    return _shared_run(tmp_path_factory, name, run)


def _shared_run(tmp_path_factory, name: str, run) -> tuple[Path, int, str]:
    """``run(FOLDER) -> (exit code, output)`` once per test session (the first worker to ask runs
    it, the others wait on a lock in the folder they share); ``(FOLDER, exit code, output)``."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    with _locked(base / f"{name}.lock"):
        done = folder / "run.json"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            code, output = run(folder)
            done.write_text(json.dumps({"returncode": code, "stdout": output}))
        result = json.loads(done.read_text())
    return folder, result["returncode"], result["stdout"]


def step_records(folder: Path, ranks: int = 2) -> dict[int, list[dict]]:
    """Each rank's step log (``--cfm-step-log=FOLDER/steps``): its records in order."""
    return {
        r: [json.loads(line) for line in (folder / f"steps.rank{r}.jsonl").read_text().splitlines()]
        for r in range(ranks)
    }


def _rel(a, b) -> float:
    import torch

    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.numel() == 0:
        return 0.0
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) / scale


def run_differences(ref: tuple[Path, str], other: tuple[Path, str], rel: float = 0.0) -> list[str]:
    """How the run ``other`` differs from ``ref`` (each ``(FOLDER, output)`` of
    :func:`launched_run`): the epoch losses of the log, the final model's weights (relative to
    each tensor's largest entry), and each rank's steps (the same graphs, atoms and edges at every
    step; the loss within ``rel``). Empty when they agree. ``rel=0``: bit for bit."""
    import torch

    diffs = []
    losses = epoch_losses(ref[1]), epoch_losses(other[1])
    if not losses[0] or len(losses[0]) != len(losses[1]):
        diffs.append(f"epoch losses {losses[0]} against {losses[1]}")
    elif _rel(*losses) > max(rel, 1e-8):  # the log prints 8 decimals
        diffs.append(f"epoch losses {losses[0]} against {losses[1]} (relative {_rel(*losses):.2e})")
    models = [
        torch.load(folder / "launch.model", map_location="cpu", weights_only=False).state_dict()
        for folder, _ in (ref, other)
    ]
    if set(models[0]) != set(models[1]):
        diffs.append(f"weights: keys differ ({sorted(set(models[0]) ^ set(models[1]))})")
    for key in sorted(set(models[0]) & set(models[1])):
        a, b = models[0][key], models[1][key]
        if a.shape != b.shape or (rel == 0 and not torch.equal(a, b)) or _rel(a, b) > rel:
            diffs.append(f"weight {key}: relative {_rel(a, b):.2e} (shape {tuple(a.shape)})")
    steps = step_records(ref[0]), step_records(other[0])
    for r in steps[0]:
        sizes = [
            [(s["epoch"], s["graphs"], s["atoms"], s["edges"]) for s in run[r]] for run in steps
        ]
        if sizes[0] != sizes[1]:
            diffs.append(f"rank {r}'s steps: {sizes[0]} against {sizes[1]}")
            continue
        step_losses = [[s["loss"] for s in run[r]] for run in steps]
        if _rel(*step_losses) > rel:
            diffs.append(f"rank {r}'s step losses: relative {_rel(*step_losses):.2e}")
    return diffs
