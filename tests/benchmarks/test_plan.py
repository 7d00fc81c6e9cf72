"""benchmarks/plan.py: the step-time line from the GPU record, the geometry of the counting mix, and
a small run end to end (the command at every rank count, its record and picture)."""

from __future__ import annotations

import numpy as np

from benchmarks.plan import PAPER, RANKS, geometry_mix, main, step_fit
from tests.helpers.records import check_record, rows_of


def test_the_step_time_line_goes_through_the_gpu_records_points():
    c0, a, pts, rec = step_fit()
    assert len(pts) == 4 and c0 > 0 and a > 0
    for atoms, seconds in pts:
        assert abs(c0 + a * atoms - seconds) / seconds < 0.1
    assert "H200" in rec["device"]


def test_the_counting_mix_has_the_mixs_atoms_and_cells():
    pos, off, cells, pbc = geometry_mix(300)
    assert off[-1] == len(pos) and len(cells) == len(pbc) == len(off) - 1 >= 300
    assert pbc.any() and (~pbc).any()  # crystals and water clusters
    assert np.all(np.linalg.det(cells[pbc.all(axis=1)]) > 0)


def test_a_smoke_run_plans_every_rank_count_and_records_it(tmp_path, capsys):
    argv = ["--graphs", "20000", "--count-structures", "100", "--out", str(tmp_path)]
    assert main(argv) == 0
    rec = check_record(tmp_path, "plan_quick", "benchmarks.plan")
    rows = rows_of(rec, "paper_workload")
    assert [r[0] for r in rows] == list(RANKS)
    for r in rows:
        if r[0] in PAPER and "original" in PAPER[r[0]]:
            assert r[-1].endswith("x")
    assert rows_of(rec, "edge_counting") and rows_of(rec, "performance")
    assert (tmp_path / "plan_quick.png").read_bytes()[:4] == b"\x89PNG"
