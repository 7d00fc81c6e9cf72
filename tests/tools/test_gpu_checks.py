"""tools/gpu_checks: the prepared GPU run: what each call runs, that every GPU command parses,
the set-up's refusal without a bundle, and each call's smoke run on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, clean_env, run_module
from tools.gpu_checks.__main__ import CALLS, commands


def test_the_calls_run_what_the_issue_asks_within_their_limits(tmp_path):
    """Call a: the 2-rank gloo test, the per-module profile at 4000 atoms (both dtypes, cueq and
    ours), the eager step at 500/2000/4000 atoms (both dtypes, stock, cueq, ours), the float64
    compiled step; call b: the fair epoch table, the float32 compiled step and the kernels'
    efficiency table on the GPU. Every command has
    its own timeout, and the sum of those of a call fits a device command (600 s) with the
    call's limit below it."""
    limit_a, a = commands("a", False, tmp_path)
    limit_b, b = commands("b", False, tmp_path)
    text_a, text_b = "\n".join(a), "\n".join(b)
    assert all(line.startswith("timeout -k 10 ") for line in a + b)
    assert "tests/ops/test_conv_tp.py" in a[0] and "unfilled" in a[0]
    assert "tests/test_distributed.py -k on_one_gpu" in a[1]
    assert "tools.gpu_profile --by-module --device cuda" in a[2]
    assert "--atoms 4000 --dtypes float64 float32 --ways cueq fused" in a[2]
    assert "--atoms 500 2000 4000 --dtypes float32 float64 --ways stock cueq fused" in a[3]
    assert "tools.gpu_capture --device cuda --mode default" in a[4] and "float64" in a[4]
    skip = "--kernels-also symmetric_contraction,conv_tp,skip_tp"  # the skip kernel beside auto
    assert skip in a[2] and skip in a[3]
    ways = "stock stock+binpack cueq cueq+binpack fused-only fused fused+static"
    assert f"--epoch-ways {ways}" in b[0] and "--epoch-structures 300" in b[0]
    assert "--mode default" in b[1] and "float32" in b[1]
    assert "benchmarks.efficiency --device cuda" in b[2]
    assert "--device cpu" not in text_a + text_b and "--quick" not in text_a + text_b
    for limit, items in (CALLS["a"], CALLS["b"]):
        assert limit <= 560 and sum(s for s, _, _ in items) >= limit  # the limit binds
    assert (limit_a, limit_b) == (CALLS["a"][0], CALLS["b"][0])


def test_every_gpu_command_parses_its_options():
    """The GPU lines' options, each given to its module's parser (``--help`` at the end: argparse
    checks every option before it): a misspelt way or option costs a GPU call otherwise."""
    lines = [
        line.split(" -m ", 1)[1]
        for call in CALLS
        for line in commands(call, False, Path("/tmp/x"))[1]
        if " -m pytest " not in line
    ]
    script = (
        "import importlib, sys, shlex\n"
        "bad = []\n"
        f"for line in {lines!r}:\n"
        "    module, *argv = shlex.split(line)\n"
        "    try:\n"
        "        importlib.import_module(module).main(argv + ['--help'])\n"
        "    except SystemExit as exc:\n"
        "        if exc.code not in (0, None):\n"
        "            bad.append((line, exc.code))\n"
        "print('BAD', bad)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=570,
    )
    assert res.returncode == 0 and "BAD []" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    from cfm_plugins.ops.kernel_table import check_kernels

    for line in lines:  # the kernels named (checked at run time, before any model)
        words = line.split()
        for flag in ("--kernels-also", "--fused-kernels"):
            if flag in words:
                named = []
                for w in words[words.index(flag) + 1 :]:
                    if w.startswith("--"):
                        break
                    named += w.split(",")
                assert check_kernels(named) and "skip_tp" in named


def test_run_sh_without_a_bundle_says_what_to_make_and_stops(tmp_path):
    res = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu_checks" / "run.sh"), "a"],
        capture_output=True,
        text=True,
        env=dict(clean_env(), OUT=str(tmp_path / "out")),
        cwd=tmp_path,
        timeout=60,
    )
    assert res.returncode == 2
    assert "bundle.sh .gpu" in res.stdout and (tmp_path / "out" / "setup.log").exists()


def _smoke(call: str, tmp_path) -> Path:
    res = run_module("tools.gpu_checks", call, "--smoke", "--out", str(tmp_path), timeout=570)
    out = tmp_path / call
    logs = sorted(out.glob("*.log"))
    assert res.returncode == 0, res.stdout[-3000:] + "".join(p.read_text()[-2000:] for p in logs)
    assert logs and all("# exit 0 after" in p.read_text() for p in logs)
    return out


def test_call_a_smoke_run_on_cpu_writes_the_profile_the_step_record_and_the_compile_check(
    tmp_path,
):
    out = _smoke("a", tmp_path)
    assert "skipped" in (out / "01.log").read_text()  # the 2-rank GPU test skips without CUDA
    profile = (out / "profile_quick.md").read_text()
    assert "| conv TP |" in profile and "cueq: not run" in profile
    step = json.loads((out / "records" / "gpu_mace_step_quick.json").read_text())
    assert step["workload"] == "gpu_mace_step_quick"
    capture = (out / "capture_default_f64.md").read_text()
    assert "compile + warm-up s" in capture and "All checks PASS" in capture


def test_call_b_smoke_run_on_cpu_writes_the_epoch_record_with_its_compile_table(tmp_path):
    """The epoch table's ways on a CPU with tiny settings: stock with binpack's batches, the
    kernels with mace's batches, binpack + fused + static with compile=default over 2 epochs (its
    compile table; dynamo's graphs run by aot_eager, without inductor's code generation, which
    takes minutes on a cold cache); cuEquivariance with binpack is named as not installed."""
    out = _smoke("b", tmp_path)
    epoch = json.loads((out / "records" / "gpu_mace_epoch_quick.json").read_text())
    assert [t["name"] for t in epoch["tables"]] == ["epoch", "compile"]
    tables = {t["name"]: t for t in epoch["tables"]}
    rows = {r[0]: r for r in tables["epoch"]["rows"]}
    assert list(rows) == ["stock+binpack", "cueq+binpack", "fused", "fused+binpack+static+default"]
    assert "not installed" in rows["cueq+binpack"][1]
    for way in ("stock+binpack", "fused", "fused+binpack+static+default"):
        assert float(rows[way][1]) > 0, (way, rows[way])
    (compiled,) = tables["compile"]["rows"]
    assert compiled[0] == "fused+binpack+static+default" and str(compiled[1]) == "2"
    assert float(compiled[2]) > 0 and float(compiled[3]) > 0
    log = (out / "work" / "fused_binpack_static_default" / "train.log").read_text()
    assert "compile" in log.lower()
