"""The two fused kernels on their own, on the GPU: stock e3nn vs cuEquivariance vs cfm-plugins.

    python -m benchmarks.gpu_kernels [--nodes 500 4000 32000] [--dtypes float32 float64] [--profile]
    python -m benchmarks.gpu_kernels --layers 0 1 --modes bwd train   # both layers, the chain
    python -m benchmarks.gpu_kernels --device cpu --quick             # a smoke run anywhere

Workload: modules of the model of :func:`benchmarks.gpu_mace.build_model`, taken out of the model
each way of :data:`WAYS` builds: ``sc``, a layer's product block (:func:`sc_case`), and ``tp``, a
layer's conv TP with its gather and scatter on a rattled CuNi cell's edges (:func:`tp_case`), in
the modes of :data:`MODES`. Median of ``--reps`` synchronised calls after ``--warmup``; peak memory
above the inputs. The last columns are ours against stock and against cuEquivariance in the same
run. ``--profile`` prints the top kernels of each ``bwd2`` case (:func:`top_kernels`); ``--tiles``
times every tile config of the Triton kernels (:func:`tile_sweep`). Writes the record
``gpu_kernels`` (``--quick``: ``gpu_kernels_quick``) to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse

from benchmarks.gpu_mace import build_model, cuni_atoms, device_name, out_of_memory, prepare, timed
from benchmarks.record import add_out_argument, command_line, markdown_table, write_record

#: ``stock``: mace's e3nn modules; ``cueq``: ``convert_e3nn_cueq``, conv fusion on CUDA;
#: ``fused``: ``patch_model``, kernel backend ``--backend``
WAYS = ("stock", "cueq", "fused")
#: ``fwd``: no grad; ``bwd``: forward and the gradients of a loss on the output w.r.t. the inputs,
#: as forces need; ``bwd2``: force training, the input gradient with ``create_graph``, then a loss
#: on it differentiated w.r.t. the parameters (sc) or the node features and weights (tp; the forces
#: through the edge attributes only); ``train``: tp as MACE's step runs force training, the forces
#: through the edge attributes and the per-edge weights, which both depend on the positions (sc:
#: as ``bwd2``); see :func:`run_mode`
MODES = ("fwd", "bwd", "bwd2", "train")
DEFAULT_MODES = ("fwd", "bwd", "bwd2")


def cuni_graph(n_atoms: int, r_max: float, seed: int = 0):
    """(number of atoms, edge_index [2, E] sender->receiver, edge vectors [E, 3]) of the rattled
    CuNi cell of ``gpu_mace.cuni_atoms`` (numpy)."""
    import numpy as np
    from ase.neighborlist import neighbor_list

    atoms = cuni_atoms(n_atoms, seed)
    i, j, d = neighbor_list("ijD", atoms, r_max)
    return len(atoms), np.stack([j, i]).astype(np.int64), d


def sc_case(model, n_nodes: int, dtype, device, layer: int):
    """(call, parameters, inputs needing grad) for the product block of ``layer``: layer 0's is
    the symmetric contraction 128x(0e+1o+2e+3o) -> 128x0e+128x1o (correlation 3, 89 elements) and
    its linear, layer 1's gives 128x0e; node features ``[n_nodes, 128, 16]``, random elements."""
    import torch

    block = model.products[layer]
    torch.manual_seed(1)
    x = torch.randn(n_nodes, 128, 16, dtype=dtype, device=device)
    species = torch.randint(0, 89, (n_nodes,), device=device)
    attrs = torch.nn.functional.one_hot(species, 89).to(dtype)
    params = [p for p in block.parameters() if p.requires_grad]
    return (lambda x: block(x, None, attrs)), params, [x]


def tp_case(model, graph, dtype, device, layer: int):
    """(call, parameters, inputs) for the conv TP of ``layer`` with its gather and scatter, the
    call form of the model's own interaction block, on ``graph`` (:func:`cuni_graph`: at r_max
    6 A about 80 edges per atom). Layer 1: 128x0e+128x1o x Y(l<=3) ->
    128x(0e+0e+1o+1o+1o+2e+2e+2e+3o+3o), 1280 per-edge weights; layer 0: 128x0e in,
    128x(0e+1o+2e+3o) out, 512 weights."""
    import torch
    from e3nn import o3
    from mace.tools.scatter import scatter_sum

    block = model.interactions[layer]
    n, ei_np, vec = graph
    ei = torch.from_numpy(ei_np).to(device)
    torch.manual_seed(2)
    dim_in = 128 * 4 if layer > 0 else 128
    x = torch.randn(n, dim_in, dtype=dtype, device=device)
    y = o3.spherical_harmonics(
        o3.Irreps.spherical_harmonics(3),
        torch.from_numpy(vec).to(dtype=dtype, device=device),
        True,
        normalization="component",
    )
    w = torch.randn(ei.shape[1], block.conv_tp.weight_numel, dtype=dtype, device=device)
    if hasattr(block, "conv_fusion"):

        def call(x, y, w):
            return block.conv_tp(x, y, w, ei)
    else:

        def call(x, y, w):
            return scatter_sum(block.conv_tp(x[ei[0]], y, w), ei[1], dim=0, dim_size=n)

    return call, [], [x, y, w]


