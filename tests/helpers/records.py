"""What a benchmark's record must hold (:mod:`benchmarks.record`), checked by the benchmarks'
tests on the record a smoke run wrote."""

from __future__ import annotations

import json
from pathlib import Path


def check_record(
    folder: Path, workload: str, module: str, device: str = "CPU", out_in_command: bool = True
) -> dict:
    """The record ``folder/<workload>.json``, after checking that it parses and names its
    workload, its benchmark, the command that ran it (``-m <module>``, and ``--out folder`` unless
    ``out_in_command`` is false), the device, the versions (Python, torch, cfm-plugins), the date
    and the commit, and that each table has rows as long as its columns. Returns the record."""
    path = Path(folder) / f"{workload}.json"
    assert path.is_file(), f"no record {path}; the folder holds {sorted(Path(folder).iterdir())}"
    rec = json.loads(path.read_text())
    assert rec["schema"] == 1 and rec["workload"] == workload
    assert rec["benchmark"] == module.replace(".", "/") + ".py"
    assert f"-m {module} " in rec["command"], rec["command"]
    assert not out_in_command or f"--out {folder}" in rec["command"], rec["command"]
    assert device in rec["device"]
    assert {"python", "torch", "cfm-plugins"} <= set(rec["versions"])
    assert rec["date"][:2] == "20" and rec["commit"] and rec["title"] and rec["description"]
    assert rec["tables"]
    for table in rec["tables"]:
        assert table["name"] and table["rows"], table
        assert all(len(row) == len(table["columns"]) for row in table["rows"]), table
    return rec


def rows_of(rec: dict, name: str) -> list[list]:
    """The rows of the record's table ``name``."""
    return next(t["rows"] for t in rec["tables"] if t["name"] == name)
