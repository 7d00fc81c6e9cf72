"""Where a MACE train step spends its GPU time and memory: torch.profiler, one step per way.

    python -m tools.gpu_profile [--atoms 500 4000] [--dtypes float32 float64] [--ways stock fused]
    python -m tools.gpu_profile --by-module --atoms 4000 --ways cueq fused   # per MACE submodule
    python -m tools.gpu_profile --device cpu --quick     # a smoke run anywhere

Workload: the train step of ``benchmarks/gpu_mace.py`` (its MACE-MP-medium-like model on its
rattled CuNi cells: energy + forces, a loss on both, ``backward()``). Each way (``stock``,
``cueq``, ``fused`` with the kernel backend of ``--backend``) runs ``--warmup`` steps, then one
step under ``torch.profiler``: its wall and kernel time, launches, top kernels, top allocating
operators and peak memory (:func:`profile_step`). ``--by-module``: one table per dtype and size, a
row per MACE submodule, every way side by side, then each way's detail (:func:`by_module_report`).
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
    check_kernel_options,
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
    p.add_argument(
        "--fused-kernels",
        nargs="+",
        default=None,
        metavar="KERNEL",
        help="the kernels the fused way swaps (default: auto, every kernel the model has; a "
        "named skip_tp also runs its GPU kernel)",
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
                model = prepare(way, stock, device, args.fused_kernels)
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
    """Profile one call of ``step`` after ``warmup`` calls (``profile_memory=True``): wall,
    kernels, memory, as :func:`report` prints them:

    - the step's wall time, the summed GPU time of its kernels, how many kernels it launched and
      the busy fraction (kernel time / wall: well below 1 means the host, not the GPU, sets the
      pace);
    - the ``top`` kernels by GPU time (name, launches, ms, share of the kernel time);
    - the ``top`` operators by the memory they allocate themselves (``self_*_memory_usage``), which
      says what a higher peak is made of;
    - the peak memory of the step (``torch.cuda.max_memory_allocated``; CUDA only).

    On the CPU the "kernels" are the profiler's CPU operators (self time)."""
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


# ---------------------------------------------------------------------------- --by-module
#: the rows of the per-module table, in order (see :func:`module_group`): embedding; radial MLP
#: (the radial embedding and each layer's ``conv_tp_weights``); ``linear_up``; conv TP;
#: ``linear``; skip connection (``skip_tp``); the interaction block's own operators (the cutoff
#: product, the division by the average neighbour count, the reshape); product (the symmetric
#: contraction and its linear); readouts and scale/shift; the model's own operators; loss and
#: backward (what runs outside the model)
MODULE_ROWS = (
    "embedding",
    "radial MLP",
    "linear_up",
    "conv TP",
    "linear",
    "skip connection",
    "interaction (other)",
    "product",
    "readouts",
    "model (other)",
    "loss and backward",
)
#: the row of device kernels the profiler linked to no operator (CUDA only)
UNLINKED = "unlinked kernels"

#: the name prefix of the profiler ranges the module hooks push
MARK = "cfm.module:"

_INTERACTION_PARTS = {
    "conv_tp_weights": "radial MLP",
    "linear_up": "linear_up",
    "conv_tp": "conv TP",
    "linear": "linear",
    "skip_tp": "skip connection",
}
_TOP_PARTS = {
    "node_embedding": "embedding",
    "spherical_harmonics": "embedding",
    "atomic_energies_fn": "embedding",
    "radial_embedding": "radial MLP",
    "products": "product",
    "readouts": "readouts",
    "scale_shift": "readouts",
}

#: CPU leaf operators that launch no kernel on a GPU (allocations, views, metadata): not counted
# as launches on the CPU
_NO_KERNEL = frozenset(
    "aten::" + n
    for n in (
        "empty empty_strided as_strided view _reshape_alias resolve_conj resolve_neg detach alias "
        "result_type lift_fresh set_ _unsafe_view unsqueeze squeeze expand permute t transpose "
        "select slice narrow reshape split chunk unbind size stride is_nonzero item "
        "_local_scalar_dense"
    ).split()
) | {"detach"}
#: CPU leaf operators counted as elementwise (the GPU's ``*elementwise_kernel*`` launches)
_ELEMENTWISE = frozenset(
    "aten::" + n
    for n in (
        "add add_ sub sub_ rsub mul mul_ div div_ neg neg_ pow pow_ silu silu_ silu_backward "
        "sigmoid sigmoid_backward exp log sqrt rsqrt cos sin tanh tanh_backward clamp clamp_min "
        "where copy_ abs sign reciprocal threshold_backward masked_fill_ lerp addcmul addcdiv "
        "square maximum minimum eq ne lt gt le ge logical_and logical_not bitwise_and "
        "_to_copy floor ceil round fmod remainder"
    ).split()
)
_FILLS = frozenset({"aten::fill_", "aten::zero_"})


