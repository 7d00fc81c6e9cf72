"""Molecular dynamics on the GPU: ms per VelocityVerlet step, mace's calculator vs CFMCalculator.

    python -m benchmarks.gpu_md [--atoms 500 4000] [--dtypes float32 float64] [--steps 20]
    python -m benchmarks.gpu_md --device cpu --atoms 32 --hidden 8x0e+8x1o --steps 2   # anywhere

Workload: the MACE-MP-medium-like model of :func:`benchmarks.gpu_mace.build_model` on its rattled
CuNi fcc cells, VelocityVerlet at 300 K with a 2 fs step (``cfm_plugins.calculators.time_md``: the
same start and velocities for every calculator), best of ``--repeats`` timed runs of ``--steps``
steps. One row per way of :data:`WAYS` (and with ``--skin``, :func:`calculators`), one after the
other in one process: its time, as a ratio to ``stock``'s and to ``cueq``'s (the MD target at 4000
atoms is against ``cueq``), its force difference from ``stock``, and the time its input and its
first call take (the columns: :func:`main`). Prints the table, naming the device, and writes the
record ``gpu_md`` to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.record import add_out_argument, command_line, markdown_table, write_record

#: ways of the table: ``stock``, mace's ``MACECalculator`` (e3nn modules); ``cueq``,
#: ``MACECalculator(enable_cueq=True)`` (needs cuequivariance-torch); ``fused[cuda]`` /
#: ``fused[triton]``, ``CFMCalculator`` with the fused kernels on that backend;
#: ``fused[triton]+capture``, the same with ``compile="reduce-overhead"`` (padded static shapes,
#: CUDA graphs)
WAYS = ("stock", "cueq", "fused[cuda]", "fused[triton]", "fused[triton]+capture")


def calculators(
    path: str, dtype: str, device: str, ways, skin: float | None = None, skin_only: bool = False
):
    """(label, factory) for each way; a factory builds the calculator when called. With ``skin``,
    each fused way also as ``<way> skin <skin>``: ``CFMCalculator(skin=skin)``, the neighbour list
    built with ``r_max + skin`` and kept between steps, right after it (``skin_only``: instead of
    it). The fused ways without it pass ``skin=None`` (mace's conversion at every step), which on
    CUDA is not CFMCalculator's default (1.0)."""
    from mace.calculators import MACECalculator

    from cfm_plugins.calculators import CFMCalculator
    from cfm_plugins.ops import _backend

    def cfm(backend, **kw):
        def make():
            _backend.set_gpu_backend(backend)
            return CFMCalculator(path, device=device, default_dtype=dtype, **kw)

        return make

    fused = {
        "fused[cuda]": ("cuda", {"skin": None}),
        "fused[triton]": ("triton", {"skin": None}),  # backend, options
        "fused[triton]+capture": ("triton", {"compile": "reduce-overhead", "skin": None}),
    }
    table = {
        "stock": lambda: MACECalculator(model_paths=path, device=device, default_dtype=dtype),
        "cueq": lambda: MACECalculator(
            model_paths=path, device=device, default_dtype=dtype, enable_cueq=True
        ),
        **{w: cfm(backend, **kw) for w, (backend, kw) in fused.items()},
    }
    out = []
    for w in ways:
        if not (skin_only and skin is not None and w in fused):
            out.append((w, table[w]))
        if skin is not None and w in fused:
            backend, kw = fused[w]
            out.append((f"{w} skin {skin:g}", cfm(backend, **{**kw, "skin": skin})))
    return out


def graph_seconds(calc, atoms, reps: int = 3) -> float:
    """Median seconds the calculator takes to make the model's input from ``atoms``: mace's data
    conversion, neighbour list and collation on the host, and the copy to the device
    (``_atoms_to_batch``, what each MD step does before the model runs)."""
    import statistics
    import time

    import torch

    times = []
    for _ in range(reps):
        t = time.perf_counter()
        calc._atoms_to_batch(atoms)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--atoms", type=int, nargs="+", default=[500, 4000])
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"]
    )
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    p.add_argument("--hidden", default="128x0e+128x1o")
    p.add_argument(
        "--skin",
        type=float,
        default=None,
        help="also run each fused way with CFMCalculator(skin=SKIN): the neighbour list kept "
        "between steps",
    )
    p.add_argument(
        "--skin-only",
        action="store_true",
        help="with --skin, only the skin rows of the fused ways "
        "(each fused way once, with the skin)",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=2)
    add_out_argument(p)
    args = p.parse_args(argv)
    if args.skin_only and args.skin is None:
        p.error("--skin-only needs --skin SKIN")

    import mace  # noqa: F401
    import numpy as np
    import torch

    from benchmarks.gpu_mace import build_model, cuni_atoms, device_name
    from cfm_plugins.calculators.md import time_md

    command = command_line(argv)
    device = torch.device(args.device)
    description = (
        f"ScaleShiftMACE {args.hidden}, l<=3, correlation 3, 89 elements, r_max 6; rattled CuNi "
        f"fcc cells of {', '.join(map(str, args.atoms))} atoms; VelocityVerlet 300 K, 2 fs, best "
        f"of {args.repeats} x {args.steps} steps"
        + (f"; skin {args.skin:g} A for the skin rows" if args.skin is not None else "")
    )
    header = [
        "## MD with CFMCalculator (benchmarks/gpu_md.py)",
        "",
        f"Command: `{command}`",
        "",
        f"Device: {device_name(device)}",
        "",
        f"Workload: {description}.",
        "",
    ]
    # per row: the time per step and its ratios to stock's and cueq's where those ran before it in
    # the same run; the largest force difference from stock on the starting structure; "graph ms",
    # how much of a step the model's input takes to make (mace's neighbour list and data
    # conversion on the host, the copy to the device: graph_seconds); "first call s", the model's
    # first step (with capture also the compile and the CUDA-graph recording a calculator pays once
    # per padded size)
    lines = [
        "| dtype | atoms | way | ms per MD step | vs stock | vs cueq | max abs dF vs stock | graph "
        "ms | first call s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(header + lines), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="cfm_gpu_md_"))
    for dtype in args.dtypes:
        path = tmp / f"model_{dtype}.model"
        torch.save(build_model(getattr(torch, dtype), args.hidden).cpu(), path)
        for n in args.atoms:
            atoms = cuni_atoms(n)
            base_t, base_f, cueq_t = None, None, None
            for way, make in calculators(
                str(path), dtype, args.device, args.ways, args.skin, args.skin_only
            ):
                label = f"| {dtype} | {len(atoms)} | {way} |"
                try:
                    calc = make()
                    probe = atoms.copy()
                    probe.calc = calc
                    t0 = time.perf_counter()
                    forces = probe.get_forces()
                    first = time.perf_counter() - t0
                    seconds = min(
                        time_md(calc, atoms, steps=args.steps) for _ in range(args.repeats)
                    )
                    graph = graph_seconds(calc, atoms)
                except Exception as exc:  # one way failing must not lose the others
                    traceback.print_exc()
                    why = str(exc).splitlines()[0][:120].replace("|", "/") if str(exc) else ""
                    lines.append(
                        f"{label} failed: {type(exc).__name__}: {why} | - | - | - | - | - |"
                    )
                    print(lines[-1], flush=True)
                    continue
                if way == "stock":
                    base_t, base_f = seconds, forces
                elif way == "cueq":
                    cueq_t = seconds
                ratio = f"{seconds / base_t:.2f}x" if base_t else "-"
                vs_cueq = f"{seconds / cueq_t:.2f}x" if cueq_t else "-"
                df = f"{np.abs(forces - base_f).max():.1e}" if base_f is not None else "-"
                lines.append(
                    f"{label} {seconds * 1e3:.1f} | {ratio} | {vs_cueq} | {df} | {graph * 1e3:.1f} "
                    f"| {first:.3g} |"
                )
                print(lines[-1], flush=True)
                del calc
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    write_record(
        "gpu_md",
        f"MD with CFMCalculator on {device_name(device)}",
        [
            markdown_table(
                "md",
                lines,
                "ms per MD step per way (best run), against stock's and cuEquivariance's in the "
                "same run, the largest force difference from stock on the starting structure, "
                "the ms of a step spent making the model's input, and the first evaluation (s)",
            )
        ],
        description=description,
        out=args.out,
        device=device,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
