"""Fixtures of the NequIP tests (they run in .venv-nequip; nequip is imported only when used)."""

from __future__ import annotations

import pytest


@pytest.fixture
def nequip_global_state():
    """nequip's process-wide state (dtypes, TF32), which it requires before building or loading a
    model."""
    from nequip.utils.global_state import set_global_state

    set_global_state()
