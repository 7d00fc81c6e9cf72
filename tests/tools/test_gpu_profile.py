"""tools/gpu_profile.py: a smoke run on the CPU."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import ROOT, clean_env


def test_profile_smoke_run_on_cpu_shows_the_fused_operators_only_in_the_fused_step(tmp_path):
    out = tmp_path / "profile.md"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.gpu_profile",
            "--device",
            "cpu",
            "--quick",
            "--dtypes",
            "float64",
            "--ways",
            "stock",
            "fused",
            "--top",
            "40",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sections = dict(part.split("\n", 1) for part in out.read_text().split("### ")[1:])
    stock = next(v for k, v in sections.items() if k.endswith(": stock"))
    fused = next(v for k, v in sections.items() if k.endswith(": fused"))
    assert (
        "cfm::" not in stock and "`cfm::conv_tp_bwd`" in fused
    )  # the profiled step ran our kernels
    for body in (stock, fused):
        wall, kernels = (
            float(x) for x in re.search(r"wall ([\d.]+) ms, kernels ([\d.]+) ms", body).groups()
        )
        assert (
            0 < kernels <= wall * 1.5
        )  # self times add up to about the step (profiler overhead aside)
