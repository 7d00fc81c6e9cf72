"""Where a MACE train step spends its GPU time and memory: torch.profiler, one step per way.

    python benchmarks/gpu_profile.py [--atoms 500 4000] [--dtypes float32 float64] [--ways stock
    cueq fused] python benchmarks/gpu_profile.py --device cpu --quick     # a smoke run anywhere

Workload: the train step of benchmarks/gpu_mace.py (its MACE-MP-medium-like model on its rattled
CuNi
cells: energy + forces, a loss on both, ``backward()``). Each way (``stock``, ``cueq``, ``fused``
with the kernel backend of ``--backend``) runs ``--warmup`` steps, then one step under
``torch.profiler`` with ``profile_memory=True``. Per way it prints:

- the step's wall time, the summed device time of its kernels, how many kernels it launched and
  the busy fraction (kernel time / wall: well below 1 means the host, not the GPU, sets the pace);
- the ``--top`` kernels by device time (name, launches, ms, share of the kernel time);
- the ``--top`` operators by the memory they allocate themselves (``self_*_memory_usage``), which
  says what a higher peak is made of;
- the peak memory of the step (``torch.cuda.max_memory_allocated``).

On the CPU the "kernels" are the profiler's CPU operators (self time); the tables are a smoke test.
``--out`` writes the markdown to a file too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_mace import add_way_arguments, train_step, way_report  # noqa: E402


def _short(name: str, width: int = 70) -> str:
    name = " ".join(name.split())
    return name if len(name) <= width else name[: width - 3] + "..."


def kernel_events(events, cuda: bool):
    """(the kernels among the profiler's averaged ``events``, their self time in microseconds as a
    function): the device kernels on CUDA, the CPU operators with self time on the CPU."""
    import torch

    if cuda:
        return (
            [
                e
                for e in events
                if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
            ],
            lambda e: e.self_device_time_total,
        )
    return [e for e in events if e.self_cpu_time_total > 0], lambda e: e.self_cpu_time_total


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
        "gpu_profile.py",
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
