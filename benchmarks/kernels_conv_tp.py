"""Benchmark: FusedConvTP vs e3nn TensorProduct + scatter_sum (MACE message construction).

    python -m benchmarks.kernels_conv_tp            # 512 and 4096 atoms, float32 and float64
    python -m benchmarks.kernels_conv_tp --quick    # smoke run (small cell, one repeat)

Workload: the MACE-MP-0 "medium" interaction (:func:`build_tp`: node features 128x0e+128x1o,
edge attributes = spherical harmonics up to l=3, target 128x(0e+1o+2e+3o)) on a periodic CuNi fcc
cell (:func:`make_graph`), in the modes of :data:`MODES`. Each (size, dtype, implementation, mode)
runs in a fresh subprocess (:func:`run_case`): time is the median of the repeats after one warm-up
call, memory is that process's peak RSS and its rise above the RSS once the inputs are built
(:func:`timed_case`). Prints the table and writes the record ``kernels_conv_tp`` (``--quick``:
``kernels_conv_tp_quick``) to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import add_out_argument, command_line, markdown_table, write_record

ROOT = Path(__file__).resolve().parents[1]
#: ``fwd``: no grad; ``fwd+bwd``: gradients w.r.t. node feats, edge attrs and weights;
#: ``fwd+bwd+dbl``: MACE force training, the edge-attribute gradient with create_graph, then a loss
#: on it differentiated w.r.t. node feats and weights
MODES = ("fwd", "fwd+bwd", "fwd+bwd+dbl")
HIDDEN, LMAX, CHANNELS, R_MAX = "0e+1o", 3, 128, 5.0


def make_graph(repeat, seed=0):
    """Positions-derived edge data of a CuNi fcc cell (a=3.6 A, 30% Ni, rattled 0.05 A), the
    neighbour list at r_max 5 A: (num_atoms, edge_index, edge vectors)."""
    import numpy as np
    from ase.build import bulk
    from ase.neighborlist import neighbor_list

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(repeat)
    rng = np.random.default_rng(seed)
    atoms.symbols[rng.choice(len(atoms), int(0.3 * len(atoms)), replace=False)] = "Ni"
    atoms.rattle(0.05, seed=seed)
    i, j, D = neighbor_list("ijD", atoms, R_MAX)
    return len(atoms), np.stack([j, i]).astype(np.int64), D  # sender j -> receiver i


def build_tp(dtype):
    """The e3nn ``TensorProduct`` of MACE-MP-0 "medium"'s interaction, built as mace builds it
    (``tp_out_irreps_with_instructions``, uvu, per-edge weights). The benchmark calls it with
    random per-edge weights (in MACE they come from the radial MLP) and random node features."""
    from cfm_plugins.testing import mace_conv_tp

    return mace_conv_tp(HIDDEN, LMAX, CHANNELS, dtype)


#: atom count -> the cell repeats of make_graph
REPEATS = {32: (2, 2, 2), 108: (3, 3, 3), 256: (4, 4, 4), 512: (8, 4, 4), 4096: (16, 8, 8)}


def graph_file(folder, size: int):
    """(atoms, edge_index, the .npz the workers read) of the ``size``-atom cell in ``folder``."""
    import numpy as np

    n, ei, vec = make_graph(REPEATS[size])
    path = Path(folder) / f"g{size}.npz"
    np.savez(path, num_atoms=n, edge_index=ei, vectors=vec)
    return n, ei, path


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args) -> dict:
    """One case in this (fresh) process; prints a JSON line."""
    import numpy as np
    import torch

    if args.mem_limit_gib > 0:  # fail with MemoryError instead of waking the machine's OOM killer
        lim = int(args.mem_limit_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    g = np.load(args.graph)
    N, ei_np, vec = int(g["num_atoms"]), g["edge_index"], g["vectors"]
    tp = build_tp(dtype)
    from e3nn import o3

    torch.manual_seed(0)
    ei = torch.from_numpy(ei_np)
    E = ei.shape[1]
    x = torch.randn(N, tp.irreps_in1.dim, dtype=dtype)
    y = o3.spherical_harmonics(
        o3.Irreps.spherical_harmonics(LMAX),
        torch.from_numpy(vec).to(dtype),
        True,
        normalization="component",
    )
    w = torch.randn(E, tp.weight_numel, dtype=dtype)
    if args.impl == "fused":
        from cfm_plugins.ops import _backend
        from cfm_plugins.ops.conv_tp import FusedConvTP

        fused = FusedConvTP.from_e3nn(tp)
        backend = "C++" if _backend.choose(torch.device("cpu")) == "cpu" else "torch fallback"
        fn = lambda x, y, w: fused(x, y, w, ei)  # noqa: E731
    else:
        from mace.tools.scatter import scatter_sum

        backend = "e3nn"
        fn = lambda x, y, w: scatter_sum(tp(x[ei[0]], y, w), ei[1], dim=0, dim_size=N)  # noqa: E731

    def step():
        if args.mode == "fwd":
            with torch.no_grad():
                return fn(x, y, w)
        xs, ys, ws = (t.detach().requires_grad_() for t in (x, y, w))
        out = fn(xs, ys, ws)
        loss = (out * out).sum()
        if args.mode == "fwd+bwd":
            return torch.autograd.grad(loss, (xs, ys, ws))
        _, gy, _ = torch.autograd.grad(loss, (xs, ys, ws), create_graph=True)
        return torch.autograd.grad((gy * gy).sum(), (xs, ws))

    return dict(timed_case(step, args, N, E), backend=backend)


def timed_case(step, args, atoms: int, edges: int) -> dict:
    """The case's row: ``step`` run ``args.repeat`` times after a warm-up (median time), the
    process's peak RSS and its rise above the RSS before the first call."""
    import numpy as np

    base = rss_mib()
    times = []
    for _ in range(args.repeat + 1):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return dict(
        atoms=atoms,
        edges=edges,
        dtype=args.dtype,
        impl=args.impl,
        mode=args.mode,
        time_s=float(np.median(times[1:])),
        peak_mib=peak,
        rise_mib=peak - base,
    )


