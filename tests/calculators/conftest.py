"""Model files of small random MACE models and the calculators over them, for the calculator
tests."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from mace.calculators import MACECalculator

from cfm_plugins.calculators import CFMCalculator
from cfm_plugins.ops.kernel_table import kernel_names
from tests.helpers.mace_models import build_model


@pytest.fixture(scope="session")
def model_files(tmp_path_factory):
    """The model files, made once per test process (read only: every test loads them)."""
    folder = tmp_path_factory.mktemp("models")
    files = {}
    for name, seed, dtype in (
        ("m64", 0, torch.float64),
        ("m64b", 1, torch.float64),
        ("m32", 0, torch.float32),
    ):
        files[name] = folder / f"{name}.model"
        torch.save(build_model(seed, dtype), files[name])
    return files


@pytest.fixture(scope="module")
def fused64(model_files):
    """CFMCalculator over m64 with every fused kernel of this checkout."""
    return CFMCalculator(
        str(model_files["m64"]),
        device="cpu",
        default_dtype="float64",
        kernels=kernel_names(auto=True),
    )


@pytest.fixture(scope="module")
def stock64(model_files):
    return MACECalculator(
        model_paths=str(model_files["m64"]), device="cpu", default_dtype="float64"
    )
