"""benchmarks/convergence.py: ``report`` turns the finished runs into one record per trainer,
with the target against stock and the plot beside it (the runs here are made up: their errors
are known)."""

from __future__ import annotations

import json

import pytest

from benchmarks.convergence import main, subset_rmse, verdict
from tests.helpers.records import check_record, rows_of

#: configuration -> per seed, the energy error per atom and the force RMSE (eV, eV/A)
ERRORS = {
    "stock": [(0.010, 0.10), (0.012, 0.12)],
    "binpack": [(0.011, 0.11), (0.013, 0.13)],  # within stock's seed spread
    "per_sample": [(0.020, 0.20), (0.022, 0.22)],  # far from it
}
ATOMS = [2, 10, 50]


def fake_runs(work):
    for config, seeds in ERRORS.items():
        for seed, (de, f) in enumerate(seeds, 1):
            run = work / "mace" / config / f"seed{seed}"
            run.mkdir(parents=True)
            result = {
                "part": "mace",
                "config": config,
                "seed": seed,
                "steps_per_epoch": 5,
                "epochs": [
                    {"epoch": e, "rmse_e_per_atom": de * (3 - e), "rmse_f": f * (3 - e)}
                    for e in range(3)
                ],
                "final": {
                    "atoms": ATOMS,
                    "de_per_atom": [de] * len(ATOMS),
                    "f_sq": [3 * n * f**2 for n in ATOMS],
                },
            }
            (run / "result.json").write_text(json.dumps(result))
    meta = {
        "mace_command": ".venv/bin/python -m benchmarks.convergence mace --epochs 3",
        "mace_workload": "made-up runs",
        "loads": {"mace": [0.5, 1.5]},
    }
    (work / "meta.json").write_text(json.dumps(meta))


def test_subset_errors_and_the_target():
    errors = {"atoms": ATOMS, "de_per_atom": [0.01] * 3, "f_sq": [3 * n * 0.1**2 for n in ATOMS]}
    for which in ("all", "small", "large"):
        assert subset_rmse(errors, which) == pytest.approx((0.01, 0.1))
    assert verdict([10, 12], [11, 13]) == (True, pytest.approx(1 / 2**0.5))
    assert verdict([10, 12], [20, 22])[0] is False


def test_report_writes_a_record_and_its_plot_per_trainer(tmp_path):
    work, out = tmp_path / "runs", tmp_path / "records"
    fake_runs(work)
    assert main(["report", "--work", str(work), "--out", str(out)]) == 0
    # its command is the one that made the runs (the report's is in its notes)
    rec = check_record(out, "convergence_mace", "benchmarks.convergence", out_in_command=False)
    assert (
        rec["command"] == ".venv/bin/python -m benchmarks.convergence mace --epochs 3 --seeds 1 2"
    )
    assert rec["description"] == "made-up runs"
    final = {r[0]: r for r in rows_of(rec, "final")}
    assert final["binpack, loss_weighting=stock"][1:3] == ["12.0 ± 1.4", "120.0 ± 14.1"]
    target = {r[0]: r[-1] for r in rows_of(rec, "target")}
    assert target == {
        "binpack, loss_weighting=stock": "yes",
        "binpack, loss_weighting=per_sample": "no",
    }
    assert [r[0] for r in rows_of(rec, "epochs")] == [1, 2, 3]
    assert rec["picture"] == "docs/img/convergence_mace.png"
    assert (out / "convergence_mace.png").read_bytes()[:4] == b"\x89PNG"
    assert any("0.5..1.5" in n for n in rec["notes"])
    assert sorted(p.name for p in out.iterdir()) == [
        "convergence_mace.json",
        "convergence_mace.png",
    ]


def test_report_without_runs_says_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match=f"no finished runs under {tmp_path}"):
        main(["report", "--work", str(tmp_path), "--out", str(tmp_path / "records")])
