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
# the call's output folder, ``{py}`` the Python. The commands are in the order of what they decide,
# the cheapest decisive first; each runs under its own ``timeout`` too, so a slow one cannot eat the
# next ones' minutes. Call ``a`` also sets the machine up (``run.sh``). The lists' limits bind
# (their commands' own limits add up to more): a command cut by its own limit keeps what it
# printed, and what is not reached is said ("not started: no time left") and goes first into the
# next call.
CALLS: dict[str, tuple[float, list[tuple[float, str, str | None]]]] = {
    "a": (
        420.0,
        [
            # the conv TP tests on CUDA: the C++ CUDA kernels store their outputs whole, without
            # a zero fill (compiled on a CPU machine, run only here)
            (
                90,
                "{py} -m pytest -q -p no:cacheprovider -rs tests/ops/test_conv_tp.py -k "
                "'unfilled or gaps or cuda_matches_cpu or cuda_gradgradcheck'",
                None,
            ),
            # two ranks sharing one GPU with gloo: the same losses and weights as on the CPU to
            # 1e-8, float64
            (
                150,
                "{py} -m pytest -q -p no:cacheprovider -rs tests/test_distributed.py -k on_one_gpu",
                "{py} -m pytest -q -p no:cacheprovider -rs tests/test_distributed.py -k on_one_gpu",
            ),
            # the per-module profile of the train step at 4000 atoms, float64 and float32,
            # cuEquivariance and ours in one run, ours with the default kernels and with the skip
            # connection's kernel named (its GPU kernel runs only then)
            (
                150,
                "{py} -m tools.gpu_profile --by-module --device cuda --backend triton --atoms 4000 "
                "--dtypes float64 float32 --ways cueq fused --kernels-also "
                "symmetric_contraction,conv_tp,skip_tp --out {out}/profile_4000.md",
                "{py} -m tools.gpu_profile --by-module --device cpu --quick --dtypes float64 "
                "--ways cueq fused --kernels-also symmetric_contraction,conv_tp,skip_tp "
                "--out {out}/profile_quick.md",
            ),
            # the eager train step at 500, 2000 and 4000 atoms, float32 and float64, stock,
            # cuEquivariance and ours (default kernels, with the skip connection's kernel, and with
            # the radial fusion too) in one run: the record ``gpu_mace_step``
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
            # the compiled static step (``compile=default``, no capture) at 4000 atoms in float64:
            # exact against the eager step (1e-10), its compile time, its step time
            (
                150,
                "{py} -m tools.gpu_capture --device cuda --mode default --backend triton "
                "--no-stock --atoms 4000 --dtypes float64 --reps 5 "
                "--out {out}/capture_default_f64.md",
                "{py} -m tools.gpu_capture --device cpu --mode default --compile-backend aot_eager "
                "--quick --no-stock --dtypes float64 --out {out}/capture_default_f64.md",
            ),
        ],
    ),
    "b": (
        540.0,
        [
            # the fair epoch table: ``mace_run_train`` on 300 structures, float32, the second
            # epoch timed: stock; stock + binpack; cuEquivariance; cuEquivariance + binpack; the
            # fused kernels alone; fused + binpack; and fused + binpack + static with
            # ``compile=default`` over 5 epochs, with the epoch after which its compile is repaid
            # (the record ``gpu_mace_epoch``)
            (
                480,
                "{py} -m benchmarks.gpu_mace --device cuda --backend triton --no-steps "
                "--epoch-structures 300 --epoch-ways stock stock+binpack cueq cueq+binpack "
                "fused-only fused fused+static --static-epochs 5 "
                "--epoch-timeout 70 70 90 90 60 60 200 --work /tmp/cfm_epochs --out {out}/records",
                "{py} -m benchmarks.gpu_mace --device cpu --quick --no-steps --epoch-ways "
                "stock+binpack cueq+binpack fused-only fused+static --static-epochs 2 "
                "--compile-backend aot_eager --work {out}/work --out {out}/records",
            ),
            # the compiled static step in float32 at 500 and 4000 atoms, with the skip
            # connection's kernel
            (
                200,
                "{py} -m tools.gpu_capture --device cuda --mode default --backend triton "
                "--no-stock --atoms 500 4000 --dtypes float32 --reps 5 --fused-kernels "
                "symmetric_contraction conv_tp skip_tp --out {out}/capture_default_f32.md",
                None,
            ),
            # the kernel efficiency table (``benchmarks.efficiency``)
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