def module_group(path: str) -> str:
    """The row of :data:`MODULE_ROWS` of a MACE submodule, by its path in the model (``""`` the
    model itself): ``interactions.1.conv_tp`` -> "conv TP", ``products.0.linear`` -> "product"."""
    parts = path.split(".")
    if parts[0] == "interactions":
        part = parts[2] if len(parts) > 2 else None
        return _INTERACTION_PARTS.get(part, "interaction (other)")
    return _TOP_PARTS.get(parts[0], "model (other)")


def _hooked_paths(model) -> list[tuple[str, object]]:
    """The modules whose forwards get a profiler range: the model, its children and theirs (the
    readouts of a ModuleList, each interaction and product block), and the children of the blocks
    (deeper modules take their parent's row)."""
    out = []
    for path, module in model.named_modules():
        parts = path.split(".") if path else []
        block = len(parts) >= 1 and parts[0] in ("interactions", "products")
        if len(parts) <= 2 or (block and len(parts) <= 3):
            out.append((path, module))
    return out


class ModuleRanges:
    """Forward pre/post hooks pushing a ``torch.profiler`` range ``cfm.module:<path>`` around the
    forward of each module of :func:`_hooked_paths` (a context manager: the hooks go on exit)."""

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.stack = []

    def __enter__(self):
        import torch

        def pre(path):
            def hook(module, args):
                rf = torch.autograd.profiler.record_function(MARK + path)
                rf.__enter__()
                self.stack.append(rf)

            return hook

        def post(module, args, output):
            if self.stack:
                self.stack.pop().__exit__(None, None, None)

        for path, module in _hooked_paths(self.model):
            try:
                self.handles.append(module.register_forward_pre_hook(pre(path)))
                self.handles.append(module.register_forward_hook(post, always_call=True))
            except (RuntimeError, AttributeError):
                continue  # a ScriptModule takes no hooks: its parent's row
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles.clear()
        while self.stack:
            self.stack.pop().__exit__(None, None, None)


def _is_backward_function(e) -> bool:
    return e.name.startswith("autograd::engine::evaluate_function: ") or e.scope == 1


def _created_near(numbered, seq: int):
    """The owner of an autograd node no recorded operator created (TorchScript's differentiable
    graphs make theirs inside the interpreter): the owner of the first numbered operator that
    started after it was made (numbers grow in time on a thread, so that operator started between
    the node's creation and the next node's), else of the last one before it; None if none."""
    import bisect

    if not numbered:
        return None
    seqs, owners = numbered
    i = bisect.bisect_right(seqs, seq)
    if i < len(seqs):
        return owners[i]
    return owners[i - 1] if i else None


