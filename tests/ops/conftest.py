"""Fixtures of the ops tests: the kernels' settings and debug switches changed for one test only.

``launch_settings``: :func:`cfm_plugins.ops.configure` as a function, every setting put back after
the test. ``debug_switch(name, value)``: a debug switch (an environment variable the kernels read
once per process, :mod:`cfm_plugins.ops._debug`) set for one test and read again around it.
``nan_uninitialised``: inside the test every tensor allocated uninitialised (``torch.empty``, and
``at::empty`` in the C++ operators) comes filled with NaN (torch's deterministic mode with
``fill_uninitialized_memory``), so an output element no kernel stores shows as NaN.
"""

from __future__ import annotations

import pytest
import torch

import cfm_plugins.ops as ops
from cfm_plugins.ops import _debug


@pytest.fixture
def launch_settings():
    previous = ops.settings()
    yield ops.configure
    ops.configure(**previous)


@pytest.fixture
def debug_switch(monkeypatch):
    def set_switch(name: str, value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        _debug.reread()

    yield set_switch
    _debug.reread()  # monkeypatch puts the environment back next; the switches are read again


@pytest.fixture
def nan_uninitialised():
    from torch.utils import deterministic

    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        deterministic.fill_uninitialized_memory,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic.fill_uninitialized_memory = True
    assert torch.empty(4, dtype=torch.float64).isnan().all()  # the mechanism works here
    yield
    torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
    deterministic.fill_uninitialized_memory = previous[2]