def run_case(
    graph_npz, dtype, impl, mode, repeat, threads, timeout, mem_limit, script=None
) -> dict:
    """One case in a fresh process running ``script``'s worker (default: this file's)."""
    cmd = [
        sys.executable,
        str(Path(script or __file__).resolve()),
        "--worker",
        "--graph",
        str(graph_npz),
        "--dtype",
        dtype,
        "--impl",
        impl,
        "--mode",
        mode,
        "--repeat",
        str(repeat),
        "--threads",
        str(threads),
        "--mem-limit-gib",
        str(mem_limit),
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": str(threads),
    }
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )
    except subprocess.TimeoutExpired:
        return dict(dtype=dtype, impl=impl, mode=mode, error=f"timeout {timeout}s")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
        text = res.stderr or res.stdout
        if res.returncode in (-9, 137) or "MemoryError" in text or "alloc" in text.lower():
            why = f"out of memory (> {mem_limit:g} GiB)"
        else:
            why = tail[0][:120]
        return dict(dtype=dtype, impl=impl, mode=mode, error=why)
    return json.loads(lines[-1])


def fmt_table(rows) -> list[str]:
    out = [
        "| atoms | edges | dtype | mode | e3nn+scatter (ms) | fused (ms) | speed-up | e3nn peak / "
        "rise (MiB) | fused peak / rise (MiB) | peak ratio | rise ratio |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (atoms, edges, dtype, mode), pair in rows.items():
        ref, fu = pair.get("e3nn", {}), pair.get("fused", {})

        def cell_t(r):
            return f"{1e3 * r['time_s']:.1f}" if "time_s" in r else r.get("error", "-")

        def cell_m(r):
            return f"{r['peak_mib']:.0f} / {r['rise_mib']:.0f}" if "peak_mib" in r else "-"

        ok = "time_s" in ref and "time_s" in fu
        sp = f"{ref['time_s'] / fu['time_s']:.1f}x" if ok else "-"
        pr = f"{fu['peak_mib'] / ref['peak_mib']:.2f}" if ok else "-"
        rr = f"{fu['rise_mib'] / max(ref['rise_mib'], 1e-9):.3f}" if ok else "-"
        out.append(
            f"| {atoms} | {edges} | {dtype} | {mode} | {cell_t(ref)} | {cell_t(fu)} | {sp} | "
            f"{cell_m(ref)} | {cell_m(fu)} | {pr} | {rr} |"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick", action="store_true", help="smoke run: small cell, float32, one repeat"
    )
    ap.add_argument("--sizes", default="512,4096", help="atom counts out of 32,108,256,512,4096")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--mem-limit-gib",
        type=float,
        default=12.0,
        help="address-space limit of each case (0: none); a case over it reports out of memory",
    )
    add_out_argument(ap)
    ap.add_argument("--no-write", action="store_true", help="write no record (as --out -)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--graph", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--impl", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0

    sizes = [32] if args.quick else [int(s) for s in args.sizes.split(",")]
    dtypes = ["float32"] if args.quick else args.dtypes.split(",")
    modes = args.modes.split(",")
    repeat = 1 if args.quick else args.repeat
    command = command_line(argv)
    print(f"command: {command}")
    print(
        f"workload: node feats {CHANNELS}x({HIDDEN}), sh l<={LMAX}, target "
        f"{CHANNELS}x(0e+1o+2e+3o), "
        f"CuNi fcc, r_max {R_MAX} A; torch threads {args.threads}; repeats {repeat} (median)",
        flush=True,
    )
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            n, ei, gfile = graph_file(tmp, size)
            print(f"\n{n} atoms, {ei.shape[1]} edges ({ei.shape[1] / n:.1f} per atom)", flush=True)
            for dtype in dtypes:
                for mode in modes:
                    for impl in ("e3nn", "fused"):
                        r = run_case(
                            gfile,
                            dtype,
                            impl,
                            mode,
                            repeat,
                            args.threads,
                            args.timeout,
                            args.mem_limit_gib,
                        )
                        rows.setdefault((n, ei.shape[1], dtype, mode), {})[impl] = r
                        shown = (
                            (
                                f"{1e3 * r['time_s']:9.1f} ms  peak {r['peak_mib']:7.0f} MiB  rise "
                                f"{r['rise_mib']:7.0f} MiB  [{r['backend']}]"
                            )
                            if "time_s" in r
                            else r["error"]
                        )
                        print(f"  {dtype:8s} {mode:12s} {impl:6s} {shown}", flush=True)
    table = fmt_table(rows)
    print("\n" + "\n".join(table))
    from benchmarks.kernels import gpu_note  # here: the worker runs this file as a script

    write_record(
        "kernels_conv_tp" + ("_quick" if args.quick else ""),
        "Fused conv TP + scatter (MACE message construction) on the CPU",
        [
            markdown_table(
                "modes",
                table,
                "ms per call (median) of e3nn's TensorProduct + scatter_sum and of the fused conv "
                "TP, the speed-up, and each case's peak / rise of memory (MiB) with their ratios",
            )
        ],
        description=(
            f"MACE-MP-0 medium-like interaction: node features {CHANNELS}x0e+{CHANNELS}x1o, "
            f"spherical harmonics l<={LMAX}, e3nn TensorProduct built as mace builds it (10 uvu "
            "paths, 1280 per-edge weights, 5120 output components per node); periodic CuNi fcc "
            f"cells, neighbour list at r_max {R_MAX} A. Baseline: e3nn TensorProduct on gathered "
            "sender features + scatter_sum, in the same run. fwd: forward only; fwd+bwd: "
            "gradients w.r.t. node feats, edge attrs and weights; fwd+bwd+dbl: force-training "
            "pattern (edge-attr gradient with create_graph, then its loss differentiated w.r.t. "
            f"node feats and weights). {args.threads} torch threads, median of {repeat} repeats "
            "after a warm-up, each case in a fresh process"
        ),
        notes=[
            "Peak = the case's process ru_maxrss (the interpreter, torch and the inputs "
            "included); rise = peak minus the RSS once the inputs were built (the operation's "
            f"own memory). Each case runs under a {args.mem_limit_gib:g} GiB address-space "
            "limit: 'out of memory' means the case needs more than that.",
            gpu_note("cuda/conv_tp/conv_tp.cu", "the conv TP with its scatter alone"),
        ],
        out="-" if args.no_write else args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