def attribute_events(events, cuda: bool) -> dict:
    """Per row of :data:`MODULE_ROWS`: time (microseconds; on CUDA the kernels' GPU time, on
    the CPU the operators' self CPU time), launches (CUDA kernels, memsets and copies; on the CPU
    leaf operators that compute), elementwise launches, fills, and per phase (0 forward, 1 backward
    of forward nodes, 2 backward of nodes the first backward made) the time, and the top
    operators; plus ``unmapped``: backward functions whose forward the profiler did not record.

    ``events`` is ``prof.events()`` (CPU events with their parents linked). An operator belongs to
    the innermost module range around it; an operator run by the autograd engine belongs to the
    module whose forward created the node it runs (the node's sequence number and forward thread
    name the operator that created it, ``FunctionEvent.sequence_nr`` / ``fwd_thread``), so a
    backward kernel lands in the module whose forward asked for it, and a double-backward kernel
    in the module whose backward created its node. Operators outside the model (the loss, the
    engine's gradient accumulation into parameters) form "loss and backward"."""
    import collections

    from torch.autograd import DeviceType

    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    cpu.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
    owner: dict[int, tuple[str, int]] = {}
    creator: dict[tuple[int, int], tuple[str, int]] = {}
    numbered: dict[int, tuple[list[int], list[tuple[str, int]]]] = {}  # thread -> (seqs, owners)
    outside = ("loss and backward", 0)
    rows = {
        name: {
            "us": 0.0,
            "launches": 0,
            "elementwise": 0,
            "fills": 0,
            "phase_us": [0.0, 0.0, 0.0],
            "ops": collections.Counter(),
            "op_us": collections.Counter(),
        }
        for name in MODULE_ROWS + (UNLINKED,)
    }
    unmapped = 0
    for e in cpu:
        parent = owner.get(id(e.cpu_parent)) if e.cpu_parent is not None else None
        if e.name.startswith(MARK):
            own = (module_group(e.name[len(MARK) :]), parent[1] if parent else 0)
        elif _is_backward_function(e):
            made = None
            if e.sequence_nr >= 0:
                made = creator.get((e.sequence_nr, e.fwd_thread)) or _created_near(
                    numbered.get(e.fwd_thread), e.sequence_nr
                )
            if made is not None:
                own = (made[0], min(made[1] + 1, 2))
            else:
                own = parent or outside
                unmapped += e.sequence_nr >= 0 and parent is None
        else:
            own = parent or outside
            if e.sequence_nr >= 0:  # the last operator to start with a number created its node
                creator[(e.sequence_nr, e.thread)] = own
                seqs, owners = numbered.setdefault(e.thread, ([], []))
                seqs.append(e.sequence_nr)
                owners.append(own)
        owner[id(e)] = own
        row = rows[own[0]]
        if cuda:
            kernels = [k for k in e.kernels if not k.name.startswith(MARK)]
            us = sum(k.duration for k in kernels)
            row["launches"] += len(kernels)
            for k in kernels:
                name = k.name
                fill = "Memset" in name or "FillFunctor" in name
                row["fills"] += fill
                row["elementwise"] += (not fill) and "elementwise" in name
                row["ops"][_short(name, 60)] += 1
                row["op_us"][_short(name, 60)] += k.duration
        else:
            us = e.self_cpu_time_total
            leaf = not e.cpu_children and not e.name.startswith(MARK)
            if leaf and not _is_backward_function(e) and e.name not in _NO_KERNEL:
                row["launches"] += 1
                row["fills"] += e.name in _FILLS
                row["elementwise"] += e.name in _ELEMENTWISE
            if not e.name.startswith(MARK):
                row["ops"][e.name] += 1
                row["op_us"][e.name] += us
        row["us"] += us
        row["phase_us"][own[1]] += us
    if cuda:  # kernels the profiler linked to no operator (their launch outside any op)
        total = sum(
            e.time_range.end - e.time_range.start
            for e in events
            if e.device_type != DeviceType.CPU
            and not e.name.startswith(MARK)
            and not getattr(e, "is_user_annotation", False)
        )
        linked = sum(r["us"] for r in rows.values())
        rows[UNLINKED]["us"] = max(0.0, total - linked)
    return {"rows": rows, "unmapped": unmapped}


