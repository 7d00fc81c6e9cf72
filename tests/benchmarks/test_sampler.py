"""benchmarks/sampler.py: a run on a small slice of the mix prints its table and targets and
writes them as its record."""

from __future__ import annotations

from benchmarks.baselines import BASELINES
from benchmarks.sampler import OURS, main
from tests.helpers.records import check_record, rows_of


def test_a_small_run_records_every_packer_at_every_world_size(tmp_path, capsys):
    assert main(["--graphs", "2000", "--worlds", "8,64", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rec = check_record(tmp_path, "sampler_quick", "benchmarks.sampler")
    rows = rows_of(rec, "packers")
    assert [(r[0], r[1]) for r in rows] == [(w, p) for w in (8, 64) for p in (OURS, *BASELINES)]
    ours = [r for r in rows if r[1] == OURS]
    assert all(r[9] == "0 / 0" for r in ours)  # nothing lost or duplicated
    assert all(f"| {r[0]} | {r[1]} |" in printed for r in rows)
    assert rec["headline"]["padding, ours (W=64)"] == ours[1][5]
    assert sum(n.startswith("Target (ours) W=") for n in rec["notes"]) == 10  # 5 per world size
    assert rec["description"].startswith("2,000 graphs")
