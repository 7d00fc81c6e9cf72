"""Host time a Triton launch spends finding its generated kernel, with and without the kernel cache.

    .venv/bin/python -m tools.triton_host [--reps 200]

No GPU needed: this is Python on the host, the same on any machine with the same CPU. Workload:
every conv TP and symmetric contraction kernel variant a MACE force-training step launches, on the
layer of ``tools/triton_check.py`` (:func:`_variants`). Per launch, two ways in the same run
(:func:`main`): *generate* (the source written and hashed) and *cached* (``KernelCache.get``).
The ratio is what the cache saves a launch in host time; an eager GPU step at 500 atoms is bound
by host time (docs/benchmarks.md), and ``tools/gpu_profile.py`` counts a train step's launches.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

COMMAND = ".venv/bin/python -m tools.triton_host"


def _variants():
    """(label, tables, kernel, flags, source function, cache, family) of each variant of the
    workload: the MACE-MP-medium-like layer of :func:`tools.triton_check._workload_tables` (conv TP
    128x(0e+1o) x spherical harmonics l<=3; symmetric contraction 128x(0e+1o+2e+3o) -> 128x(0e+1o),
    correlation 3), every kernel variant a MACE force-training step launches."""
    from cfm_plugins.ops.triton import conv_tp as ttp
    from cfm_plugins.ops.triton import symmetric_contraction as tsc
    from tools.triton_check import _workload_tables

    sct, tpt, tpt_t = _workload_tables()
    out = []
    for kernel, transposed, flags in ttp.kernel_variants():
        out.append(
            (
                ttp.compiled_name(kernel, transposed, flags),
                tpt_t if transposed else tpt,
                kernel,
                dict(transposed=transposed, **flags),
                ttp.source,
                ttp._KERNELS,
                "tp",
            )
        )
    for kernel, flags in tsc.kernel_variants():
        out.append(
            (tsc.compiled_name(kernel, flags), sct, kernel, flags, tsc.source, tsc._KERNELS, "sc")
        )
    return out


def _per_call(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    """Per launch, two ways in the same run, mean host time of ``--reps`` calls:

    - *generate*: write the kernel's source from the tables and hash it to find the imported module
      (:func:`cfm_plugins.ops.triton._codegen.load_source`), what a launch without the kernel cache
      does (the table's "before" column);
    - *cached*: ``_codegen.KernelCache.get``, a dictionary lookup (the "now" column).
    """
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    from cfm_plugins.ops.triton import _codegen

    lines = [
        f"Command: `{COMMAND} --reps {args.reps}` ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; host time per launch, mean of {args.reps})",
        "",
        "| kernel | generate + hash (before) | cached (now) | ratio |",
        "|---|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    totals = {"tp": [0.0, 0.0, 0], "sc": [0.0, 0.0, 0]}
    for label, tables, kernel, flags, source, cache, family in _variants():
        name = f"{family}_{kernel}" + "".join(f"_{k}{int(v)}" for k, v in sorted(flags.items()))
        before = _per_call(
            lambda: _codegen.load_source(name, source(tables, kernel, **flags)), args.reps
        )
        now = _per_call(lambda: cache.get(tables, kernel, **flags), args.reps)
        totals[family][0] += before
        totals[family][1] += now
        totals[family][2] += 1
        lines.append(
            f"| {label} | {before * 1e3:.3f} ms | {now * 1e3:.4f} ms | {now / before:.4f}x |"
        )
        print(lines[-1], flush=True)
    tp, sc = totals["tp"], totals["sc"]
    lines += [
        "",
        f"Mean over the variants: conv TP {tp[0] / tp[2] * 1e3:.3f} -> {tp[1] / tp[2] * 1e3:.4f} "
        "ms a "
        f"launch, symmetric contraction {sc[0] / sc[2] * 1e3:.3f} -> {sc[1] / sc[2] * 1e3:.4f} ms.",
    ]
    print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
