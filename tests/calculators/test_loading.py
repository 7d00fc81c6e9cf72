"""Weights-only loading (``load_mace_weights``, ``CFMCalculator(weights_only=True)``) when the
architecture and the weights are of different dtypes: never rounded without a word, and the
messages name what is what."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from mace.calculators import MACECalculator
from mace.tools.scripts_utils import extract_config_mace_model

from cfm_plugins.calculators import CFMCalculator
from cfm_plugins.calculators.loading import load_mace_weights
from tests.helpers.mace_models import structures


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def energy(calc, atoms) -> float:
    atoms = atoms.copy()
    atoms.calc = calc
    return float(atoms.get_potential_energy())


def messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, UserWarning)]


def test_float64_weights_into_an_architecture_built_under_float32_are_not_rounded(
    tmp_path, model_files
):
    """docs/inference.md's reader builds the architecture from the trained model's options under
    torch's default float32: the float64 weights were rounded into it (energies off by 1e-8
    relative) and the warning blamed the weights file. Now the architecture is converted to the
    weights' dtype first, said once, naming both."""
    trusted = torch.load(model_files["m64"], weights_only=False)
    state = tmp_path / "my_weights.pt"
    torch.save(trusted.state_dict(), state)
    options = extract_config_mace_model(trusted)
    with default_dtype(torch.float32):
        arch32 = type(trusted)(**options)
    assert next(arch32.parameters()).dtype == torch.float32
    atoms = structures()[0]
    ref = energy(MACECalculator(model_paths=str(model_files["m64"]), device="cpu"), atoms)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        calc = CFMCalculator(str(state), weights_only=True, architecture=arch32, fused=False)
    said = messages(record)
    converted = [m for m in said if "converted to float64 before the weights are loaded" in m]
    assert len(converted) == 1, said
    assert converted[0].startswith(
        f"the weights in {str(state)!r} are float64 and the architecture's parameters float32"
    )
    assert not any("is float32; converting it" in m for m in said), said  # the file is float64
    assert energy(calc, atoms) == pytest.approx(ref, rel=1e-12, abs=0)
    assert next(arch32.parameters()).dtype == torch.float32  # copied, not modified

    # a callable is called in the weights' dtype: nothing to convert, nothing said
    with default_dtype(torch.float32), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model = load_mace_weights(state, lambda: type(trusted)(**options))
        assert torch.get_default_dtype() == torch.float32  # restored
    assert next(model.parameters()).dtype == torch.float64
    assert not [m for m in messages(record) if "converted" in m]


def test_float32_weights_into_a_float64_architecture_stay_float32_and_the_warning_is_right(
    tmp_path, model_files
):
    """float32 weights: the architecture is made float32 for them (said), then the calculator's
    default_dtype=float64 converts the model, saying the weights file is float32 (now true)."""
    trusted32 = torch.load(model_files["m32"], weights_only=False)
    state = tmp_path / "w32.pt"
    torch.save(trusted32.state_dict(), state)
    arch64 = type(trusted32)(**extract_config_mace_model(trusted32)).to(torch.float64)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        model = load_mace_weights(state, arch64)
    assert next(model.parameters()).dtype == torch.float32
    for name, value in model.state_dict().items():
        assert torch.equal(value, trusted32.state_dict()[name]), name
    assert any(
        "are float32 and the architecture's parameters float64" in m for m in messages(record)
    )


def test_weights_that_mix_dtypes_are_refused(tmp_path, model_files):
    trusted = torch.load(model_files["m64"], weights_only=False)
    mixed = dict(trusted.state_dict())
    name = next(k for k, v in mixed.items() if v.is_floating_point())
    mixed[name] = mixed[name].float()
    torch.save(mixed, tmp_path / "mixed.pt")
    with pytest.raises(ValueError, match=r"mix floating-point dtypes \(\{'float(32|64)': \d+"):
        load_mace_weights(tmp_path / "mixed.pt", trusted)
