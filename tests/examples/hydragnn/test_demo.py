"""examples/hydragnn/demo.py: its --cost calibrated fit of the stock run's step timings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_example


def _write_steps(path: Path, records: list[dict]) -> str:
    """Two ranks' step logs (the tracer's format) holding ``records`` split between them."""
    for rank in range(2):
        Path(f"{path}.rank{rank}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in records[rank::2])
        )
    return str(path)


def test_demo_calibration_fits_the_step_times_with_nonnegative_coefficients(tmp_path, capsys):
    """demo.py --cost calibrated: time = c0 + a*atoms + b*edges fitted on the stock run's steps,
    used as atoms + (b/a)*edges; a count that does not add time is dropped instead of getting a
    negative weight."""
    demo = load_example("hydragnn/demo.py")
    rng = np.random.default_rng(0)
    atoms = rng.integers(50, 600, 80)
    edges = atoms * 16 + rng.integers(-2000, 2000, 80)  # nearly collinear, as in random batches
    both = [
        {"atoms": int(a), "edges": int(e), "compute_cpu_s": 2e-3 + 4e-5 * a + 2e-6 * e}
        for a, e in zip(atoms, edges)
    ]
    opts = demo.cost_options("calibrated", _write_steps(tmp_path / "both", [{}] * 6 + both))
    assert opts[:4] == ["-o", "cost=linear", "-o", "cost_a=1"]
    assert float(opts[5].split("=")[1]) == pytest.approx(2e-6 / 4e-5, rel=1e-6)

    # an unconstrained fit gives atoms a negative weight here (time falls with atoms at fixed edges)
    edges_only = [{**r, "compute_cpu_s": 3e-6 * r["edges"] - 1e-6 * r["atoms"]} for r in both]
    assert demo.cost_options(
        "calibrated", _write_steps(tmp_path / "edges", [{}] * 6 + edges_only)
    ) == ["-o", "cost=edges"]
    assert "s/edge" in capsys.readouterr().out
    assert demo.cost_options("atoms", "unused") == ["-o", "cost=atoms"]
