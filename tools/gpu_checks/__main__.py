"""``python -m tools.gpu_checks CALL [--smoke] [--out DIR] [--limit S] [--dry-run]``: run one call
of the prepared GPU run (see ``tools/gpu_checks/__init__.py``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tools.run_list import run_list

ROOT = Path(__file__).resolve().parents[2]
PY = "python3"  # the machine's Python: run.sh puts the set-up one first on PATH

#: per call: its time limit (s, the whole list) and its commands as (seconds of the command's own
# limit, the GPU command, the smoke command or None to leave it out of a smoke run). ``{out}`` is
# the call's output folder, ``{py}`` the Python.
CALLS: dict[str, tuple[float, list[tuple[float, str, str | None]]]] = {
    "a": (
        420.0,
        [
            (
                90,
                "{py} -m pytest -q -p no:cacheprovider -rs tests/ops/test_conv_tp.py -k "
                "'unfilled or gaps or cuda_matches_cpu or cuda_gradgradcheck'",
                None,
            ),
            (
                150,
                "{py} -m pytest -q -p no:cacheprovider -rs tests/test_distributed.py -k on_one_gpu",
                "{py} -m pytest -q -p no:cacheprovider -rs tests/test_distributed.py -k on_one_gpu",
            ),
            (
                150,
                "{py} -m tools.gpu_profile --by-module --device cuda --backend triton --atoms 4000 "
                "--dtypes float64 float32 --ways cueq fused --kernels-also "
                "symmetric_contraction,conv_tp,skip_tp --out {out}/profile_4000.md",
                "{py} -m tools.gpu_profile --by-module --device cpu --quick --dtypes float64 "
                "--ways cueq fused --kernels-also symmetric_contraction,conv_tp,skip_tp "
                "--out {out}/profile_quick.md",
            ),
            (
                270,
                "{py} -m benchmarks.gpu_mace --device cuda --backend triton --atoms 500 2000 4000 "
                "--dtypes float32 float64 --ways stock cueq fused --kernels-also "
                "symmetric_contraction,conv_tp,skip_tp "
                "symmetric_contraction,conv_tp,conv_tp_radial,skip_tp --no-epoch --reps 5 "
                "--warmup 2 --out {out}/records",
                "{py} -m benchmarks.gpu_mace --device cpu --quick --dtypes float64 --ways stock "
                "cueq fused --kernels-also symmetric_contraction,conv_tp "
                "symmetric_contraction,conv_tp,conv_tp_radial --no-epoch --out {out}/records",
            ),
            (
                150,
                "{py} -m tools.gpu_capture --device cuda --mode default --backend triton "
                "--no-stock --atoms 4000 --dtypes float64 --reps 5 "
                "--out {out}/capture_default_f64.md",
                "{py} -m tools.gpu_capture --device cpu --mode default --quick --no-stock "
                "--dtypes float64 --out {out}/capture_default_f64.md",
            ),
        ],
    ),
    "b": (
        540.0,
        [
            (
                480,
                "{py} -m benchmarks.gpu_mace --device cuda --backend triton --no-steps "
                "--epoch-structures 300 --epoch-ways stock stock+binpack cueq cueq+binpack "
                "fused-only fused fused+static --static-epochs 5 "
                "--epoch-timeout 70 70 90 90 60 60 200 --work /tmp/cfm_epochs --out {out}/records",
                "{py} -m benchmarks.gpu_mace --device cpu --quick --no-steps --epoch-ways "
                "stock+binpack cueq+binpack fused-only fused+static --static-epochs 2 "
                "--work {out}/work --out {out}/records",
            ),
            (
                200,
                "{py} -m tools.gpu_capture --device cuda --mode default --backend triton "
                "--no-stock --atoms 500 4000 --dtypes float32 --reps 5 --fused-kernels "
                "symmetric_contraction conv_tp skip_tp --out {out}/capture_default_f32.md",
                None,
            ),
            (
                90,
                "{py} -m benchmarks.efficiency --device cuda --rounds 3 --budget 4 "
                "--out {out}/records",
                None,
            ),
        ],
    ),
}


def commands(call: str, smoke: bool, out: Path, py: str = PY) -> tuple[float, list[str]]:
    """(the call's limit, its commands as shell lines, each under ``timeout``) for the GPU, or for
    a smoke run on the CPU (``smoke``: no limit of its own beyond generous ones)."""
    limit, items = CALLS[call]
    lines = []
    for seconds, gpu, cpu in items:
        line = cpu if smoke else gpu
        if line is None:
            continue
        cap = seconds * (4 if smoke else 1)  # a busy 2-core CPU is slower than the GPU at these
        lines.append(
            f"timeout -k 10 {cap:g} " + line.format(out=shlex.quote(str(out)), py=shlex.quote(py))
        )
    return (limit * 4 if smoke else limit), lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("call", choices=sorted(CALLS), help="which call of the prepared run")
    p.add_argument(
        "--smoke", action="store_true", help="the same list on the CPU with tiny settings"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "out" / "tools" / "gpu_checks",
        help="output folder (the device tool's $OUT); the call's go to OUT/<call>",
    )
    p.add_argument("--limit", type=float, default=None, help="seconds for the whole list")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    out = (args.out / args.call).resolve()
    limit, lines = commands(args.call, args.smoke, out, sys.executable if args.smoke else PY)
    limit = args.limit or limit
    print(f"call {args.call}: {len(lines)} commands within {limit:g} s, output to {out}")
    for k, line in enumerate(lines, 1):
        print(f"  {k}. {line}")
    if args.dry_run:
        return 0
    results = run_list(lines, limit, out)
    print("\n| # | status | s | command |\n|---|---|---|---|")
    for k, r in enumerate(results, 1):
        print(f"| {k} | {r['status']} | {r['seconds']:.1f} | `{r['command']}` |")
    return 0 if all(r["status"] == "exit 0" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