#: the layer each kernel is timed in without ``--layers``
DEFAULT_LAYER = {"sc": 0, "tp": 1}


def case(kernel: str, model, n: int, graphs: dict, dtype, device, layer: int | None = None):
    """(call, parameters, inputs) of ``kernel`` ("sc": a layer's product block on ``n`` nodes; "tp":
    a layer's conv TP on the graph of ``n`` atoms); ``layer`` None: :data:`DEFAULT_LAYER`."""
    layer = DEFAULT_LAYER[kernel] if layer is None else layer
    if kernel == "sc":
        return sc_case(model, n, dtype, device, layer)
    return tp_case(model, graphs[n], dtype, device, layer)


def run_mode(kernel: str, call, params, inputs, mode: str):
    import torch

    if mode == "fwd":
        with torch.no_grad():
            return call(*inputs)
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = call(*leaves)
    loss = out.pow(2).sum()
    if mode == "bwd":
        return torch.autograd.grad(loss, leaves)
    if kernel == "sc":  # forces: d/dx with a graph, then the parameters' gradient of a loss on it
        (gx,) = torch.autograd.grad(loss, leaves[0], create_graph=True)
        return torch.autograd.grad(gx.pow(2).sum(), params)
    x, y, w = leaves
    if (
        mode == "train"
    ):  # forces through the edge attributes and the radial weights, as in MACE's step
        gy, gw = torch.autograd.grad(loss, (y, w), create_graph=True)
        return torch.autograd.grad(gy.pow(2).sum() + gw.pow(2).sum(), (x, w))
    (gy,) = torch.autograd.grad(
        loss, y, create_graph=True
    )  # bwd2: through the edge attributes only
    return torch.autograd.grad(gy.pow(2).sum(), (x, w))


def measure(fn, device, reps: int, warmup: int) -> tuple[float, float | None]:
    """(median seconds, peak GiB above what was allocated before) of ``fn``."""
    import torch

    cuda = device.type == "cuda"
    base = torch.cuda.memory_allocated() if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds = timed(fn, reps, warmup, device)
    return seconds, (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else None


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


def top_kernels(fn, device, top: int) -> list[str]:
    """The ``top`` kernels of one call of ``fn`` by self time (torch.profiler), one line each:
    milliseconds, share of the kernels' total, calls, name (``--profile``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    ) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    ev, t = kernel_events(prof.key_averages(), cuda)
    total = sum(t(e) for e in ev) or 1e-9
    rows = sorted(ev, key=t, reverse=True)[:top]
    return [
        f"    {t(e) / 1e3:8.2f} ms {t(e) / total:4.0%} x{e.count:<4d} "
        f"{' '.join(e.key.split())[:90]}"
        for e in rows
    ]


#: the Triton kernels (``cfm_plugins/ops/triton/configs.py`` names) each family launches
TILE_KERNELS = {"sc": ("sc_fwd", "sc_bwd", "sc_bwd2"), "tp": ("tp_segment", "tp_edge")}


def tile_sweep(args, fused: dict, graphs: dict, device) -> list[str]:
    """The fused models (dtype name -> model) with each Triton kernel's tile configs (its default,
    then the autotuning alternatives of configs.py), one kernel at a time, the others at their
    defaults: per mode, ms and the ratio to the default. On a CPU the C++ kernels run and tiles
    change nothing (a smoke run)."""
    lines = [
        "",
        "Tile configs of the Triton kernels (`--tiles`; fused way only, one kernel's tile changed "
        "at a time; ms, and vs the default in the same run)"
        + ("" if device.type == "cuda" else ": on a CPU the C++ kernels run, tiles change nothing")
        + ":",
        "",
        "| family | Triton kernel | dtype | nodes | tile | "
        + " | ".join(f"{m} ms" for m in args.modes)
        + " |",
        "|---|---|---|---:|---|" + "---:|" * len(args.modes),
    ]
    print("\n".join(lines), flush=True)
    # (kernel, dtype name) -> [label -> seconds over the modes] per layer, largest nodes
    per_layer = {}
    for dtype_name, model in fused.items():
        for family in args.kernels:
            for layer in layers_of(args, family):
                for n in args.nodes:
                    for name in TILE_KERNELS[family]:
                        if args.tile_kernels and name not in args.tile_kernels:
                            continue
                        rows, totals = tile_rows(
                            args, family, name, model, dtype_name, n, graphs, device, layer
                        )
                        lines += rows
                        if n == max(args.nodes):
                            per_layer.setdefault((name, dtype_name), []).append(totals)
    # (kernel, dtype name) -> label of the tile with the least time over the modes and layers
    fastest = {}
    for key, totals in per_layer.items():  # a tile that did not run in every layer cannot win
        both = {
            label: sum(t[label] for t in totals)
            for label in set.intersection(*(set(t) for t in totals))
        }
        if both:
            fastest[key] = min(both, key=both.get)
    if fastest:
        pins = ",".join(f"{k}:{d}={label}" for (k, d), label in fastest.items())
        over = "the modes" + (" and layers" if args.layers else "")
        lines += [
            "",
            f"Fastest tile per kernel and dtype (sum over {over}; {max(args.nodes)} nodes), as "
            f"the fused plugin's option: `-o fused_tiles={pins}`",
        ]
        print(lines[-1], flush=True)
    return lines


def layers_of(args, kernel: str) -> list[int]:
    """The layers ``kernel`` is timed in: ``--layers``, or its :data:`DEFAULT_LAYER`."""
    return list(args.layers) if args.layers else [DEFAULT_LAYER[kernel]]


def row_label(args, kernel: str, layer: int) -> str:
    """A row's kernel column: ``tp`` as before without ``--layers``, ``tp L0`` with it."""
    return f"{kernel} L{layer}" if args.layers else kernel


