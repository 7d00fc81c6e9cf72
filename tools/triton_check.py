"""Ahead-of-time compile check of the Triton kernels (``make triton-check``): no GPU needed.

    .venv/bin/python -m tools.triton_check [--jobs 2] [--targets sm_80 sm_90 gfx90a gfx942]
    .venv/bin/python -m tools.triton_check --quick    # default configs only, nothing written
    .venv/bin/python -m tools.triton_check --kernels skip_apply skip_wgrad   # those families only

Every kernel variant a MACE run launches (:func:`_sources`, on the MACE-MP-medium-like layer of
``benchmarks/gpu_mace.py``), in float32 and float64, in its default tile config and every
autotuning alternative (``cfm_plugins/ops/triton/configs.py``), is compiled with
``triton.compile`` for sm_80 (A100), sm_90 (H100/H200), gfx90a (MI250X) and gfx942 (MI300), as a
launch would specialise it (:func:`jobs`). It prints one row per (kernel, dtype, config, target):
registers, spills, compile seconds, and fails (exit 1) on a compile error or on spills in a
default config (:func:`main`). The table goes to ``out/tools/triton_check.md`` (``--report``)
unless ``--quick`` or ``--no-write``; it is printed either way.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import importlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "out" / "tools" / "triton_check.md"
COMMAND = ".venv/bin/python -m tools.triton_check --jobs 2"


@dataclass(frozen=True)
class Job:
    """One compile: a generated module (name + source; empty: the weight-gradient reduction's own
    file) and the function in it, its specimen argument values, the tile config and the target."""

    name: str
    module: str
    source: str
    function: str
    specimen: tuple
    config: object
    default: bool
    dtype: str
    target: str
    block_names: tuple  # (rows constexpr, channels constexpr)
    constants: tuple = ()  # further constexpr (name, value) pairs of a plain kernel


def _workload_tables():
    """The host tables of the workload's layer: (symmetric contraction, conv TP, conv TP
    transposed).

    The layer is the MACE-MP-medium-like one of ``benchmarks/gpu_mace.py``. Symmetric contraction:
    node features 128x(0e+1o+2e+3o), output 128x(0e+1o), correlation 3 (494 monomials, 410 terms);
    conv TP: node features 128x(0e+1o) times spherical harmonics l<=3 (the second interaction
    layer, the larger one)."""
    import mace  # noqa: F401  (before e3nn)
    import torch
    from e3nn import o3
    from mace.modules.symmetric_contraction import SymmetricContraction

    from cfm_plugins.ops.conv_tp import FusedConvTP
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
    from cfm_plugins.ops.triton import conv_tp as ttp
    from cfm_plugins.ops.triton import symmetric_contraction as tsc
    from cfm_plugins.testing import mace_conv_tp

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        sc = SymmetricContraction(
            o3.Irreps("128x0e+128x1o+128x2e+128x3o"), o3.Irreps("128x0e+128x1o"), 3, num_elements=1
        )
    finally:
        torch.set_default_dtype(previous)
    tp = FusedConvTP.from_e3nn(mace_conv_tp("0e+1o", 3, 128, torch.float64))
    return (
        tsc.SCTables.from_descriptor(FusedSymmetricContraction.from_mace(sc).descriptor),
        ttp.TPTables.from_descriptor(tp.descriptor),
        ttp.TPTables.from_descriptor(tp.descriptor.transpose()),
    )


def _sources():
    """(family, variant name, module name, source, function name, specimen per dtype, block-size
    constexpr names) of every kernel.

    Every kernel variant a MACE run launches (inference, forces, force training) on the layer of
    :func:`_workload_tables`: symmetric contraction ``fwd``, ``bwd[gx]``, ``bwd[gc,gx]``,
    ``bwd[gc]``, ``bwd2[dx,gc,gg,gx]``, ``bwd2[dc,dx,gc,gg,gx]``; conv TP ``segment``,
    ``segment[T]`` (node-feature gradient), ``edge[w,y]``, ``edge[w]``, ``edge[y]``; the radial
    conv TP ``tp_radial_*``, K = 64; the skip connection's ``skip_apply`` and ``skip_wgrad``
    (128x0e+128x1o with 89 elements); the weight-gradient reduction. ``--kernels`` selects
    families by the names the table shows."""
    from cfm_plugins.ops.triton import conv_tp as ttp
    from cfm_plugins.ops.triton import conv_tp_radial as ttr
    from cfm_plugins.ops.triton import skip_tp as tskip
    from cfm_plugins.ops.triton import symmetric_contraction as tsc

    sct, tp_plain, tp_transposed = _workload_tables()
    out = []
    for kernel, flags in tsc.kernel_variants():
        out.append(
            (
                "sc_" + kernel,
                tsc.compiled_name(kernel, flags),
                f"check_sc_{kernel}",
                tsc.source(sct, kernel, **flags),
                f"sc_{kernel}",
                {d: tsc.specimen(sct, 128, d) for d in ("float32", "float64")},
                ("BLOCK_N", "BLOCK_C"),
            )
        )
    # the conv TP, and the radial conv TP (K = 64): families tp_*, tp_radial_*
    for mod, family, tag in ((ttp, "tp_", "tp"), (ttr, "tp_radial_", "tpr")):
        for kernel, transposed, flags in mod.kernel_variants():
            tpt = tp_transposed if transposed else tp_plain
            out.append(
                (
                    family + kernel,
                    mod.compiled_name(kernel, transposed, flags),
                    f"check_{tag}_{kernel}",
                    mod.source(tpt, kernel, transposed=transposed, **flags),
                    mod.function_name(kernel, transposed, **flags),
                    {d: mod.specimen(tpt, d) for d in ("float32", "float64")},
                    ("BLOCK_E", "BLOCK_C"),
                )
            )
    for kernel in tskip.KERNELS:  # plain kernels (no descriptor in them): "plain:" + module
        _fn, names, _fixed = tskip.kernel_function(kernel)
        out.append(
            (
                kernel,
                kernel,
                "plain:skip_tp",
                "",
                kernel,
                {d: tskip.specimen(kernel, d) for d in ("float32", "float64")},
                names,
            )
        )
    fp = {"float32": "*fp32", "float64": "*fp64"}
    out.append(
        (
            "sc_reduce",
            "sc_reduce",
            "",
            "",
            "_element_sum",
            {
                d: dict(
                    part_ptr=fp[d],
                    slot_ptr="*i64",
                    chunk_ptr="*i64",
                    lo_ptr="*i64",
                    hi_ptr="*i64",
                    out_ptr=fp[d],
                    W=410 * 128,
                    C=128,
                    Cp=128,
                    SPLIT=8,
                    BLOCK_N=16,
                )
                for d in fp
            },
            (None, "BLOCK"),
        )
    )
    return out


def _constants(module: str, function: str, dtype: str, target: str) -> tuple:
    """The fixed constexprs of a plain kernel (``plain:skip_tp``) or a radial conv TP kernel
    (``check_tpr_*``) as a launch on ``target`` sets them."""
    if module.startswith("check_tpr_"):
        from cfm_plugins.ops.triton import conv_tp_radial as ttr

        return tuple(sorted(ttr.aot_constants(dtype, target).items()))
    if module != "plain:skip_tp":
        return ()
    from cfm_plugins.ops.triton import skip_tp as tskip

    return tuple(sorted(tskip.aot_constants(function, dtype, target).items()))


def jobs(targets, quick: bool, kernels=None) -> list[Job]:
    """One :class:`Job` per (kernel of :func:`_sources` in the families ``kernels``, or all; dtype;
    tile config; target): the default config and every autotuning alternative of
    ``configs_for`` (the default alone when ``quick``), with the constexprs a launch on the target
    specialises (:mod:`cfm_plugins.ops.triton.aot`)."""
    from cfm_plugins.ops.triton.configs import configs_for

    result = []
    for family, name, module, source, function, specimens, blocks in _sources():
        if kernels and family not in kernels:
            continue
        for dtype, specimen in specimens.items():
            configs = configs_for(family, dtype)
            for i, cfg in enumerate(configs[:1] if quick else configs):
                for target in targets:
                    result.append(
                        Job(
                            name,
                            module,
                            source,
                            function,
                            tuple(sorted(specimen.items())),
                            cfg,
                            i == 0,
                            dtype,
                            target,
                            blocks,
                            _constants(module, function, dtype, target),
                        )
                    )
    return result


def run_job(job: Job):
    from cfm_plugins.ops.triton import _codegen, aot

    if job.module.startswith("plain:"):  # an ordinary kernel file: its function by kernel name
        plain = importlib.import_module(f"cfm_plugins.ops.triton.{job.module[6:]}")
        fn = plain.kernel_function(job.function)[0]
    elif job.module:
        fn = getattr(_codegen.load_source(job.module, job.source), job.function)
    else:  # the weight-gradient reduction's own file
        from cfm_plugins.ops.triton import _reduce

        fn = getattr(_reduce, job.function)
    rows_name, cols_name = job.block_names
    blocks = {cols_name: job.config.block_c, **dict(job.constants)}
    if rows_name:
        blocks[rows_name] = job.config.block_rows
    return aot.compile_kernel(
        fn,
        dict(job.specimen),
        blocks,
        job.target,
        job.config.num_warps,
        job.config.num_stages,
        kernel=job.name,
        config=job.config.label() + ("" if job.default else " (alt)"),
        dtype=job.dtype,
    )


def main(argv=None) -> int:
    """Compile every :func:`jobs` and print one row per (kernel, dtype, config, target): registers
    per thread (VGPRs on AMD), spill bytes (to memory; on AMD the SGPRs spilled into VGPR lanes are
    shown apart: no memory traffic), compile seconds. Fails (exit 1) on any compile error, or on
    spills or scratch above the budget in a default config (``--spill-budget``, 0 bytes):
    alternatives may spill (autotuning on the GPU decides) and are reported."""
    from cfm_plugins.ops.triton.aot import TARGETS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    ap.add_argument(
        "--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="parallel compiles"
    )
    ap.add_argument("--quick", action="store_true", help="default configs only")
    ap.add_argument(
        "--kernels",
        nargs="+",
        default=None,
        help="only these kernel families (sc_fwd, tp_segment, skip_apply, ...; default: all)",
    )
    ap.add_argument(
        "--spill-budget", type=int, default=0, help="spill bytes allowed in a default config"
    )
    ap.add_argument(
        "--report",
        type=Path,
        default=REPORT,
        help=f"where the table goes (default {REPORT.relative_to(ROOT)})",
    )
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # the real front end
    import triton

    t0 = time.perf_counter()
    todo = jobs(args.targets, args.quick, args.kernels)
    if not todo:
        print(f"no kernel family named {args.kernels}", file=sys.stderr)
        return 2
    print(
        f"# Triton ahead-of-time compile check: {len(todo)} compiles, triton {triton.__version__}, "
        f"targets {' '.join(args.targets)}, {args.jobs} job(s)",
        flush=True,
    )
    reports = []
    with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_job, j): j for j in todo}
        for fut in cf.as_completed(futures):
            job, rep = futures[fut], fut.result()
            reports.append((job, rep))
            status = "ok" if rep.ok else f"ERROR {rep.error}"
            print(
                f"{rep.kernel:28s} {rep.dtype:8s} {rep.config:20s} {rep.target:7s} regs "
                f"{rep.registers!s:>4} spills {rep.spill_bytes!s:>6} B  sgpr->vgpr "
                f"{rep.sgpr_spills:>3}  {rep.seconds:6.1f} s  {status}",
                flush=True,
            )
    order = {j: i for i, j in enumerate(todo)}
    reports.sort(key=lambda jr: order[jr[0]])
    errors = [r for _, r in reports if not r.ok]
    over = [
        r
        for j, r in reports
        if r.ok and j.default and max(r.spill_bytes or 0, r.scratch_bytes or 0) > args.spill_budget
    ]
    table = _table(reports, args, time.perf_counter() - t0)
    print(table)
    if not (args.quick or args.no_write):
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(table)
        print(f"wrote {args.report}")
    for r in errors:
        print(f"FAILED: {r.kernel} {r.dtype} {r.config} on {r.target}: {r.error}", file=sys.stderr)
    for r in over:
        print(
            f"FAILED: {r.kernel} {r.dtype} {r.config} on {r.target} spills {r.spill_bytes} B, "
            f"scratch {r.scratch_bytes} B (budget {args.spill_budget} B in a default config)",
            file=sys.stderr,
        )
    return 1 if errors or over else 0


def _table(reports, args, seconds: float) -> str:
    targets = args.targets
    lines = [
        f"Command: `{COMMAND}` ({dt.date.today().isoformat()}, triton "
        f"{__import__('triton').__version__}, {platform.machine()}, {seconds / 60:.1f} min on a "
        f"shared {os.cpu_count()}-core machine)",
        "",
        "Registers per thread (VGPRs on AMD) / spill bytes to memory; `+sN`: N SGPRs spilled into "
        "VGPR lanes "
        "(AMD; no memory traffic); `(alt)` = an autotuning alternative, allowed to spill.",
        "",
        "| kernel | dtype | config | " + " | ".join(targets) + " |",
        "|---|---|---|" + "---|" * len(targets),
    ]
    rows: dict = {}
    for _job, rep in reports:
        key = (rep.kernel, rep.dtype, rep.config)
        cell = (
            f"{rep.registers} / {rep.spill_bytes}"
            + (f" +s{rep.sgpr_spills}" if rep.sgpr_spills else "")
            if rep.ok
            else "compile error"
        )
        rows.setdefault(key, {})[rep.target] = cell
    for (kernel, dtype, config), cells in rows.items():
        lines.append(
            f"| {kernel} | {dtype} | {config} | "
            + " | ".join(cells.get(t, "") for t in targets)
            + " |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
