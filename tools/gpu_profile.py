"""Where a MACE train step spends its GPU time and memory: torch.profiler, one step per way.

    python -m tools.gpu_profile [--atoms 500 4000] [--dtypes float32 float64] [--ways stock fused]
    python -m tools.gpu_profile --device cpu --quick     # a smoke run anywhere

Workload: the train step of ``benchmarks/gpu_mace.py`` (its MACE-MP-medium-like model on its
rattled CuNi cells: energy + forces, a loss on both, ``backward()``). Each way (``stock``,
``cueq``, ``fused`` with the kernel backend of ``--backend``) runs ``--warmup`` steps, then one
step under ``torch.profiler`` with ``profile_memory=True``. Per way it prints:

- the step's wall time, the summed device time of its kernels, how many kernels it launched and
  the busy fraction (kernel time / wall: well below 1 means the host, not the GPU, sets the pace);
- the ``--top`` kernels by device time (name, launches, ms, share of the kernel time);
- the ``--top`` operators by the memory they allocate themselves (``self_*_memory_usage``), which
  says what a higher peak is made of;
- the peak memory of the step (``torch.cuda.max_memory_allocated``).

On the CPU the "kernels" are the profiler's CPU operators (self time); the tables are a smoke test.
``--out FILE`` writes the markdown to a file too. ``tools/memory_peak.py`` shares the options.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.gpu_kernels import kernel_events
from benchmarks.gpu_mace import (
    build_model,
    device_name,
    out_of_memory,
    prepare,
    train_step,
    workload,
)


def _short(name: str, width: int = 70) -> str:
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 3] + "..."


def add_way_arguments(p, device: str, atoms: list[int], dtypes: list[str], ways: list[str]) -> None:
    """The options :func:`way_sections` reads (``--device --atoms --dtypes --ways --backend --hidden
    --top --quick --out``), with the tool's defaults (gpu_profile, memory_peak)."""
    p.add_argument("--device", default=device)
    p.add_argument("--atoms", type=int, nargs="+", default=atoms)
    p.add_argument("--dtypes", nargs="+", default=dtypes, choices=["float32", "float64"])
    p.add_argument("--ways", nargs="+", default=ways, choices=("stock", "cueq", "fused"))
    p.add_argument(
        "--backend",
        default="triton",
        choices=["cuda", "triton"],
        help="kernel backend of the fused way on CUDA",
    )
    p.add_argument("--hidden", default="128x0e+128x1o")
    p.add_argument("--top", type=int, default=12)
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke run (hidden 8x0e+8x1o, 32 atoms)",
    )
    p.add_argument("--out", default=None, metavar="FILE", help="write the markdown here too")


def way_report(args, argv, module: str, title: str, section) -> int:
    """The main of gpu_profile and memory_peak (``module``: ``tools.<name>``): on ``args.device``
    (the fused way's GPU backend ``args.backend``), a heading naming the device and the command,
    then :func:`way_sections`, printed as it comes and written to ``args.out`` if given."""
    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops import _backend

    device = torch.device(args.device)
    if device.type == "cuda":
        _backend.set_gpu_backend(args.backend)
    lines = [
        f"## {title}, {device_name(device)}",
        "",
        f"`python -m {module} {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
    ]
    print("\n".join(lines), flush=True)
    lines += way_sections(args, device, section)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def way_sections(args, device, section) -> list[str]:
    """The markdown of ``section(label, model, batch, e_ref, f_ref, dtype, device) -> lines`` for
    every dtype, size and way of ``args`` (``dtypes``, ``atoms``, ``ways``, ``hidden``,
    ``backend``),
    printed as each comes; a way that cannot run here, or runs out of GPU memory, says so
    instead."""
    import torch

    lines: list[str] = []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        stock = build_model(dtype, args.hidden).to(device)
        for n_atoms in args.atoms:
            atoms, batch, e_ref, f_ref = workload(n_atoms, dtype, device)
            for way in args.ways:
                label = (
                    f"{dtype_name}, {len(atoms)} atoms, {batch['edge_index'].shape[1]} edges: "
                    + (
                        f"{way}[{args.backend}]"
                        if way == "fused" and device.type == "cuda"
                        else way
                    )
                )
                model = prepare(way, stock, device)
                if isinstance(model, str):
                    out = [f"### {label}", "", f"not run: {model}", ""]
                else:
                    try:
                        out = section(label, model, batch, e_ref, f_ref, dtype, device)
                    except RuntimeError as exc:
                        if not out_of_memory(exc):
                            raise
                        out = [f"### {label}", "", "out of memory", ""]
                    del model
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                lines += out
                print("\n".join(out), flush=True)
    return lines


def profile_step(step, device, warmup: int, top: int) -> dict:
    """Profile one call of ``step`` after ``warmup`` calls: wall, kernels, memory (see module
    doc)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, profile_memory=True) as prof:
        t = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - t
    events = prof.key_averages()
    kernels, time_of = kernel_events(events, cuda)
    mem_of = (
        (lambda e: e.self_device_memory_usage) if cuda else (lambda e: e.self_cpu_memory_usage)
    )  # bytes
    kernel_us = sum(time_of(e) for e in kernels)
    launches = sum(e.count for e in kernels)
    by_time = sorted(kernels, key=time_of, reverse=True)[:top]
    by_mem = sorted((e for e in events if mem_of(e) > 0), key=mem_of, reverse=True)[:top]
    return {
        "wall_ms": wall * 1e3,
        "kernel_ms": kernel_us / 1e3,
        "launches": launches,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "kernels": [
            (_short(e.key), e.count, time_of(e) / 1e3, time_of(e) / max(kernel_us, 1e-9))
            for e in by_time
        ],
        "memory": [(_short(e.key), e.count, mem_of(e) / 2**20) for e in by_mem],
    }


def report(label: str, r: dict) -> list[str]:
    peak = f"{r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "-"
    lines = [
        f"### {label}",
        "",
        f"wall {r['wall_ms']:.1f} ms, kernels {r['kernel_ms']:.1f} ms in {r['launches']} launches "
        f"(busy {r['kernel_ms'] / max(r['wall_ms'], 1e-9):.0%}), peak {peak}",
        "",
        "| kernel | launches | ms | share |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| `{n}` | {c} | {ms:.2f} | {s:.0%} |" for n, c, ms, s in r["kernels"]]
    lines += ["", "| operator (allocates itself) | calls | MiB |", "|---|---:|---:|"]
    lines += [f"| `{n}` | {c} | {mib:.0f} |" for n, c, mib in r["memory"]]
    return lines + [""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_way_arguments(p, "cuda", [500, 4000], ["float32", "float64"], ["stock", "cueq", "fused"])
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.atoms, args.warmup = "8x0e+8x1o", [32], 1

    return way_report(
        args,
        argv,
        "tools.gpu_profile",
        "Train-step profile",
        lambda label, model, batch, e_ref, f_ref, dtype, device: report(
            label,
            profile_step(
                lambda: train_step(model, batch, e_ref, f_ref), device, args.warmup, args.top
            ),
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
