"""Benchmark: the fused skip connection (FusedSkipTP) vs e3nn's FullyConnectedTensorProduct.

    python -m benchmarks.kernels_skip_tp            # 512 nodes, float32 and float64
    python -m benchmarks.kernels_skip_tp --quick    # smoke run (64 nodes, one repeat)

Workload: MACE-MP-0 "medium"'s skip connection: ``FullyConnectedTensorProduct(128x0e+128x1o,
89x0e, 128x0e+128x1o)`` built as mace builds it (:func:`build`), called with the one-hot of each
node's element among the 89 of the table; random node features, the elements drawn among all 89
and among 2 (:data:`ELEMENTS`), in the modes of :data:`MODES`. e3nn's module and the fused one run
in the same process, one call of each in turn (:func:`time_pair`), so that both see the same
machine. Prints the table and writes the record ``kernels_skip_tp`` (``--quick``:
``kernels_skip_tp_quick``) to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.record import add_out_argument, command_line, markdown_table, write_record

#: ``fwd``: no grad; ``fwd+bwd``: gradients w.r.t. node features and weights; ``fwd+bwd+dbl``: MACE
#: force training, the node-feature gradient with create_graph, then a loss on it differentiated
#: w.r.t. node features and weights (:func:`step`)
MODES = ("fwd", "fwd+bwd", "fwd+bwd+dbl")
#: the elements of the table; a row's nodes draw theirs uniformly among all of them (every element
#: present: the most weight blocks to read and the largest weight gradient) or among 2 (a CuNi-like
#: batch), ``--present``
IRREPS, ELEMENTS = "128x0e+128x1o", 89


def build(dtype):
    """mace's skip connection (no cuEquivariance) in ``dtype`` and the fused module sharing its
    weights."""
    import mace  # noqa: F401  (before e3nn)
    import torch
    from e3nn import o3
    from mace.modules.wrapper_ops import FullyConnectedTensorProduct

    from cfm_plugins.ops.skip_tp import FusedSkipTP

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        tp = FullyConnectedTensorProduct(
            o3.Irreps(IRREPS), o3.Irreps(f"{ELEMENTS}x0e"), o3.Irreps(IRREPS)
        )
    finally:
        torch.set_default_dtype(previous)
    return tp, FusedSkipTP.from_e3nn(tp)


def step(module, weight, x, y, mode):
    import torch

    if mode == "fwd":
        with torch.no_grad():
            return module(x, y)
    xs = x.detach().requires_grad_()
    out = module(xs, y)
    loss = (out * out).sum()
    if mode == "fwd+bwd":
        return torch.autograd.grad(loss, (xs, weight))
    (gx,) = torch.autograd.grad(loss, xs, create_graph=True)
    return torch.autograd.grad((gx * gx).sum(), (xs, weight))


def time_pair(tp, fused, x, y, mode, repeat) -> tuple[float, float]:
    """Median seconds per call of e3nn's module and of the fused one, called in turn (so that both
    see the same machine), after a warm-up round."""
    times = {"e3nn": [], "fused": []}
    for i in range(repeat + 1):
        for name, module in (("e3nn", tp), ("fused", fused)):
            t0 = time.perf_counter()
            step(module, tp.weight, x, y, mode)
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["e3nn"]), statistics.median(times["fused"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 64 nodes, float32, 1 repeat")
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--present", default=f"{ELEMENTS},2", help="elements present in the batch, per row"
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    add_out_argument(ap)
    ap.add_argument("--no-write", action="store_true", help="write no record (as --out -)")
    args = ap.parse_args(argv)

    import torch

    from cfm_plugins.ops import _backend

    torch.set_num_threads(args.threads)
    nodes = 64 if args.quick else args.nodes
    dtypes = ["float32"] if args.quick else args.dtypes.split(",")
    repeat = 1 if args.quick else args.repeat
    present = [int(p) for p in args.present.split(",")]
    backend = "C++" if _backend.choose(torch.device("cpu")) == "cpu" else "e3nn (no library)"
    command = command_line(argv)
    print(f"command: {command}")
    print(
        f"workload: {IRREPS} x {ELEMENTS}x0e -> {IRREPS}, {nodes} nodes; torch threads "
        f"{args.threads}; repeats {repeat} (median); fused backend {backend}",
        flush=True,
    )
    lines = [
        "| nodes | elements present | dtype | mode | e3nn (ms) | fused (ms) | fused / e3nn |",
        "|---:|---:|---|---|---:|---:|---:|",
    ]
    headline = {}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        tp, fused = build(dtype)
        for k in present:
            gen = torch.Generator().manual_seed(k)
            idx = torch.randint(0, k, (nodes,), generator=gen)
            y = torch.nn.functional.one_hot(idx, ELEMENTS).to(dtype)
            x = torch.randn(nodes, tp.irreps_in1.dim, generator=gen, dtype=torch.float64).to(dtype)
            for mode in args.modes.split(","):
                t_e3nn, t_fused = time_pair(tp, fused, x, y, mode, repeat)
                ratio = t_fused / t_e3nn
                lines.append(
                    f"| {nodes} | {k} | {dtype_name} | {mode} | {1e3 * t_e3nn:.1f} | "
                    f"{1e3 * t_fused:.2f} | {ratio:.3f} |"
                )
                print(lines[-1], flush=True)
                if k == ELEMENTS and mode == "fwd+bwd+dbl":
                    headline[f"{dtype_name} fwd+bwd+dbl, fused / e3nn"] = round(ratio, 4)
    print("\n" + "\n".join(lines))
    write_record(
        "kernels_skip_tp" + ("_quick" if args.quick else ""),
        "Fused skip connection (MACE's element-weighted self-interaction) on the CPU",
        [
            markdown_table(
                "modes",
                lines,
                "ms per call (median) of e3nn's FullyConnectedTensorProduct and of the fused "
                "per-element linear map, and their ratio (the fused module's time over e3nn's)",
            )
        ],
        description=(
            f"MACE-MP-0 medium-like skip connection: FullyConnectedTensorProduct({IRREPS}, "
            f"{ELEMENTS}x0e, {IRREPS}) as mace builds it, called with the one-hot of each node's "
            f"element; {nodes} nodes, elements drawn uniformly among the number present (all "
            f"{ELEMENTS}, or 2 as in a CuNi batch). Baseline: e3nn's module, in the same process, "
            "called in turn with the fused one. fwd: forward only; fwd+bwd: gradients w.r.t. "
            "node features and weights; fwd+bwd+dbl: force-training pattern (node-feature "
            "gradient with create_graph, then its loss differentiated w.r.t. node features and "
            f"weights). {args.threads} torch threads, median of {repeat} repeats after a warm-up"
        ),
        headline=headline,
        notes=[
            "e3nn evaluates the product over all 89 one-hot components; the fused module "
            "multiplies each node's features by its own element's weight block (nodes grouped by "
            "element, register-tiled GEMMs, OpenMP over tiles); the weight gradient is written "
            "for every element (zeros where none is present).",
            "GPU: this benchmark times the CPU kernels. The skip connection's GPU kernel is "
            "Triton's only (no C++ CUDA kernel); no GPU has timed it, so on GPUs it runs only "
            "where fused_kernels names skip_tp (e3nn's module under auto).",
        ],
        out="-" if args.no_write else args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
