"""benchmarks/kernels.py, kernels_symmetric_contraction.py, kernels_conv_tp.py and
kernels_skip_tp.py: smoke runs of the CPU kernel benchmarks (two through ``benchmarks.kernels``,
which passes its options on), each writing its record."""

from __future__ import annotations

import subprocess

from tests.helpers import run_module
from tests.helpers.records import check_record, rows_of


def _run(*argv: str) -> subprocess.CompletedProcess:
    res = run_module(*argv, timeout=570)
    assert res.returncode == 0, res.stdout[-3000:]
    return res


def test_kernels_smoke_run_times_the_contraction_against_mace_and_records_it(tmp_path):
    argv = ["symmetric_contraction", "--quick", "--impls", "fused", "mace", "--out", str(tmp_path)]
    res = _run("benchmarks.kernels", *argv)
    assert "===== symmetric_contraction =====" in res.stdout and "conv_tp" not in res.stdout
    module = "benchmarks.kernels_symmetric_contraction"
    rec = check_record(tmp_path, "kernels_symmetric_contraction_quick", module)
    assert rec["command"].endswith(f"-m {module} --quick --impls fused mace --out {tmp_path}")
    modes = rows_of(rec, "modes")
    assert [r[:3] for r in modes] == [["float32", 128, m] for m in ("fwd", "fwd+bwd", "fwd+bwd+2")]
    columns = rec["tables"][0]["columns"]
    assert columns[-1] == "speed-up vs mace"
    fused, mace = columns.index("fused ms"), columns.index("mace ms")
    assert all(r[fused] > 0 and r[mace] > 0 for r in modes)  # both timed in the same run
    assert all(r[-1].endswith("x") for r in modes)  # ours against mace, same run


def test_conv_tp_smoke_run_times_the_fused_kernel_against_e3nn_and_records_it(tmp_path):
    _run("benchmarks.kernels_conv_tp", "--quick", "--modes", "fwd", "--out", str(tmp_path))
    rec = check_record(tmp_path, "kernels_conv_tp_quick", "benchmarks.kernels_conv_tp")
    (row,) = rows_of(rec, "modes")
    assert row[0] == 32 and row[2:4] == ["float32", "fwd"]
    assert row[4] > 0 and row[5] > 0 and row[6].endswith("x")  # e3nn, fused, their ratio
    assert any("benchmarks.gpu_kernels" in note for note in rec["notes"])


def test_skip_tp_smoke_run_times_the_fused_kernel_against_e3nn_and_records_it(tmp_path):
    res = _run("benchmarks.kernels", "skip_tp", "--quick", "--modes", "fwd", "--out", str(tmp_path))
    assert "===== skip_tp =====" in res.stdout and "fused backend C++" in res.stdout
    rec = check_record(tmp_path, "kernels_skip_tp_quick", "benchmarks.kernels_skip_tp")
    rows = rows_of(rec, "modes")
    assert [r[:4] for r in rows] == [[64, 89, "float32", "fwd"], [64, 2, "float32", "fwd"]]
    for r in rows:  # the ratio is of the unrounded times: within the rounding of the shown ones
        e3nn, fused, ratio = r[4], r[5], r[6]
        assert e3nn > 0 and fused > 0, r
        low, high = (fused - 0.005) / (e3nn + 0.05), (fused + 0.005) / max(e3nn - 0.05, 1e-9)
        assert low - 5e-4 <= ratio <= high + 5e-4, r
    assert any("no GPU has timed it" in note for note in rec["notes"])
