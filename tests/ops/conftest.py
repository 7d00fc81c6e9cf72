"""Fixtures of the ops tests: the kernels' settings and debug switches changed for one test only.

``launch_settings``: :func:`cfm_plugins.ops.configure` as a function, every setting put back after
the test. ``debug_switch(name, value)``: a debug switch (an environment variable the kernels read
once per process, :mod:`cfm_plugins.ops._debug`) set for one test and read again around it.
"""

from __future__ import annotations

import pytest

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
