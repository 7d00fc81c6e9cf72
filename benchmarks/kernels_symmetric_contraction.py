"""Benchmark: fused symmetric contraction vs mace-torch and cuEquivariance-torch (CPU path).

    python -m benchmarks.kernels_symmetric_contraction [--quick] [--nodes 512 4096]
        [--dtypes float32 float64] [--out DIR]

Workload: a MACE-MP-0 "medium"-like product basis (hidden 128x0e+128x1o, x of [nodes, 128, 16]:
spherical harmonics up to l=3, correlation 3, 89 elements, random element per node); float32 and
float64; --threads 2. Modes:
  fwd        out = SC(x, y)
  fwd+bwd    d sum(out^2) / d x                (what forces need)
  fwd+bwd+2  d |d sum(out^2)/dx|^2 / d weights  (what force training needs)
Every (implementation, dtype, nodes) runs in a fresh subprocess with memory and time limits (a
peer that runs out is reported, the run goes on); time and peak RSS per mode; ratios from one run.
Writes the record ``kernels_symmetric_contraction`` (``--quick``:
``kernels_symmetric_contraction_quick``) to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.record import add_out_argument, command_line, table, write_record

ROOT = Path(__file__).resolve().parents[1]
IMPLS = ("fused", "mace", "cueq")
MODES = ("fwd", "fwd+bwd", "fwd+bwd+2")
HIDDEN, MUL, CORR, ELEMENTS = "128x0e+128x1o", 128, 3, 89


def _rss_kib() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _worker(impl: str, dtype_name: str, nodes: int, reps: int, threads: int) -> dict:
    """One (implementation, dtype, nodes) case in this (fresh) process: per mode the median of
    ``reps`` calls after a warm-up call, and the peak RSS (ru_maxrss minus the RSS before the
    first call). The modes run in increasing memory order, so each figure is that mode's peak."""
    import mace  # noqa: F401  (before e3nn)
    import torch
    from e3nn import o3
    from mace.modules.symmetric_contraction import SymmetricContraction

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    torch.set_default_dtype(dtype)
    torch.manual_seed(0)
    irreps_in = o3.Irreps("+".join(f"{MUL}x{ir}" for ir in ("0e", "1o", "2e", "3o")))
    x0 = torch.randn(nodes, MUL, 16, dtype=dtype)
    idx = torch.randint(0, ELEMENTS, (nodes,))
    y = torch.nn.functional.one_hot(idx, ELEMENTS).to(dtype)
    if impl == "cueq":
        import cuequivariance as cue
        import cuequivariance_torch as cuet

        mod = cuet.SymmetricContraction(
            cue.Irreps("O3", str(irreps_in)),
            cue.Irreps("O3", HIDDEN),
            contraction_degree=CORR,
            num_elements=ELEMENTS,
            layout_in=cue.ir_mul,
            layout_out=cue.mul_ir,
            original_mace=True,
            dtype=dtype,
            math_dtype=dtype,
            method="naive",
        )

        def call(x):
            return mod(x.transpose(1, 2).flatten(1), idx.int())
    else:
        sc = SymmetricContraction(
            irreps_in, o3.Irreps(HIDDEN), CORR, num_elements=ELEMENTS, use_reduced_cg=False
        )
        if impl == "fused":
            from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

            mod = FusedSymmetricContraction.from_mace(sc)
        else:
            mod = sc

        def call(x):
            return mod(x, y)

    params = [p for p in mod.parameters() if p.requires_grad]

    def run(mode):
        if mode == "fwd":
            with torch.no_grad():
                call(x0)
            return
        x = x0.clone().requires_grad_(True)
        out = call(x)
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=(mode == "fwd+bwd+2"))
        if mode == "fwd+bwd+2":
            torch.autograd.grad(gx.pow(2).sum(), params)

    res = {}
    base = _rss_kib()
    for mode in MODES:
        run(mode)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            run(mode)
            times.append(time.perf_counter() - t)
        times.sort()
        res[mode] = {
            "s": times[len(times) // 2],
            "peak_mib": max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
        }
    return res


def _limit_memory(gib: float):
    def apply():
        lim = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    return apply


def run_case(impl, dtype, nodes, reps, threads, timeout, mem_gib) -> dict:
    """One case in a fresh subprocess (:func:`_worker`) with an address-space limit and a time
    limit, so that a peer running out of memory is reported ("OOM"/"timeout") without killing
    the run."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.kernels_symmetric_contraction",
        "--worker",
        json.dumps([impl, dtype, nodes, reps, threads]),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    try:
        p = subprocess.run(
            cmd,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limit_memory(mem_gib),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout>{timeout:.0f}s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr or "")[-400:]
    oom = (
        "out of memory" in tail.lower()
        or "MemoryError" in tail
        or "std::bad_alloc" in tail
        or p.returncode < 0
    )
    return {
        "error": "OOM"
        if oom
        else f"failed (rc {p.returncode}): {tail.strip().splitlines()[-1] if tail.strip() else ''}"
    }


def _fmt(case, mode):
    if "error" in case:
        return case["error"], "-"
    r = case[mode]
    return f"{r['s'] * 1e3:.1f}", f"{r['peak_mib']:.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: 128 nodes, float32, 1 repetition"
    )
    ap.add_argument("--nodes", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    ap.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per (impl, dtype, nodes) subprocess"
    )
    ap.add_argument(
        "--mem-gib", type=float, default=12.0, help="address-space limit per subprocess"
    )
    add_out_argument(ap)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(_worker(*json.loads(args.worker))), flush=True)
        return 0
    if args.quick:
        args.nodes, args.dtypes, args.reps, args.timeout = [128], ["float32"], 1, 300.0
    command = command_line(argv)
    print(
        f"workload: hidden {HIDDEN}, x [nodes, {MUL}, 16] (l<=3), correlation {CORR}, {ELEMENTS} "
        f"elements, {args.threads} threads; nodes {args.nodes}; dtypes {args.dtypes}"
    )
    print(f"command: {command}")
    rows = []
    for dtype in args.dtypes:
        for nodes in args.nodes:
            cases = {
                impl: run_case(
                    impl, dtype, nodes, args.reps, args.threads, args.timeout, args.mem_gib
                )
                for impl in args.impls
            }
            for mode in MODES:
                row = [dtype, str(nodes), mode]
                for impl in args.impls:
                    row += list(_fmt(cases[impl], mode))
                f = cases.get("fused", {})
                for peer in ("mace", "cueq"):
                    if (
                        peer in cases
                        and "error" not in cases[peer]
                        and "error" not in f
                        and "fused" in cases
                    ):
                        row.append(f"{cases[peer][mode]['s'] / f[mode]['s']:.1f}x")
                    elif peer in cases:
                        row.append(cases[peer].get("error", "-") if "error" in cases[peer] else "-")
                rows.append(row)
                print(" | ".join(row), flush=True)
    header = ["dtype", "nodes", "mode"]
    for impl in args.impls:
        header += [f"{impl} ms", f"{impl} peak MiB"]
    header += [f"speed-up vs {p}" for p in ("mace", "cueq") if p in args.impls]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]
    print("\n".join(lines))
    _write_record(args, command, table("modes", header, rows, _CAPTION))
    return 0


_CAPTION = (
    "ms per call (median) and peak MiB (ru_maxrss growth after set-up) of each implementation, "
    "and the fused kernel's speed-up against each peer in the same run"
)


def _write_record(args, command: str, modes: dict) -> None:
    import torch

    from benchmarks.kernels import gpu_note
    from cfm_plugins.ops import _backend

    isa = (
        "C++ operators (AVX2 when the CPU has it)"
        if _backend.choose(torch.device("cpu")) == "cpu"
        else "not built (torch fallback)"
    )
    write_record(
        "kernels_symmetric_contraction" + ("_quick" if args.quick else ""),
        "Fused symmetric contraction (MACE product basis) on the CPU",
        [modes],
        description=(
            f'MACE-MP-0 "medium"-like: hidden {HIDDEN}, node features with spherical harmonics '
            f"up to l=3 (x is [nodes, {MUL}, 16]), correlation {CORR}, {ELEMENTS} elements "
            "(random per node), mace's use_reduced_cg=False U matrices; "
            f"torch.set_num_threads({args.threads}). Modes: fwd; fwd+bwd = grad of sum(out^2) "
            "w.r.t. x (forces); fwd+bwd+2 = grad of |d sum(out^2)/dx|^2 w.r.t. the weights "
            f"(force training). Median of {args.reps} after a warm-up; each (implementation, "
            f"dtype, nodes) in a fresh subprocess (address space limited to {args.mem_gib:g} "
            f"GiB, {args.timeout:.0f} s). Peers: mace-torch's SymmetricContraction, "
            "cuEquivariance-torch's SymmetricContraction on its pure-torch CPU path "
            '(method="naive")'
        ),
        notes=[
            f"CPU kernel ISA: {isa}.",
            gpu_note("cuda/symmetric_contraction/sc_cuda.cu", "the symmetric contraction alone"),
        ],
        out=args.out,
        command=command,
    )


if __name__ == "__main__":
    sys.exit(main())
