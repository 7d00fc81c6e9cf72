"""``CFMCalculator(static_shapes=True)``: padded evaluations equal unpadded ones; the budget grows
in logged steps."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cfm_plugins.calculators import CFMCalculator
from cfm_plugins.ops.kernel_table import kernel_names
from tests.helpers.mace_models import structures


def results(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    return (
        atoms.get_potential_energy(),
        atoms.get_forces(),
        atoms.get_stress() if atoms.pbc.all() else None,
    )


def test_padded_md_evaluations_equal_unpadded_and_rebudget_in_logged_steps(
    model_files, fused64, caplog
):
    padded = CFMCalculator(
        str(model_files["m64"]),
        device="cpu",
        default_dtype="float64",
        kernels=kernel_names(auto=True),
        static_shapes=True,
    )
    frames = sorted(structures(), key=len)  # growing sizes: the budget must grow
    with caplog.at_level(logging.INFO, logger="cfm_plugins.static_shapes"):
        for atoms in frames:
            e0, f0, s0 = results(fused64, atoms)
            e1, f1, s1 = results(padded, atoms)
            assert abs(e1 - e0) <= 1e-10 * abs(e0)
            np.testing.assert_allclose(f1, f0, rtol=1e-10, atol=1e-12 * np.abs(f0).max())
            if s0 is not None:
                np.testing.assert_allclose(s1, s0, rtol=1e-10, atol=1e-12 * np.abs(s0).max())
    assert padded.budget is not None
    if len(frames[-1]) > len(frames[0]) * 1.05:
        assert padded.budget.raises >= 1 and "over the budget" in caplog.text


def test_reduce_overhead_is_refused_on_cpu(model_files):
    with pytest.raises(ValueError, match="CUDA device"):
        CFMCalculator(str(model_files["m64"]), device="cpu", compile="reduce-overhead")
