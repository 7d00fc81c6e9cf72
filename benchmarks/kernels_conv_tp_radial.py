"""Benchmark: the radial MLP + conv TP pair three ways, ratios in one run (CPU).

    python -m benchmarks.kernels_conv_tp_radial            # 512 atoms, float32 and float64
    python -m benchmarks.kernels_conv_tp_radial --quick    # smoke run (small cell, one repeat)

Workload: the interaction of ``benchmarks/kernels_conv_tp.py`` (128x0e+128x1o, l<=3, 1280 weights
per edge) with its weights made as a MACE block makes them: e3nn's ``FullyConnectedNet([8, 64,
64, 64, 1280], silu)`` on 8 radial features per edge. Ways: ``e3nn`` (the MLP, e3nn's
``TensorProduct`` on the gathered senders, ``scatter_sum``), ``fused`` (the MLP, then the fused
conv TP: the ``conv_tp`` kernel), ``radial`` (the MLP's hidden layers, then the conv TP with the
last layer inside its kernels: ``conv_tp_radial``). Both fused ways use the lean SiLU the kernel
table swaps in. Modes as in ``kernels_conv_tp``, with the radial features in the place of the
edge attributes' gradient (force training differentiates both). Each case runs in a fresh
process (median time of the repeats, peak RSS and its rise); writes the record
``kernels_conv_tp_radial``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.kernels_conv_tp import MODES, build_tp, graph_file, run_case, timed_case
from benchmarks.record import add_out_argument, command_line, markdown_table, write_record

WAYS = ("e3nn", "fused", "radial")
RADIAL_IN, HIDDEN_LAYERS = 8, (64, 64, 64)


def worker(args) -> dict:
    """One case in this (fresh) process."""
    import mace  # noqa: F401  (before e3nn: it sets what e3nn 0.4.4 needs on new torch)
    import numpy as np
    import torch
    from e3nn import nn, o3

    from cfm_plugins.ops.silu import LeanSiLU

    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    g = np.load(args.graph)
    N, ei, vec = int(g["num_atoms"]), torch.from_numpy(g["edge_index"]), g["vectors"]
    tp = build_tp(dtype)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    mlp = nn.FullyConnectedNet(
        [RADIAL_IN, *HIDDEN_LAYERS, tp.weight_numel], torch.nn.functional.silu
    )
    torch.set_default_dtype(torch.float64)
    E = ei.shape[1]
    x = torch.randn(N, tp.irreps_in1.dim, dtype=dtype)
    y = o3.spherical_harmonics(
        o3.Irreps.spherical_harmonics(3), torch.from_numpy(vec).to(dtype), True, "component"
    )
    feats = torch.randn(E, RADIAL_IN, dtype=dtype)
    if args.impl == "e3nn":
        from mace.tools.scatter import scatter_sum

        def fn(x, y, f):
            return scatter_sum(tp(x[ei[0]], y, mlp(f)), ei[1], dim=0, dim_size=N)
    else:
        from cfm_plugins.ops.conv_tp import FusedConvTP
        from cfm_plugins.ops.conv_tp_radial import RadialHidden

        for layer in mlp.children():
            if layer.act is not None:
                layer.act = LeanSiLU(layer.act)
        fused = FusedConvTP.from_e3nn(tp)
        if args.impl == "radial":
            hidden = RadialHidden(mlp)
            fused.use_radial(hidden.last_layer())

            def fn(x, y, f):
                return fused(x, y, hidden(f), ei)
        else:

            def fn(x, y, f):
                return fused(x, y, mlp(f), ei)

    params = list(mlp.parameters())

    def step():
        if args.mode == "fwd":
            with torch.no_grad():
                return fn(x, y, feats)
        xs, ys, fs = (t.detach().requires_grad_() for t in (x, y, feats))
        loss = fn(xs, ys, fs).pow(2).sum()
        if args.mode == "fwd+bwd":
            return torch.autograd.grad(loss, (xs, ys, fs, *params))
        gy, gf = torch.autograd.grad(loss, (ys, fs), create_graph=True)
        return torch.autograd.grad(gy.pow(2).sum() + gf.pow(2).sum(), (xs, *params))

    return timed_case(step, args, N, E)


def fmt_table(rows) -> list[str]:
    out = [
        "| atoms | edges | dtype | mode | e3nn MLP + TP (ms) | MLP + fused conv TP (ms) | radial "
        "fusion (ms) | radial / e3nn | radial / MLP + fused | rise e3nn / fused / radial (MiB) |",
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (atoms, edges, dtype, mode), r in rows.items():
        cells = [
            f"{1e3 * r[w]['time_s']:.1f}"
            if "time_s" in r.get(w, {})
            else r.get(w, {}).get("error", "-")
            for w in WAYS
        ]

        def ratio(a, b):
            ok = "time_s" in r.get(a, {}) and "time_s" in r.get(b, {})
            return f"{r[a]['time_s'] / r[b]['time_s']:.2f}x" if ok else "-"

        rise = " / ".join(
            f"{r[w]['rise_mib']:.0f}" if "rise_mib" in r.get(w, {}) else "-" for w in WAYS
        )
        out.append(
            f"| {atoms} | {edges} | {dtype} | {mode} | {' | '.join(cells)} | "
            f"{ratio('radial', 'e3nn')} | {ratio('radial', 'fused')} | {rise} |"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small cell, one repeat")
    ap.add_argument("--sizes", default="512", help="atom counts out of 32,108,256,512,4096")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=570)
    ap.add_argument("--mem-limit-gib", type=float, default=12.0)
    add_out_argument(ap)
    ap.add_argument("--no-write", action="store_true", help="write no record (as --out -)")
    for hidden in ("--worker", "--graph", "--dtype", "--impl", "--mode"):
        ap.add_argument(
            hidden, action="store_true" if hidden == "--worker" else None, help=argparse.SUPPRESS
        )
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return 0
    sizes = [32] if args.quick else [int(s) for s in args.sizes.split(",")]
    dtypes = ["float32"] if args.quick else args.dtypes.split(",")
    repeat = 1 if args.quick else args.repeat
    command = command_line(argv, "benchmarks.kernels_conv_tp_radial")
    print(f"command: {command}", flush=True)
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            n, ei, gfile = graph_file(tmp, size)
            print(f"\n{n} atoms, {ei.shape[1]} edges", flush=True)
            for dtype in dtypes:
                for mode in args.modes.split(","):
                    for impl in WAYS:
                        r = run_case(
                            gfile,
                            dtype,
                            impl,
                            mode,
                            repeat,
                            args.threads,
                            args.timeout,
                            args.mem_limit_gib,
                            script=Path(__file__),
                        )
                        rows.setdefault((n, ei.shape[1], dtype, mode), {})[impl] = r
                        shown = f"{1e3 * r['time_s']:9.1f} ms" if "time_s" in r else r["error"]
                        print(f"  {dtype:8s} {mode:12s} {impl:7s} {shown}", flush=True)
    table = fmt_table(rows)
    print("\n" + "\n".join(table))
    write_record(
        "kernels_conv_tp_radial" + ("_quick" if args.quick else ""),
        "The radial MLP's last layer inside the conv TP (CPU)",
        [
            markdown_table(
                "modes",
                table,
                "ms per call (median): e3nn's MLP + TensorProduct + scatter_sum, the MLP + the "
                "fused conv TP, and the radial fusion; the ratios; each case's memory rise (MiB)",
            )
        ],
        description=(
            "MACE-MP-0 medium-like interaction (128x0e+128x1o, l<=3, 1280 weights per edge) with "
            f"its radial MLP [{RADIAL_IN}, {', '.join(map(str, HIDDEN_LAYERS))}, 1280]; periodic "
            "CuNi fcc cell, r_max 5 A. fwd: forward only; fwd+bwd: gradients w.r.t. node feats, "
            "edge attrs, radial features and the MLP's weights; fwd+bwd+dbl: force training "
            "(edge-attr and radial-feature gradients with create_graph, their loss differentiated "
            f"w.r.t. node feats and the MLP's weights). {args.threads} torch threads, median of "
            f"{repeat} repeats after a warm-up, each case in a fresh process"
        ),
        notes=[
            "Rise = the case's peak RSS minus its RSS once the inputs were built (the operation's "
            "own memory, the per-edge weights and their gradients included)."
        ],
        out="-" if args.no_write else args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