def tile_rows(
    args, family: str, name: str, model, dtype_name: str, n: int, graphs: dict, device, layer: int
) -> tuple[list[str], dict[str, float]]:
    """One row per tile config of the Triton kernel ``name``, timed on ``family``'s case of ``n``
    nodes in ``layer``; and each tile's seconds summed over the modes (the tiles that ran them
    all)."""
    import torch

    from cfm_plugins.ops.triton import configs

    call, params, inputs = case(family, model, n, graphs, getattr(torch, dtype_name), device, layer)
    rows, base, totals = (
        [],
        {},
        {},
    )  # base: mode -> the default tile's seconds; totals: label -> seconds
    for i, cfg in enumerate(configs.configs_for(name, dtype_name)):
        with configs.override(**{name: cfg}):
            times = {}
            for mode in args.modes:
                try:
                    times[mode] = measure(
                        lambda: run_mode(family, call, params, inputs, mode),
                        device,
                        args.reps,
                        args.warmup,
                    )[0]
                except RuntimeError as exc:
                    if not out_of_memory(exc):
                        raise
                    times[mode] = None
        if i == 0:
            base = times
        if all(t is not None for t in times.values()):
            totals[cfg.label()] = sum(times.values())
        cells = [
            "OOM"
            if times[m] is None
            else f"{times[m] * 1e3:.2f}"
            + (f" ({times[m] / base[m]:.2f}x)" if i and base[m] else "")
            for m in args.modes
        ]
        rows.append(
            f"| {row_label(args, family, layer)} | {name} | {dtype_name} | {n} | "
            f"{cfg.label()}{' (default)' if i == 0 else ''} | " + " | ".join(cells) + " |"
        )
        print(rows[-1], flush=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, totals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--nodes", type=int, nargs="+", default=[500, 4000, 32000])
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"]
    )
    p.add_argument("--kernels", nargs="+", default=["sc", "tp"], choices=["sc", "tp"])
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    p.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), choices=MODES)
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=None,
        choices=[0, 1],
        help="the layers whose kernels are timed (default: sc in layer 0, tp in layer 1); "
        "rows are then labelled 'tp L0', 'sc L1', ...",
    )
    p.add_argument("--backend", default="triton", choices=["cuda", "triton"])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="print the top kernels of each bwd2 case")
    p.add_argument(
        "--tiles",
        action="store_true",
        help="also time the fused way with each Triton kernel's alternative tile configs",
    )
    p.add_argument(
        "--tile-kernels",
        nargs="+",
        default=None,
        choices=[k for ks in TILE_KERNELS.values() for k in ks],
        help="with --tiles: sweep only these Triton kernels (default: every kernel of --kernels)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 32 nodes, float64, 1 rep")
    add_out_argument(p)
    args = p.parse_args(argv)
    command = command_line(argv)
    if args.quick:
        args.nodes, args.dtypes, args.reps, args.warmup = [32], ["float64"], 1, 1

    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops import _backend

    device = torch.device(args.device)
    if device.type == "cuda":
        _backend.set_gpu_backend(args.backend)
    title = f"Fused kernels alone on {device_name(device)}"
    table = [
        "| kernel | dtype | nodes | edges | mode | "
        + " | ".join(f"{w} ms | {w} GiB" for w in args.ways)
        + " | fused vs stock | fused vs cueq |",
        "|---|---|---:|---:|---|" + "---:|---:|" * len(args.ways) + "---:|---:|",
    ]
    print("\n".join([f"## {title}", "", f"`{command}`", "", *table]), flush=True)
    profiles, notes = [], []
    fused = {}  # dtype name -> the fused model, kept for the tile sweep
    graphs = {n: cuni_graph(n, 6.0) for n in args.nodes} if "tp" in args.kernels else {}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        stock = build_model(dtype, "128x0e+128x1o").to(device)
        models = {way: prepare(way, stock, device) for way in args.ways}
        if (
            args.tiles and "fused" in models and not isinstance(models["fused"], str)
        ):  # a str: why it did not run
            fused[dtype_name] = models["fused"]
        for way, m in models.items():
            if isinstance(m, str) and dtype_name == args.dtypes[0]:
                print(f"{way}: not run: {m}", flush=True)
                notes.append(f"- {way}: not run: {m}")
        for kernel, layer in ((k, layer) for k in args.kernels for layer in layers_of(args, k)):
            for n in args.nodes:
                n_edges = graphs[n][1].shape[1] if kernel == "tp" else 0
                res = {}
                for mode in args.modes:
                    for way, model in models.items():
                        if isinstance(model, str):
                            res[way, mode] = (None, None, "missing")
                            continue
                        try:
                            call, params, inputs = case(
                                kernel, model, n, graphs, dtype, device, layer
                            )
                            fn = lambda: run_mode(kernel, call, params, inputs, mode)  # noqa: E731
                            s, gib = measure(fn, device, args.reps, args.warmup)
                            res[way, mode] = (s, gib, "")
                            if args.profile and mode in ("bwd2", "train"):
                                profiles += [
                                    f"{row_label(args, kernel, layer)} {dtype_name} {n} nodes "
                                    f"{mode} {way}:"
                                ]
                                profiles += top_kernels(fn, device, 6)
                        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
                            if not out_of_memory(exc):
                                raise
                            res[way, mode] = (None, None, "OOM")
                        finally:
                            call = params = inputs = fn = None
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                    cells = []
                    for way in args.ways:
                        s, gib, why = res[way, mode]
                        cells.append(
                            f"{s * 1e3:.2f} | {gib:.2f}"
                            if s is not None and gib is not None
                            else f"{s * 1e3:.2f} | -"
                            if s is not None
                            else f"{why} | -"
                        )

                    def ratio(other):
                        a, b = (
                            res.get(("fused", mode), (None,))[0],
                            res.get((other, mode), (None,))[0],
                        )
                        return f"{a / b:.2f}x" if a and b else "-"

                    label = row_label(args, kernel, layer)
                    table.append(
                        f"| {label} | {dtype_name} | {n} | {n_edges or '-'} | {mode} | "
                        + " | ".join(cells)
                        + f" | {ratio('stock')} | {ratio('cueq')} |"
                    )
                    print(table[-1], flush=True)
        del models, stock
    tables = [
        markdown_table(
            "kernels",
            table,
            "ms per call (median, synchronised) and peak GiB above the inputs per way; fused "
            "against stock and cuEquivariance in the same run",
        )
    ]
    if notes:
        print("\n".join(notes), flush=True)
    if fused:
        sweep = tile_sweep(args, fused, graphs, device)
        tables.append(
            markdown_table(
                "tiles",
                [line for line in sweep if line.startswith("|")],
                sweep[1].rstrip(":"),
            )
        )
        notes += [line for line in sweep if line.startswith("Fastest")]
    if profiles:
        section = [
            "",
            "Top kernels of each bwd2 case (torch.profiler):",
            "",
            "```",
            *profiles,
            "```",
        ]
        print("\n".join(section), flush=True)
    layers = (
        f"layers {', '.join(map(str, args.layers))}"
        if args.layers
        else "sc in layer 0, tp in layer 1"
    )
    write_record(
        "gpu_kernels" + ("_quick" if args.quick else ""),
        title,
        tables,
        description=(
            "the symmetric contraction (sc) and conv TP with its gather and scatter (tp) of the "
            "MACE-MP-medium-like model of benchmarks/gpu_mace.py, taken out of the model each way "
            f"builds it ({layers}); fused kernel backend {args.backend} on CUDA; modes "
            f"{', '.join(args.modes)}; median of {args.reps} calls after {args.warmup} warm-ups"
        ),
        notes=[n.removeprefix("- ") for n in notes],
        out=args.out,
        device=device,
        command=command,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
