"""What is alive at the memory peak of a MACE train step, by the operator that made it, per way.

    python -m tools.memory_peak --device cpu --atoms 500 --ways stock fused   # any machine
    python -m tools.memory_peak --device cuda --atoms 4000 --ways stock cueq fused
    python -m tools.memory_peak --device cpu --quick                          # a smoke run

Workload: the train step of ``benchmarks/gpu_mace.py`` (its MACE-MP-medium-like model on its
rattled CuNi cells: energy + forces, a loss on both, ``backward()``). Each way runs one warm-up
step, then one step under ``torch.profiler`` whose tensor timeline is replayed to find the step's
peak (:func:`measure`, :func:`peak_of`). Per way it prints the peak, in MiB and in ``[edges,
1280]`` buffers, what is alive then by the operator that made it and torch's category, and when
in the step the peak falls (:func:`report`). The composition is the same on any device for the
same operators, so a CPU run says what a GPU peak is made of; ``--out`` writes the markdown to a
file too.
"""

from __future__ import annotations

import argparse
import collections

from benchmarks.gpu_mace import train_step
from tools.gpu_profile import add_way_arguments, way_report


def _creators(mp) -> dict:
    """(tensor key, version) -> the name of the operator that produced it."""
    made = {}
    for node in mp._data_flow_graph.flow_nodes:
        for key, version in node.outputs.items():
            made[(key, version)] = node._event.name
    return made


def peak_of(prof, device) -> dict:
    """Replay the profiled step's tensor timeline on ``device``: the peak, what is alive then, and
    the operator that made the last tensor before it."""
    from torch.profiler._memory_profiler import Action, MemoryProfile

    mp = MemoryProfile(prof.profiler.kineto_results)
    made = _creators(mp)
    live: dict = {}
    before = set()  # tensors alive when the step began (inputs, parameters)
    cur = peak = 0
    at_peak: dict = {}
    last_before_peak = "-"
    for _, action, (key, version), size in mp.timeline:
        if key.device.type != device.type:
            continue
        if action in (Action.PREEXISTING, Action.CREATE):
            if action == Action.PREEXISTING:
                before.add(key)
            live[(key, version)] = size
            cur += size
        elif action == Action.INCREMENT_VERSION:
            cur += size - live.pop((key, version), 0)
            live[(key, version + 1)] = size
        elif action == Action.DESTROY:
            cur -= live.pop((key, version), 0)
        if cur > peak:
            peak, at_peak = cur, dict(live)
            last_before_peak = made.get((key, version), made.get((key, 0), "-"))
    groups: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for (key, version), size in at_peak.items():
        category = mp._categories.get(key, version)
        unnamed = "(before the step)" if key in before else "(inside an operator)"
        g = (
            made.get((key, version), made.get((key, 0), unnamed)),
            category.name.lower() if category else "unknown",
        )
        groups[g] += size
        counts[g] += 1
    return {"peak": peak, "groups": groups, "counts": counts, "when": last_before_peak}


def measure(model, batch, e_ref, f_ref, device) -> dict:
    """:func:`peak_of` one train step after one warm-up step, profiled with ``profile_memory``,
    ``record_shapes`` and ``with_stack``.

    The tensor timeline is ``torch.profiler._memory_profiler.MemoryProfile``'s: every tensor's
    creation and release, with the operator that made it (a private torch API, read for torch 2.11
    and 2.13)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    train_step(model, batch, e_ref, f_ref)  # warm-up: kernels built, caches filled
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(
        activities=activities, profile_memory=True, record_shapes=True, with_stack=True
    ) as prof:
        train_step(model, batch, e_ref, f_ref)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return peak_of(prof, device)


def report(label: str, r: dict, unit: int, top: int) -> list[str]:
    """The markdown of one way's :func:`peak_of`:

    - the peak of the tensors alive during the step on the device (inputs and parameters included;
      the allocator's caching and fragmentation come on top on a GPU:
      ``torch.cuda.max_memory_allocated`` in ``tools/gpu_profile.py``);
    - the peak as a multiple of ``unit``, the bytes of one ``[edges, 1280]`` buffer (the per-edge
      weights of a 128-channel layer-1 convolution), the unit in which the force-training peak
      grows with the edges;
    - what is alive at the peak, by the operator that made it and torch's category (activation,
      autograd detail, gradient, ...), the ``top`` largest groups;
    - when in the step the peak falls (the operator that allocated last before it)."""
    mib = 2**20
    lines = [
        f"### {label}",
        "",
        f"peak {r['peak'] / mib:.1f} MiB = {r['peak'] / unit:.2f} x [edges, 1280]; "
        f"the last tensor before it made by `{_short(r['when'])}`",
        "",
        "| made by | category | tensors | MiB |",
        "|---|---|---|---|",
    ]
    for (op, category), size in r["groups"].most_common(top):
        lines.append(
            f"| `{_short(op)}` | {category} | {r['counts'][(op, category)]} | {size / mib:.1f} |"
        )
    return lines + [""]


def _short(name: str, width: int = 60) -> str:
    name = name.replace("torch::autograd::CppNode<", "").replace("(anonymous namespace)::", "")
    return name if len(name) <= width else name[: width - 3] + "..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_way_arguments(p, "cpu", [500], ["float32"], ["stock", "fused"])
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.atoms = "8x0e+8x1o", [32]

    return way_report(
        args,
        argv,
        "tools.memory_peak",
        "What is alive at the train step's memory peak",
        lambda label, model, batch, e_ref, f_ref, dtype, device: report(
            label,
            measure(model, batch, e_ref, f_ref, device),
            batch["edge_index"].shape[1] * 1280 * dtype.itemsize,
            args.top,
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
