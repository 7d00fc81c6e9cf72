"""Fixtures shared by every test module. Helpers (functions, model builders) are in
``tests/helpers/``.

Layout: the tests mirror the package. The tests of ``cfm_plugins/<sub>/<module>.py`` are in
``tests/<sub>/test_<module>.py`` (top-level modules: ``tests/test_<module>.py``); those of an
adapter ``adapters/<trainer>/<module>.py`` in ``tests/adapters/<trainer>/test_<module>.py``, with
``test_adapter.py`` for the adapter itself (its ``__init__``: the command it serves, real training
runs); a module's tests split by what they need carry a suffix (``test_batch_sampler_mpi.py``,
``test_conv_tp_mace.py``: on whole MACE models). ``tests/datasets``, ``tests/examples`` and
``tests/benchmarks`` test ``cfm_plugins.datasets``, the example scripts and the benchmark scripts.
``tests/scripts/`` holds the programs the MPI tests launch.
"""

from __future__ import annotations

import pytest

from tests.helpers import run_mpi


@pytest.fixture
def mpi():
    return run_mpi


@pytest.fixture
def f64():
    """torch's default dtype float64 for the test, restored after."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
