"""examples/md.py: a short timed MD with CFMCalculator and MACECalculator, and its errors for bad input."""
from __future__ import annotations

import subprocess
import sys

import torch
from ase.io import write

from tests.helpers import ROOT, clean_env
from tests.helpers.mace_models import build_model, structures

SCRIPT = ROOT / "examples" / "md.py"


def md(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, env=clean_env(), cwd=ROOT)


def test_times_both_calculators_and_refuses_bad_input_with_a_usage_error(tmp_path):
    model = tmp_path / "m.model"
    torch.save(build_model(0), model)
    atoms = max(structures(), key=len)
    write(tmp_path / "cell.xyz", atoms)
    out = md("--model", model, "--atoms", tmp_path / "cell.xyz", "--steps", 2, "--repeats", 1, "--compare")
    assert out.returncode == 0, out.stdout
    assert f"{len(atoms)} atoms, 2 VelocityVerlet steps" in out.stdout
    assert "CFMCalculator:" in out.stdout and "MACECalculator:" in out.stdout and "speed-up" in out.stdout

    missing = md("--model", model, "--atoms", tmp_path / "nope.xyz", "--steps", 1)
    assert missing.returncode == 2 and "no structure file at" in missing.stdout, missing.stdout
    no_model = md("--model", tmp_path / "nope.model", "--atoms", tmp_path / "cell.xyz", "--steps", 1)
    assert no_model.returncode == 2 and "no MACE model file at" in no_model.stdout, no_model.stdout
    iron = atoms.copy()
    iron.symbols[0] = "Fe"
    write(tmp_path / "iron.xyz", iron)
    foreign = md("--model", model, "--atoms", tmp_path / "iron.xyz", "--steps", 1)
    assert foreign.returncode == 2, foreign.stdout
    assert "--atoms " in foreign.stdout and "not trained on: Fe (atoms 0)" in foreign.stdout
    assert "Traceback" not in missing.stdout + no_model.stdout + foreign.stdout