def profile_by_module(step, model, device, warmup: int) -> dict:
    """:func:`attribute_events` of one call of ``step`` (after ``warmup`` calls) under
    ``torch.profiler``, with the module ranges of ``model``; and the step's wall time (ms)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with ModuleRanges(model), profile(activities=activities) as prof:
        t = time.perf_counter()
        step()
        sync()
        wall = time.perf_counter() - t
    out = attribute_events(prof.events(), cuda)
    out["wall_ms"] = wall * 1e3
    return out


def module_table(results: dict, cuda: bool) -> list[str]:
    """One table: a row per module of :data:`MODULE_ROWS`, per way its time (ms), share of the
    way's total and launches; ``results``: way label -> :func:`profile_by_module`'s dict, or why
    the way did not run (a string)."""
    ran = {w: r for w, r in results.items() if not isinstance(r, str)}
    head = "| module |" + "".join(f" {w} ms | {w} % | {w} launches |" for w in ran)
    lines = [head, "|---|" + "---:|---:|---:|" * len(ran)]
    names = MODULE_ROWS + ((UNLINKED,) if cuda else ())
    totals = {w: sum(row["us"] for row in r["rows"].values()) for w, r in ran.items()}
    for name in names:
        cells = ""
        for w, r in ran.items():
            row = r["rows"][name]
            share = row["us"] / max(totals[w], 1e-9)
            cells += f" {row['us'] / 1e3:.1f} | {share:.1%} | {row['launches']} |"
        lines.append(f"| {name} |{cells}")
    cells = ""
    for w, r in ran.items():
        launches = sum(row["launches"] for row in r["rows"].values())
        cells += f" {totals[w] / 1e3:.1f} | 100% | {launches} |"
    lines.append(f"| **total** |{cells}")
    lines.append("| step wall ms |" + "".join(f" {r['wall_ms']:.1f} | | |" for r in ran.values()))
    lines.append("")
    lines += [f"{w}: not run: {r}" for w, r in results.items() if isinstance(r, str)]
    return lines


def module_details(way: str, r: dict, top: int) -> list[str]:
    """Per module of one way: its time by phase, its elementwise launches and fills, and its
    ``top`` operators (kernels on CUDA) by time."""
    lines = [
        f"#### {way}: by phase, elementwise work and top operators",
        "",
        "| module | forward ms | backward ms | double backward ms | launches | elementwise | fills "
        "| top operators (calls, ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in r["rows"].items():
        if not row["us"] and not row["launches"]:
            continue
        f, b, bb = (x / 1e3 for x in row["phase_us"])
        tops = ", ".join(
            f"`{op}` {row['ops'][op]}x {us / 1e3:.1f}" for op, us in row["op_us"].most_common(top)
        )
        lines.append(
            f"| {name} | {f:.1f} | {b:.1f} | {bb:.1f} | {row['launches']} | {row['elementwise']} "
            f"| {row['fills']} | {tops} |"
        )
    if r["unmapped"]:
        lines.append(
            f"\n{r['unmapped']} backward functions had no recorded forward (in 'loss and backward')"
        )
    return lines + [""]


def by_module_report(args, argv) -> int:
    """``--by-module``: per dtype and size, the one table of :func:`module_table` over the ways of
    ``args`` and each way's :func:`module_details`, printed as they come (and to ``--out``).

    The table has a row per MACE submodule (:data:`MODULE_ROWS`) and, per way side by side, the
    step's kernel time in that module (on the CPU: the self CPU time of its operators), its share
    and its launches (on the CPU: operator calls that compute). Forward hooks push a
    ``torch.profiler`` range around each submodule's forward (:class:`ModuleRanges`); an operator
    run by the autograd engine belongs to the module whose forward created the node it runs
    (:func:`attribute_events`), so backward and double backward land where their forward ran. Then
    per way: each module's forward, backward and double backward time, its elementwise launches and
    fills, and its top operators (kernels on CUDA). ``--kernels-also`` adds fused ways that swap
    other kernel lists to the same table."""
    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops import _backend

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        _backend.set_gpu_backend(args.backend)
    unit = (
        "GPU time of the kernels each module's operators launched (forward and backward), and "
        "the launches (kernels, memsets, copies)"
        if cuda
        else "self CPU time of the operators each module ran (forward and backward), and the "
        "launches (operator calls that compute: leaf operators, views and allocations left out)"
    )
    lines = [
        f"## Train step by module, {device_name(device)}",
        "",
        f"`python -m tools.gpu_profile {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"One train step (energy, forces, a loss on both, backward) after {args.warmup} warm-ups; "
        f"per module: {unit}. A backward operator counts in the module whose forward created its "
        "autograd node; 'loss and backward' is what runs outside the model (the loss, the "
        "gradient accumulation into the parameters).",
        "",
    ]
    print("\n".join(lines), flush=True)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        stock = build_model(dtype, args.hidden).to(device)
        for n_atoms in args.atoms:
            atoms, batch, e_ref, f_ref = workload(n_atoms, dtype, device)
            results: dict = {}
            runs = [(way, args.fused_kernels) for way in args.ways]
            runs += [("fused", v.split(",")) for v in args.kernels_also]
            for k, (way, kernels) in enumerate(runs):
                label = f"{way}[{args.backend}]" if way == "fused" and cuda else way
                if k >= len(args.ways):
                    label += "+" + "+".join(kernels)  # a row of --kernels-also
                model = prepare(way, stock, device, kernels)
                if isinstance(model, str):
                    results[label] = model
                    continue
                try:
                    results[label] = profile_by_module(
                        lambda m=model: train_step(m, batch, e_ref, f_ref),
                        model,
                        device,
                        args.warmup,
                    )
                except RuntimeError as exc:
                    if not out_of_memory(exc):
                        raise
                    results[label] = "out of memory"
                del model
                if cuda:
                    torch.cuda.empty_cache()
            out = [
                f"### {dtype_name}, {len(atoms)} atoms, {batch['edge_index'].shape[1]} edges",
                "",
                *module_table(results, cuda),
                "",
            ]
            for way, r in results.items():
                if not isinstance(r, str):
                    out += module_details(way, r, args.top)
            print("\n".join(out), flush=True)
            lines += out
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_way_arguments(p, "cuda", [500, 4000], ["float32", "float64"], ["stock", "cueq", "fused"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--kernels-also",
        nargs="+",
        default=[],
        metavar="K1,K2",
        help="with --by-module: one more fused way per value, swapping the kernels of that comma "
        "list (e.g. symmetric_contraction,conv_tp,skip_tp: the skip connection's GPU kernel, which "
        "runs only when named), in the same table",
    )
    p.add_argument(
        "--by-module",
        action="store_true",
        help="one table of the step's time and launches per MACE submodule (embedding, radial "
        "MLP, linear_up, conv TP, linear, skip connection, product, readouts, loss and backward), "
        "every way side by side, then each way's phases, elementwise launches, fills and top "
        "operators per module",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.atoms, args.warmup = "8x0e+8x1o", [32], 1
    try:  # before any model is built: a misspelt kernel would stop the run after other ways ran
        check_kernel_options(args.fused_kernels, args.kernels_also)
    except ValueError as exc:
        p.error(str(exc))
    if args.kernels_also and not args.by_module:
        p.error("--kernels-also adds ways to the --by-module table; add --by-module")
    if args.by_module:
        return by_module_report(args, argv)

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
