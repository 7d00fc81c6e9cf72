"""benchmarks/samplers.py: a small run makes the real data sets, compares every sampler on every
set at every rank count and budget, and writes the table, the targets and the picture."""

from __future__ import annotations

from benchmarks.samplers import SETS, main
from cfm_plugins.plan.compare import COLUMNS, SAMPLERS
from tests.helpers.records import check_record, rows_of


def test_a_smoke_run_compares_every_sampler_on_every_set(tmp_path, capsys):
    argv = ["--quick", "--ranks", "2,740", "--structures", "20", "--data", str(tmp_path / "data")]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rec = check_record(tmp_path, "samplers_quick", "benchmarks.samplers")
    assert [t["name"] for t in rec["tables"]][:4] == list(SETS)
    for name in SETS:
        table = next(t for t in rec["tables"] if t["name"] == name)
        assert table["columns"] == list(COLUMNS)
        rows = rows_of(rec, name)
        caps = list(dict.fromkeys(r[1] for r in rows))
        assert len(caps) == 2 and caps[0] == 3072  # the paper's budget, then the largest
        assert [(r[0], r[1], r[2]) for r in rows] == [
            (w, c, s) for c in caps for w in (2, 740) for s in SAMPLERS.values()
        ]
        for r in rows:
            assert r[2] != "binpack" or r[-1] == "1.000x"
            assert f"| {r[0]} | {r[1]} | {r[2]} |" in printed
    assert (tmp_path / "samplers_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rec["picture"] == "docs/img/samplers_quick.png"
    targets = [n for n in rec["notes"] if n.startswith("Target ")]
    assert len(targets) == 4 + 3  # Table 3: epoch and planning time against 2 peers; 3 real sets
    assert all(t.startswith(("Target MET: ", "Target NOT MET: ")) for t in targets)
    assert (tmp_path / "data" / "hdf5-20" / "h5" / "train").is_dir()
    # where another sampler is ahead of binpack: every such row named, with a reason
    names = [t["name"] for t in rec["tables"]]
    if "ahead" in names:
        ahead = rows_of(rec, "ahead")
        assert all(r[0] in SETS and r[3] != "binpack" and r[7] for r in ahead)
