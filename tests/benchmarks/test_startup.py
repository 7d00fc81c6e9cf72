"""benchmarks/startup.py: a smoke run on a tiny sharded HDF5 set (three real 2-rank runs, each
stopped after mace's first read of the data) records every case; the run with the cache a run
wrote reads no structure."""

from __future__ import annotations

from benchmarks.startup import main
from tests.helpers.records import check_record, rows_of


def test_a_smoke_run_records_cold_plan_cache_and_run_cache(tmp_path, capsys):
    argv = ["--structures", "200", "--shards", "2", "--distinct", "50", "--out", str(tmp_path)]
    assert main(argv) == 0
    rec = check_record(tmp_path, "startup_quick", "benchmarks.startup")
    rows = rows_of(rec, "startup")
    assert [r[0] for r in rows] == ["cold", "plan cache", "run cache"]
    cold, plan, warm = rows
    assert "train" in cold[5] and "(100 read)" in cold[5]  # each rank reads its half once
    # cfm-plan's cache of HDF5 files holds the edges and the checks: the training set is not read
    assert plan[5].startswith("train") and plan[5].count("train") == 2
    assert "(100 read)" not in plan[5] and plan[5].count("(0 read)") == 2
    assert "(100 read)" not in warm[5] and warm[5].count("(0 read)") == 3
    assert all(r[3] > 0 for r in rows)  # mace's own read was timed
    assert "cfm-plan on the training folder" in capsys.readouterr().out
