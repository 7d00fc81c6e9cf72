"""time_md: seconds per MD step with an ASE calculator (here CFMCalculator), on a copy of the
atoms."""

from __future__ import annotations

import numpy as np

from cfm_plugins.calculators.md import time_md
from tests.helpers.mace_models import structures


def test_md_example_time_md(fused64):
    atoms = structures()[0]
    before = atoms.positions.copy()
    seconds = time_md(fused64, atoms, steps=2, warmup=0)
    assert seconds > 0 and np.isfinite(seconds)
    np.testing.assert_array_equal(atoms.positions, before)  # time_md moves a copy
    assert fused64.atoms is not None and not np.allclose(
        fused64.atoms.positions, before
    )  # it did move
