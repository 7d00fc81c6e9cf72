"""tools/memory_peak.py: a smoke run on the CPU."""

from __future__ import annotations

import re

from tests.helpers import run_module


def test_memory_peak_smoke_run_on_cpu_accounts_for_the_whole_peak_and_names_our_operators(tmp_path):
    out = tmp_path / "peak.md"
    res = run_module(
        "tools.memory_peak",
        *"--device cpu --quick --ways stock fused --top 1000 --out".split(),
        str(out),
        timeout=570,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    sections = dict(part.split("\n", 1) for part in out.read_text().split("### ")[1:])
    assert [k.rsplit(": ", 1)[1] for k in sections] == ["stock", "fused"]
    for way, body in zip(("stock", "fused"), sections.values()):
        peak = float(re.search(r"peak ([\d.]+) MiB", body).group(1))
        rows = [line.split("|") for line in body.splitlines() if line.startswith("| `")]
        assert (
            peak > 1 and abs(sum(float(r[4]) for r in rows) - peak) < 0.05 * len(rows) + 0.1
        )  # all of it, by maker
        assert any("cfm::conv_tp" in r[1] for r in rows) == (way == "fused")
