"""benchmarks/record.py: a record names what it measured, on what, with which command; every
benchmark takes ``--out`` for it and says in its docstring how to run it."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from benchmarks import record
from tests.helpers import ROOT, run_module

#: what a user runs (``python -m benchmarks.<name>``); the rest of benchmarks/ is shared code
BENCHMARKS = (
    "sampler",
    "kernels",
    "kernels_conv_tp",
    "kernels_symmetric_contraction",
    "mace_train",
    "nequip_train",
    "hydragnn_mace",
    "hydragnn_samplers",
    "static_train",
    "static_shapes",
    "convergence",
    "gpu_mace",
    "gpu_md",
    "gpu_kernels",
)


def test_a_record_holds_its_tables_and_what_they_were_measured_on(tmp_path, capsys):
    epoch = record.markdown_table(
        "epoch",
        ["| configuration | s/epoch | vs stock |", "|---|---:|---|", "| stock | 13.70 | 1.00x |"],
        "seconds per epoch",
    )
    md = record.table("md", ["calculator", "ms"], [["MACECalculator", "120"]])
    path = record.write_record(
        "demo_cpu",
        "A demo",
        [epoch, md],
        description="what ran",
        headline={"fused vs stock": "0.21x"},
        notes=["a remark", ""],
        picture=tmp_path / "demo.png",
        out=tmp_path,
        command="python -m benchmarks.demo --quick",
        benchmark="benchmarks.demo",
    )
    assert path == tmp_path / "demo_cpu.json" and f"wrote {path}" in capsys.readouterr().out
    rec = json.loads(path.read_text())
    assert rec["workload"] == "demo_cpu" and rec["command"] == "python -m benchmarks.demo --quick"
    assert rec["benchmark"] == "benchmarks/demo.py"
    assert rec["tables"][0] == {
        "name": "epoch",
        "caption": "seconds per epoch",
        "columns": ["configuration", "s/epoch", "vs stock"],
        "rows": [["stock", 13.7, "1.00x"]],  # numbers as numbers, ratios as written
    }
    assert rec["tables"][1]["rows"] == [["MACECalculator", 120]]
    assert rec["headline"] == {"fused vs stock": "0.21x"} and rec["notes"] == ["a remark"]
    assert rec["picture"] == "docs/img/demo.png"
    assert "CPU" in rec["device"] and rec["versions"]["torch"] and rec["versions"]["cfm-plugins"]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert rec["commit"] == (head or "unknown") and len(rec["date"]) == 10
    # each row on one line: a record reads (and diffs) row by row
    lines = [line.strip().rstrip(",") for line in path.read_text().splitlines()]
    assert '["stock", 13.7, "1.00x"]' in lines and '["MACECalculator", 120]' in lines


def test_out_dash_writes_nothing_and_a_bad_record_says_what_is_wrong(tmp_path):
    t = record.table("t", ["a"], [[1]])
    assert record.write_record("w", "T", [t], description="d", out="-", command="c") is None
    with pytest.raises(ValueError, match=r"table 't': row 1 has 2 cells, the columns 1"):
        record.table("t", ["a"], [[1], [1, 2]])
    with pytest.raises(ValueError, match="workload 'a/b'"):
        record.write_record("a/b", "T", [t], description="d", out=tmp_path)
    with pytest.raises(ValueError, match="at least one table"):
        record.write_record("w", "T", [], description="d", out=tmp_path)
    with pytest.raises(ValueError, match="markdown header"):
        record.markdown_table("t", ["| a |", "| 1 |"])
    assert not any(tmp_path.iterdir())


def test_the_command_names_the_interpreter_module_arguments_and_the_threads(monkeypatch):
    import os

    for name in [k for k in os.environ if k.startswith("CFM_PLUGINS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("CFM_PLUGINS_TRITON_TILES", "tp_edge=8x32/w4")
    line = record.command_line(["--quick", "--out", "a b"], module="benchmarks.sampler")
    assert line.startswith("CFM_PLUGINS_TRITON_TILES=tp_edge=8x32/w4 OMP_NUM_THREADS=1 ")
    assert line.endswith(" -m benchmarks.sampler --quick --out 'a b'")
    exe = sys.executable  # the checkout's environment by its path there, another as "python"
    python = exe[len(str(ROOT)) + 1 :] if exe.startswith(f"{ROOT}/") else "python"
    assert line.split()[2] == python, line


def test_a_smoke_run_as_a_module_records_its_own_command(tmp_path):
    """``python -m benchmarks.static_shapes ...`` on tiny sets: the record names that command."""
    out = tmp_path / "records"
    argv = ["--cuni", "6", "--clusters", "12", "--table3", "300", "--world", "2", "--epochs", "1"]
    res = run_module("benchmarks.static_shapes", *argv, "--out", str(out), timeout=570)
    assert res.returncode == 0, res.stdout[-3000:]
    rec = json.loads((out / "static_shapes.json").read_text())
    assert rec["command"].endswith(f"-m benchmarks.static_shapes {' '.join(argv)} --out {out}")
    assert rec["benchmark"] == "benchmarks/static_shapes.py"
    printed = [ln for ln in res.stdout.splitlines() if ln.startswith("| CuNi")]
    rows = rec["tables"][0]["rows"]
    assert len(rows) == 3 * 4 and len(printed) == 4  # 3 sets x 4 kinds of bins, one rank count
    assert [r[0] for r in rows[:4]] == ["CuNi (example)"] * 4


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_documents_its_command_and_takes_out(name, capsys):
    module = importlib.import_module(f"benchmarks.{name}")
    assert f"python -m benchmarks.{name}" in module.__doc__
    assert "/_fragments" not in module.__doc__ and "../shared" not in module.__doc__
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "usage:" in text and ("--out" in text or name == "kernels")
