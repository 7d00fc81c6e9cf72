"""The interpreter tests' probe for a triton whose interpreter cannot run ``tp_segment``'s loop with
the NumPy installed (conftest.py): they skip there with why, and run everywhere else."""

from __future__ import annotations

import numpy as np

from tests.ops.triton.conftest import interpreter_cannot_loop


class _RefusesInt:
    """A one-element array as NumPy 2.5 has it: ``int()`` of it is a TypeError."""

    def __int__(self):
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")


def test_triton_3_7_and_later_loop_with_any_numpy(monkeypatch):
    monkeypatch.setattr(np, "array", lambda *a, **k: _RefusesInt())
    for version in ("3.7.0", "3.7.1", "3.9.0", "3.10.0+git1234"):
        assert interpreter_cannot_loop(version) is None


def test_triton_3_6_with_a_numpy_that_refuses_int_of_arrays_is_named(monkeypatch):
    monkeypatch.setattr(np, "array", lambda *a, **k: _RefusesInt())
    why = interpreter_cannot_loop("3.6.0")
    assert why is not None and "Triton 3.6.0" in why and "triton >= 3.7 or numpy < 2.5" in why


def test_triton_3_6_with_this_numpy_converts_as_numpy_does():
    try:
        int(np.array([1]))
        refuses = False
    except TypeError:
        refuses = True
    assert (interpreter_cannot_loop("3.6.0") is not None) == refuses
