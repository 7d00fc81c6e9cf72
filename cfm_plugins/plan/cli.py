"""``cfm-plan``: binpack's packing, the balance and the epoch time at the target scale, from the
user's own data, before the allocation is spent.

    cfm-plan train.xyz --r-max 5.0 --ranks 8,64,740 --batch-size 8 --dtype float32
    cfm-plan data_dir/ --ranks 16,32,64 --step-time run/ckpt/name_run-1.cfm-binpack.json \\
        --params 4700000 --interconnect slingshot11 --png scaling.png --json plan.json

See docs/plan.md. Exit status: 0 done; 1 the data has structures that cannot be trained on
(named; ``--skip-bad`` plans without them) or cannot be read; 2 a usage error (the argument
named).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

EPILOG = "docs/plan.md describes every option and what the figures mean."


class Usage(Exception):
    """A usage error: the argument and what is wrong with it."""


def _positive(kind, name):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (isinstance(v, int) or math.isfinite(v)) or v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: {name} must be > 0")
        return v

    return parse


def _ranks(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            w = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a rank count: give whole numbers >= 1, comma-separated "
                "(e.g. 8,64,740)"
            ) from None
        if w < 1:
            raise argparse.ArgumentTypeError(
                f"{w} is not a rank count: every rank count must be >= 1"
            )
        out.append(w)
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    from cfm_plugins.plugins.binpack import STEP_BALANCE_OPTIONS
    from cfm_plugins.sampler.packing import OVERSIZE_POLICIES

    from .neighbours import BACKENDS
    from .predict import DEFAULT_FABRIC, FABRICS
    from .readers import FORMATS

    p = argparse.ArgumentParser(
        prog="cfm-plan",
        description="Plan binpack's batches at the target rank counts from your data: steps, "
        "padding, load imbalance (LIF) against the trainer's own batches, and the epoch time "
        "where a step-time model is given.",
        epilog=EPILOG,
    )
    p.add_argument(
        "data",
        nargs="+",
        metavar="DATA",
        help="training data: extended XYZ (or any file ase.io.read reads), mace's preprocessed "
        "HDF5 (a file or a folder of shards), mace's LMDB (a file or folder), an ASE database "
        "(.db), a torch.save'd list of PyG graphs (.pt), or a sizes file (.npz with 'atoms' "
        "and 'edges'); several: one data set, in order",
    )
    p.add_argument("--format", choices=FORMATS, help="the format of every DATA (default: by name)")
    p.add_argument(
        "--r-max",
        type=_positive(float, "--r-max"),
        help="cutoff radius (A) at which to count edges, periodic images included, as the "
        "trainer builds its graphs; needed where a cost or step time reads edges",
    )
    p.add_argument(
        "--ranks",
        type=_ranks,
        required=True,
        help="rank counts to plan (GPUs, or CPU ranks), comma-separated, e.g. 8,64,740",
    )
    p.add_argument(
        "--batch-size",
        type=_positive(int, "--batch-size"),
        default=8,
        help="the trainer's batch size (graphs per rank and step): its own batches, and "
        "binpack's default capacity (default 8)",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive(float, "--max-tokens"),
        help="binpack's max_tokens: bin capacity in cost units (default: batch size x mean "
        "cost, at least the largest structure, on GPUs clamped to 800..4000 atoms in float32, "
        "400..2000 in float64)",
    )
    p.add_argument(
        "--cost",
        default="atoms",
        metavar="COST",
        help="binpack's cost: atoms (default), edges, linear:A,B (A*atoms + B*edges, binpack's "
        "cost_a and cost_b), or FIT.json (the fit cost=auto saved beside a run's checkpoints: "
        "the packing of the epochs after its calibration)",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="where the run trains: on cuda binpack clamps its default capacity (default cuda)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float64",
        help="the trainer's dtype (mace's --default_dtype; default float64)",
    )
    p.add_argument("--seed", type=int, default=0, help="the run's seed (binpack's seed; default 0)")
    p.add_argument(
        "--epoch", type=int, default=0, help="the epoch to plan (packed from seed + epoch)"
    )
    p.add_argument(
        "--oversize",
        choices=OVERSIZE_POLICIES,
        default="error",
        help="binpack's oversize: a structure costlier than the capacity (default error)",
    )
    p.add_argument(
        "--step-balance",
        choices=STEP_BALANCE_OPTIONS,
        default="edges",
        help="binpack's step_balance: what the bins of one step are made even in: edges (with "
        "--cost atoms, where the edge counts are read: --r-max) or the cost itself (default "
        "edges)",
    )
    p.add_argument(
        "--keep-isolated",
        action="store_true",
        help="plan the one-atom config_type=IsolatedAtom structures of XYZ/ASE files too (mace "
        "trains without them, its E0s, unless --keep_isolated_atoms)",
    )
    p.add_argument(
        "--seeds",
        type=_positive(int, "--seeds"),
        default=5,
        help="orders of the trainer's own batches to plan (DistributedSampler seeds seed.."
        "seed+N-1): median and spread (default 5)",
    )
    p.add_argument(
        "--stock-pad",
        action="store_true",
        help="the trainer's DistributedSampler pads (repeats a few structures; torch's default, "
        "HydraGNN) instead of dropping the last few (drop_last, mace)",
    )
    p.add_argument(
        "--step-time",
        metavar="MODEL",
        help="seconds per step of a rank: FIT.json (binpack cost=auto's saved fit) or "
        "linear:C0,A[,B[,G]] (per step, per atom, per edge, per graph); default: the fit of "
        "--cost FIT.json, else none (no times)",
    )
    p.add_argument(
        "--params",
        type=_positive(int, "--params"),
        help="the model's parameter count: adds the gradient all-reduce to every step",
    )
    p.add_argument(
        "--interconnect",
        default=DEFAULT_FABRIC,
        help=f"the network between ranks: {', '.join(FABRICS)} (default {DEFAULT_FABRIC}); "
        "--bandwidth/--latency override it",
    )
    p.add_argument(
        "--bandwidth",
        type=_positive(float, "--bandwidth"),
        help="all-reduce bandwidth per rank in GB/s (overrides the interconnect's)",
    )
    p.add_argument(
        "--latency",
        type=_positive(float, "--latency"),
        help="latency per message in microseconds (overrides the interconnect's)",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="also plan the other trainers' samplers at every --ranks: DistributedSampler with "
        "--batch-size, HydraGNN's node budget, fairchem's and metatrain's max_atoms (at "
        "binpack's capacity in atoms), and print them beside binpack",
    )
    p.add_argument("--png", metavar="PATH", help="write the strong-scaling picture here")
    p.add_argument("--json", metavar="PATH", help="write everything as JSON here")
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="keep the sizes in DIR/.cfm-plan-cache (default: beside --json, else --png, else "
        "the current folder)",
    )
    p.add_argument("--no-cache", action="store_true", help="read every file again, keep nothing")
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="plan without the structures that cannot be trained on (no atoms, a non-finite "
        "position, periodic without a cell), counting them, instead of stopping",
    )
    p.add_argument(
        "--counter",
        choices=BACKENDS,
        help="the edge counter (default: the compiled one, else vesin, else matscipy)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    return p


def _cost_option(text: str):
    """``(kind, a, b, fit)`` of --cost."""
    from .predict import read_fit

    if text in ("atoms", "edges"):
        return text, 1.0, 0.0, None
    if text.startswith("linear:"):
        parts = text[len("linear:") :].split(",")
        try:
            a, b = (float(x) for x in parts)
        except ValueError:
            raise Usage(
                f"--cost {text}: give linear:A,B (two numbers >= 0, not both 0), e.g. linear:1,0.05"
            ) from None
        if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b < 0 or a + b <= 0:
            raise Usage(f"--cost {text}: A and B must be >= 0 and not both 0")
        return "linear", a, b, None
    if text.endswith(".json") or os.path.exists(text):
        try:
            return "fit", 1.0, 0.0, read_fit(text)
        except ValueError as exc:
            raise Usage(f"--cost: {exc}") from None
    raise Usage(f"--cost {text!r}: expected atoms, edges, linear:A,B or a saved fit FIT.json")


def _step_time(args, fit):
    from .predict import parse_linear, read_fit

    if args.step_time is None:
        return (fit, "the fit of --cost") if fit is not None else (None, None)
    text = args.step_time
    if text.startswith("linear:"):
        try:
            return parse_linear(text[len("linear:") :]), "--step-time"
        except ValueError as exc:
            raise Usage(f"--step-time {exc}") from None
    try:
        return read_fit(text), text
    except ValueError as exc:
        raise Usage(f"--step-time: {exc}") from None


def _fabric(args):
    from dataclasses import replace

    from .predict import FABRICS

    if args.interconnect not in FABRICS:
        raise Usage(
            f"--interconnect {args.interconnect!r}: expected one of {', '.join(FABRICS)} (or set "
            "--bandwidth and --latency)"
        )
    f = FABRICS[args.interconnect]
    if args.bandwidth is not None:
        f = replace(f, bandwidth=args.bandwidth * 1e9, source="--bandwidth")
    if args.latency is not None:
        f = replace(f, latency=args.latency * 1e-6, source=f.source + "; --latency")
    return f


def _inputs(args):
    from .readers import DataError, detect

    out = []
    for path in args.data:
        if not os.path.exists(path):
            raise DataError(f"{path}: no such file or folder")
        if args.format is not None:
            out.append((path, args.format))
            continue
        try:
            out.append((path, detect(path)))
        except DataError as exc:
            raise Usage(f"--format: {exc}") from None
    return out


def _cache_dir(args) -> str | None:
    if args.no_cache:
        return None
    if args.cache:
        return args.cache
    for out in (args.json, args.png):
        if out:
            return os.path.dirname(os.path.abspath(out))
    return os.getcwd()


def _needs_edges(kind, b, fit, model) -> str | None:
    if kind == "edges" or (kind == "linear" and b > 0):
        return "--cost " + kind
    if fit is not None and fit.b > 0:
        return "the fit of --cost (it has an edge term)"
    if model is not None and model.b > 0:
        return "--step-time (it has an edge term)"
    return None


def _excluded(files, keep_isolated: bool, skip_bad: bool):
    """``(mask of structures planned, text, counts)`` over the concatenated files."""
    import numpy as np

    keep = []
    n_iso = n_bad = 0
    first_bad = None
    for f in files:
        k = np.ones(len(f), dtype=bool)
        if not keep_isolated:
            k &= ~f.isolated
            n_iso += int(f.isolated.sum())
        if f.bad:
            idx = np.fromiter(f.bad, dtype=np.int64)
            n_bad += len(idx) - int(np.sum(~k[idx]))
            k[idx] = False
            if first_bad is None:
                i = next(iter(f.bad))
                first_bad = f"{f.path}: structure {i} {f.bad[i]}"
        keep.append(k)
    parts = []
    if n_iso:
        parts.append(
            f"{n_iso} one-atom IsolatedAtom structure(s) (mace's E0s, not trained on; "
            "--keep-isolated plans them)"
        )
    if n_bad and skip_bad:
        parts.append(f"{n_bad} bad structure(s) skipped (--skip-bad; first: {first_bad})")
    mask = np.concatenate(keep) if keep else np.zeros(0, bool)
    return mask, "; ".join(parts) or "none", {"isolated": n_iso, "bad": n_bad}


def _bad_report(files, limit: int = 10) -> str:
    lines, total = [], 0
    for f in files:
        for i, why in f.bad.items():
            total += 1
            if len(lines) < limit:
                lines.append(f"  {f.path}: structure {i} {why}")
    more = f"\n  ... and {total - limit} more" if total > limit else ""
    return (
        f"{total} structure(s) cannot be trained on:\n" + "\n".join(lines) + more + "\nfix "
        "them, or plan without them with --skip-bad"
    )


@dataclass
class Prepared:
    """What the arguments and the data give the planner: the planned structures' sizes, the
    options of the run, the step-time model and the network."""

    atoms: object
    edges: object
    opts: object
    model: object
    model_source: str | None
    fabric: object
    files: list
    excluded: dict
    excluded_text: str
    read_s: float


def prepare(args) -> Prepared:
    """Check the arguments, read (or recall) the sizes and check the structures.

    Raises:
        Usage: a bad argument. DataError: unreadable data, or bad structures without --skip-bad.
    """
    import numpy as np

    from .planning import PlanOptions, packing_costs
    from .readers import DataError
    from .sizes import read_sizes

    kind, a, b, fit = _cost_option(args.cost)
    model, model_source = _step_time(args, fit)
    fabric = _fabric(args)
    if args.epoch < 0:
        raise Usage(f"--epoch {args.epoch}: must be >= 0")
    if args.seed < 0:
        raise Usage(f"--seed {args.seed}: must be >= 0")
    needs = _needs_edges(kind, b, fit, model)
    inputs = _inputs(args)
    if needs and args.r_max is None and any(f not in ("pyg", "sizes") for _, f in inputs):
        raise Usage(f"--r-max: {needs} reads edge counts; give the trainer's cutoff (--r-max)")
    t0 = time.perf_counter()
    files = read_sizes(
        inputs,
        args.r_max,
        counter=args.counter,
        cache_dir=_cache_dir(args),
        show_progress=not args.quiet,
    )
    read_s = time.perf_counter() - t0
    if any(f.bad for f in files) and not args.skip_bad:
        raise DataError(_bad_report(files))
    mask, excluded_text, excluded = _excluded(files, args.keep_isolated, args.skip_bad)
    atoms = np.concatenate([f.atoms for f in files])[mask] if files else np.zeros(0, np.int64)
    edges = np.concatenate([f.edges for f in files])[mask] if files else np.zeros(0, np.int64)
    if len(atoms) == 0:
        raise DataError("no structure to plan: " + ", ".join(args.data) + " hold none")
    if needs and (edges < 0).any():
        i = int(np.flatnonzero(edges < 0)[0])
        raise Usage(f"--r-max: {needs} reads edge counts, and structure {i} has none")
    opts = PlanOptions(
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        cost=kind,
        cost_a=a,
        cost_b=b,
        fit=fit,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        epoch=args.epoch,
        oversize=args.oversize,
        seeds=args.seeds,
        stock_drop_last=not args.stock_pad,
        step_balance=args.step_balance,
    )
    edges = edges if (edges >= 0).all() else None
    if args.oversize == "error" and args.max_tokens is not None and kind != "fit":
        costs = packing_costs(atoms, edges, opts)[0]
        if costs.max() > args.max_tokens:
            i = int(np.argmax(costs))
            raise Usage(
                f"--max-tokens {args.max_tokens:g}: below the largest structure (cost "
                f"{costs.max():g}, structure {i} of the planned set, {atoms[i]} atoms): raise it "
                f"to at least {math.ceil(costs.max())}, or --oversize solo/skip"
            )
    return Prepared(
        atoms, edges, opts, model, model_source, fabric, files, excluded, excluded_text, read_s
    )


def run(args) -> dict:
    """The plan as a JSON-able dict (what --json writes).

    Raises:
        Usage: a bad argument. DataError: unreadable data, or bad structures without --skip-bad.
    """
    from cfm_plugins import __version__

    from .planning import make_plan
    from .predict import allreduce_seconds, gradient_bytes

    p = prepare(args)
    atoms, edges, opts = p.atoms, p.edges, p.opts
    model, model_source, fabric, files = p.model, p.model_source, p.fabric, p.files
    excluded, excluded_text, read_s = p.excluded, p.excluded_text, p.read_s
    nbytes = gradient_bytes(args.params, args.dtype) if args.params else 0
    allreduce = (lambda w: allreduce_seconds(nbytes, w, fabric)) if model is not None else None
    t1 = time.perf_counter()
    try:
        planned = make_plan(atoms, edges, args.ranks, opts, model, allreduce)
    except ValueError as exc:  # what the sampler refuses (a structure over the capacity)
        raise Usage(f"--max-tokens/--oversize: {exc}") from None
    plan_s = time.perf_counter() - t1
    r_max = args.r_max
    plan = {
        "cfm_plugins": __version__,
        "command": "cfm-plan " + " ".join(sys.argv[1:]),
        "data": {
            "files": [
                {
                    "path": f.path,
                    "format": f.fmt,
                    "structures": len(f),
                    "bad": len(f.bad),
                    "isolated": int(f.isolated.sum()),
                    "from_cache": f.from_cache,
                    "counter": f.counter,
                    "read_s": f.seconds,
                }
                for f in files
            ],
            "structures": int(len(atoms)),
            "atoms": int(atoms.sum()),
            "edges": int(edges.sum()) if edges is not None else None,
            "r_max": r_max,
            "atoms_min": int(atoms.min()),
            "atoms_max": int(atoms.max()),
            "atoms_mean": float(atoms.mean()),
        },
        "excluded": excluded,
        "excluded_text": excluded_text,
        "binpack": {
            "cost": args.cost,
            "capacity": planned["capacity"],
            "capacity_rule": planned["capacity_rule"],
            "seed": args.seed,
            "epoch": args.epoch,
            "oversize": args.oversize,
            "device": args.device,
            "dtype": args.dtype,
        },
        "stock": {
            "batch_size": args.batch_size,
            "drop_last": not args.stock_pad,
            "orders": args.seeds,
            "seeds": f"{args.seed + args.epoch}..{args.seed + args.epoch + args.seeds - 1}",
        },
        "time": None,
        "results": planned["results"],
        "efficiency": planned["efficiency"],
        "warnings": planned["warnings"],
        "seconds": {"sizes": read_s, "plan": plan_s},
    }
    if args.compare:
        plan["compare"] = _compare(p, planned["capacity"], allreduce, args.ranks)
    if model is not None:
        plan["time"] = {
            "model": model.formula() + " per step and rank",
            "fit": model.to_dict(),
            "source": model_source,
            "params": args.params,
            "fabric": {
                "name": fabric.name,
                "bandwidth_GBps": fabric.bandwidth / 1e9,
                "latency_us": fabric.latency * 1e6,
                "source": fabric.source,
            },
            "allreduce": (
                f"{args.params:,} {args.dtype} gradients ({nbytes / 1e6:.1f} MB) over "
                f"{fabric.name} ({fabric.bandwidth / 1e9:g} GB/s, {fabric.latency * 1e6:g} us): "
                + ", ".join(
                    f"{w} ranks {allreduce_seconds(nbytes, w, fabric) * 1e3:.2f} ms"
                    for w in args.ranks
                )
                + " per step (no overlap with backward: an upper bound)"
                if args.params
                else "not counted (give the model's --params)"
            ),
        }
    return plan


def _compare(p: Prepared, capacity: float, allreduce, ranks) -> dict:
    """The rows of every sampler at every rank count (:func:`.compare.compare_ranks`): the
    peers' budget is binpack's capacity where it packs atoms, else the capacity binpack's rule
    gives atoms."""
    from dataclasses import replace

    from .compare import compare_ranks
    from .planning import packing_costs

    opts = p.opts
    if opts.cost == "atoms":
        budget, rule = capacity, "binpack's capacity"
    else:
        atoms_opts = replace(opts, cost="atoms", max_tokens=None, fit=None)
        budget = packing_costs(p.atoms, None, atoms_opts)[1]
        rule = f"binpack's capacity rule in atoms (binpack packs {opts.cost} costs)"
    costs = packing_costs(p.atoms, p.edges, opts)[0]
    rows = []
    for w in ranks:
        rows += compare_ranks(
            p.atoms,
            p.edges,
            w,
            budget,
            batch_size=opts.batch_size,
            seed=opts.seed,
            epoch=opts.epoch,
            drop_last=opts.stock_drop_last,
            model=p.model,
            allreduce_s=allreduce(w) if allreduce is not None else 0.0,
            binpack=(costs, capacity, opts),
        )
    return {"budget_atoms": budget, "budget_rule": rule, "rows": rows}


def _jsonable(obj):
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def main(argv=None) -> int:
    from .readers import DataError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        plan = run(args)
    except Usage as exc:
        parser.error(str(exc))
    except (DataError, RuntimeError) as exc:  # RuntimeError: no neighbour counter
        print(f"cfm-plan: error: {exc}", file=sys.stderr)
        return 1
    from . import report

    print(report.text(plan))
    if plan.get("compare"):
        from .compare import compare_text

        print("\n" + "\n".join(compare_text(plan)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(_jsonable(plan), fh, indent=1)
        print(f"wrote {args.json}")
    if args.png:
        title = (
            f"{plan['data']['structures']:,} structures, {plan['data']['atoms']:,} atoms; binpack "
            f"capacity {plan['binpack']['capacity']:g} ({args.cost}); the trainer's own batches of "
            f"{args.batch_size} graphs"
        )
        report.draw(plan, args.png, title=title)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
