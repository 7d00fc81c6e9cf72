"""examples/md.py: a short timed MD with CFMCalculator and MACECalculator, and its errors for bad
input.

Run in this process through ``main(argv)`` (a subprocess per case would import mace four times)."""

from __future__ import annotations

import pytest
import torch
from ase.io import write

from tests.helpers import load_example
from tests.helpers.mace_models import build_model, structures


def usage_error(md, capsys, *args) -> str:
    with pytest.raises(SystemExit) as stop:
        md.main([str(a) for a in args])
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_times_both_calculators_and_refuses_bad_input_with_a_usage_error(tmp_path, capsys):
    md = load_example("md.py")
    model = tmp_path / "m.model"
    torch.save(build_model(0), model)
    atoms = max(structures(), key=len)
    write(tmp_path / "cell.xyz", atoms)
    assert (
        md.main(
            [
                "--model",
                str(model),
                "--atoms",
                str(tmp_path / "cell.xyz"),
                "--steps",
                "2",
                "--repeats",
                "1",
                "--compare",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"{len(atoms)} atoms, 2 VelocityVerlet steps" in out
    assert "CFMCalculator:" in out and "MACECalculator:" in out and "speed-up" in out

    missing = usage_error(md, capsys, "--model", model, "--atoms", tmp_path / "nope.xyz")
    assert "error: no structure file at" in missing
    no_model = usage_error(
        md, capsys, "--model", tmp_path / "nope.model", "--atoms", tmp_path / "cell.xyz"
    )
    assert "error: no MACE model file at" in no_model
    iron = atoms.copy()
    iron.symbols[0] = "Fe"
    write(tmp_path / "iron.xyz", iron)
    foreign = usage_error(md, capsys, "--model", model, "--atoms", tmp_path / "iron.xyz")
    assert f"error: --atoms {tmp_path / 'iron.xyz'} (" in foreign
    assert "not trained on: Fe (atoms 0)" in foreign
