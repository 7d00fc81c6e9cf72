"""binpack against the peers' samplers, side by side, on the MACE paper's workload and real sets.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.samplers            # the full run
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.samplers --quick    # a smoke run

binpack, torch's ``DistributedSampler`` (8 graphs per rank), HydraGNN's
``DistributedCostAwareBatchSampler``, fairchem's and metatrain's ``MaxAtomDistributedBatchSampler``
(``cfm_plugins/plan/peer_samplers.py``), on the data sets of :data:`SETS` at 2, 8, 64, 740 and
4096 ranks and two budgets (3072 atoms, the paper's; the largest structure rounded up to 64
atoms), seed 0, epoch 0: the figures of ``cfm_plugins/plan/compare.py`` (``cfm-plan
--compare``'s), the epoch predicted from the step time of :func:`time_model` plus the all-reduce
of :func:`allreduce`. Writes the record ``samplers`` (``samplers_quick``) and its picture
(predicted epoch by rank count, one line per sampler) to ``--out``.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.plan import FABRIC, PARAMS, geometry_mix, step_fit  # noqa: E402
from benchmarks.record import (  # noqa: E402
    DEFAULT_OUT,
    add_out_argument,
    command_line,
    markdown_table,
    picture_path,
    write_record,
)
from benchmarks.sampler import CAPACITY, mix_text  # noqa: E402
from benchmarks.workload import PAPER_MIX, paper_mix  # noqa: E402
from cfm_plugins.plan.compare import SAMPLERS, compare_ranks, table  # noqa: E402
from cfm_plugins.plan.predict import fmt_time  # noqa: E402

RANKS = (2, 8, 64, 740, 4096)
R_MAX = 6.0
#: the data sets (``--sets``): ``table3``, the Table-3 mix with edges at r_max 6 A
#: (:func:`table3`); ``cuni``, the CuNi demo set (``cfm_plugins/datasets/cuni.py``, labelled
#: extended XYZ; edges at r_max 6 A, counted by cfm-plan); ``hydragnn``, the HydraGNN example's
#: graphs (``cfm_plugins/datasets/clusters.py``, ``torch.save``'d PyG graphs: their own edges,
#: radius 5 A, 20 neighbours); ``hdf5``, both sets' structures in the mace HDF5 folder
#: ``mace_prepare_data`` writes (training shards; edges at r_max 6 A). The real sets are made once
#: into ``--data`` (:func:`real_set`).
SETS = ("table3", "cuni", "hydragnn", "hdf5")
TITLES = {
    "table3": "the MACE paper's Table-3 mix",
    "cuni": "the CuNi demo set",
    "hydragnn": "the HydraGNN example's graphs",
    "hdf5": "a mace HDF5 folder (CuNi and HydraGNN structures)",
}
#: the samplers with a budget: the targets' peers (DistributedSampler's batches have none)
PEERS = ("hydragnn", "fairchem", "metatrain")


def time_model():
    """``(StepCost, text)``: the step time ``c0 + b x edges``. The H200 line through the train
    steps of ``benchmarks/results/gpu_mace_step-h200.json`` (``benchmarks/plan.py``'s
    :func:`~benchmarks.plan.step_fit`, by atoms) with its slope per edge: the record's cells have
    one edge count per atom, and mace's ``cost=auto`` fit keeps the edge term alone
    (``benchmarks/results/autocost_mace.json``)."""
    from cfm_plugins.sampler import StepCost

    c0, a, pts, rec = step_fit()
    (tab,) = [t for t in rec["tables"] if t["name"] == "step"]
    col = {c: i for i, c in enumerate(tab["columns"])}
    ratio = {float(r[col["edges"]]) / float(r[col["atoms"]]) for r in tab["rows"]}
    per_atom = float(np.mean(sorted(ratio)))
    model = StepCost(c0=c0, a=0.0, b=a / per_atom, g=0.0, terms=("edges",), clock="wall")
    text = (
        f"step time {model.formula()}: the line {c0 * 1e3:.2f} ms + {a * 1e6:.2f} us/atom through "
        f"the fused[triton] float64 train steps of {rec['device']} (gpu_mace_step-h200.json, "
        f"{len(pts)} CuNi cells of {per_atom:.1f} edges per atom at r_max 6), per edge"
    )
    return model, text


def allreduce(ranks: int) -> float:
    """Seconds of one step's all-reduce of the model's :data:`~benchmarks.plan.PARAMS` float32
    gradients (4,688,656) over :data:`~benchmarks.plan.FABRIC` (Slingshot-11) at ``ranks``."""
    from cfm_plugins.plan.predict import FABRICS, allreduce_seconds, gradient_bytes

    return allreduce_seconds(gradient_bytes(PARAMS, "float32"), ranks, FABRICS[FABRIC])


def table3(n_req: int | None, sample: int):
    """``(atoms, edges, text)`` of the Table-3 mix (``benchmarks/workload.py``) with edges at
    r_max 6 A: per data set and atom count, the edges per atom counted on ``sample`` structures of
    the mix's shapes and densities (``benchmarks/plan.py``'s :func:`~benchmarks.plan.geometry_mix`),
    interpolated."""
    from cfm_plugins.plan import neighbours

    atoms, labels = paper_mix(n_req, seed=0, return_labels=True)
    pos, off, cells, pbc = geometry_mix(sample)
    s_atoms, s_labels = paper_mix(sample, seed=0, return_labels=True)
    s_edges = neighbours.count_edges(pos, off, cells, pbc, R_MAX)
    ratio = s_edges / s_atoms
    edges = np.zeros(len(atoms), np.int64)
    for k in range(len(PAPER_MIX)):
        mine = s_labels == k
        xs, inv = np.unique(s_atoms[mine], return_inverse=True)
        mean = np.bincount(inv, weights=ratio[mine]) / np.bincount(inv)
        sel = labels == k
        edges[sel] = np.rint(atoms[sel] * np.interp(atoms[sel], xs, mean)).astype(np.int64)
    text = (
        mix_text(atoms, n_req) + f"; {int(edges.sum()):,} edges at r_max {R_MAX:g} A (edges per "
        f"atom by data set and atom count from {sample:,} structures of the mix's shapes)"
    )
    return atoms, edges, text


def _write_hdf5(folder: Path, cuni_xyz: Path, n: int) -> Path:
    """The HDF5 folder of the CuNi set and ``n`` labelled HydraGNN-example structures."""
    from ase.io import read, write

    from cfm_plugins.datasets.clusters import make_structures
    from cfm_plugins.datasets.cuni import label

    frames = read(cuni_xyz, ":") + [label(a) for a in make_structures(n, seed=0)]
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "mixed.xyz", frames, format="extxyz")
    mace = Path(sys.executable).parent / "mace_prepare_data"
    cmd = [str(mace), "--train_file", str(folder / "mixed.xyz"), "--valid_fraction", "0.05"]
    cmd += ["--h5_prefix", f"{folder}/h5/", "--r_max", str(R_MAX), "--num_process", "2"]
    cmd += ["--energy_key", "REF_energy", "--forces_key", "REF_forces"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return folder / "h5" / "train"


def real_set(name: str, folder: Path, n: int):
    """``(atoms, edges, text)`` of real set ``name`` of ``n`` structures per source, made into
    ``folder`` unless there, read as cfm-plan reads it (one-atom IsolatedAtom entries left out,
    as mace trains)."""
    from cfm_plugins.plan.sizes import read_sizes

    folder = folder / f"{name}-{n}"
    cuni = folder.parent / f"cuni-{n}" / "train.xyz"
    if not cuni.is_file() and name in ("cuni", "hdf5"):
        from cfm_plugins.datasets.cuni import make_dataset

        make_dataset(cuni.parent, n_train=n, n_valid=0, n_test=0, seed=0)
    if name == "cuni":
        path, fmt, r_max, what = cuni, "xyz", R_MAX, "labelled extended XYZ"
    elif name == "hydragnn":
        path, fmt, r_max, what = folder / "clusters.pt", "pyg", None, "PyG graphs (torch.save)"
        if not path.is_file():
            import torch

            from cfm_plugins.datasets.clusters import make_dataset

            folder.mkdir(parents=True, exist_ok=True)
            torch.save(make_dataset(n, seed=0), path)
    else:
        path, fmt, r_max = folder / "h5" / "train", "h5", R_MAX
        what = "mace_prepare_data's training shards"
        if not path.is_dir():
            _write_hdf5(folder, cuni, n)
    files = read_sizes([(str(path), fmt)], r_max, cache_dir=str(folder), show_progress=False)
    keep = np.concatenate([~f.isolated for f in files])
    atoms = np.concatenate([f.atoms for f in files])[keep]
    edges = np.concatenate([f.edges for f in files])[keep]
    text = (
        f"{len(atoms):,} structures of {atoms.min()}-{atoms.max()} atoms ({int(atoms.sum()):,} "
        f"atoms, {int(edges.sum()):,} edges"
        + (f" at r_max {r_max:g} A" if r_max else ", their own")
        + f"), {what}"
    )
    return atoms, edges, text


def run_set(atoms, edges, capacities, ranks, model):
    rows = []
    for cap in capacities:
        for w in ranks:
            got = compare_ranks(
                atoms, edges, w, cap, model=model, allreduce_s=allreduce(w), batch_size=8, repeats=3
            )
            rows.extend(got)
            print(
                f"  capacity {cap:g}, {w} ranks: "
                + ", ".join(
                    f"{r['key']} {'refused' if 'refused' in r else format(r['epoch'], '.3g')}"
                    for r in got
                ),
                flush=True,
            )
    return rows


def _groups(rows):
    """``{(budget, ranks): {sampler key: row}}``."""
    out = {}
    for r in rows:
        out.setdefault((r["capacity"], r["ranks"]), {})[r["key"]] = r
    return out


def targets(results: dict) -> list[str]:
    """The issue's targets, each met or not, with the figures."""
    out = []
    t3 = _groups(results.get("table3", {}).get("rows", [])).get((CAPACITY, 740), {})
    b = t3.get("binpack", {})
    for key, want in (("hydragnn", 0.07), ("fairchem", 0.14)):
        p = t3.get(key, {})
        if "epoch" not in p or "epoch" not in b:
            continue
        below = 1 - b["epoch"] / p["epoch"]
        out.append(
            f"{'MET' if below >= want else 'NOT MET'}: Table-3 mix, 740 ranks, {CAPACITY} atoms: "
            f"binpack's predicted epoch {100 * below:.2f}% below {SAMPLERS[key]}'s (target "
            f">= {100 * want:.0f}%)"
        )
        out.append(
            f"{'MET' if b['plan_s'] <= p['plan_s'] else 'NOT MET'}: planning time per rank "
            f"there, binpack {b['plan_s']:.2f} s against {SAMPLERS[key]}'s model "
            f"{p['plan_s']:.2f} s"
        )
    for name, res in results.items():
        if name == "table3":
            continue
        lose = []
        for (cap, w), g in _groups(res["rows"]).items():
            b = g.get("binpack", {})
            for key in PEERS:
                p = g.get(key, {})
                if not p.get("steps") or not b.get("steps"):
                    continue
                if b["steps"] > p["steps"]:
                    lose.append(f"{w} ranks/{cap:g}: steps {b['steps']} > {key} {p['steps']}")
                if b["lif_edges"] > p["lif_edges"] + 1e-12:
                    lose.append(
                        f"{w} ranks/{cap:g}: LIF(edges) {b['lif_edges']:.4f} > {key} "
                        f"{p['lif_edges']:.4f}"
                    )
        out.append(
            f"{'MET' if not lose else 'NOT MET'}: {TITLES[name]}, every row: binpack's steps and "
            "LIF(edges) <= those of every sampler with the same budget (HydraGNN's, fairchem's, "
            "metatrain's)" + (": " + "; ".join(lose) if lose else "")
        )
    return out


#: the figures a sampler may be ahead of binpack on (lower is better), and their format
AHEAD = {
    "steps": ("steps", "d"),
    "lif_atoms": ("LIF atoms", ".4f"),
    "lif_edges": ("LIF edges", ".4f"),
    "lif_time": ("LIF time", ".4f"),
    "epoch": ("epoch", ".4g"),
}


def _why(key: str, figure: str, p: dict, b: dict, n: int) -> str:
    if key == "distributed" and p["largest"] > p["capacity"]:
        return f"its batches are over the budget (largest {p['largest']:.0f} atoms)"
    if p["dropped"] > b["dropped"]:
        return f"it leaves {p['dropped']:,} structures out"
    if b["repeated"]:
        return "too few structures for the ranks: both repeat some to fill them"
    if p["repeated"] >= 0.05 * n:
        return f"it repeats whole batches to fill the ranks ({p['repeated']:,} structures)"
    if figure == "lif_atoms":
        return (
            "binpack's bins are all full in atoms (its cost here) and each step takes bins even "
            "in edges (step_balance=edges), which the step time follows: their atoms differ a "
            "little"
        )
    if figure != "steps":
        return (
            "binpack balances atoms (its cost here) in bins all full at the budget: the bins "
            "differ in edges as the structures' densities do, as far as its steps cannot even "
            "them out"
        )
    return ""


def ahead(results: dict) -> tuple[list[str], list[str]]:
    """Every row where another sampler is ahead of binpack (a markdown table: data set, budget,
    ranks, sampler, figure, theirs, binpack's, why), and notes on planning time and memory.
    metatrain's rows are left out where they equal fairchem's."""
    lines = [
        "| data set | budget | ranks | sampler | figure | theirs | binpack | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    slower, larger = {}, {}
    for name, res in results.items():
        slower[name], larger[name] = {}, {}
        for (cap, w), g in _groups(res["rows"]).items():
            b = g.get("binpack", {})
            if not b.get("steps"):
                continue
            for key, p in g.items():
                if key == "binpack" or not p.get("steps"):
                    continue
                same = g.get("fairchem", {})
                if key == "metatrain" and all(p.get(f) == same.get(f) for f in AHEAD):
                    continue
                if p["plan_s"] < b["plan_s"]:
                    slower[name].setdefault(key, []).append((b["plan_s"], p["plan_s"]))
                if p["peak_mb"] is not None and p["peak_mb"] < b["peak_mb"]:
                    larger[name].setdefault(key, []).append((b["peak_mb"], p["peak_mb"]))
                for f, (label, fmt) in AHEAD.items():
                    theirs, ours = p.get(f), b.get(f)
                    if theirs is None or ours is None:
                        continue
                    if (f == "epoch" and theirs < ours * 0.999) or (
                        f != "epoch" and theirs < ours - 1e-4
                    ):
                        lines.append(
                            f"| {name} | {cap:g} | {w} | {SAMPLERS[key]} | {label} | "
                            f"{format(theirs, fmt)} | {format(ours, fmt)} | "
                            f"{_why(key, f, p, b, res['n'])} |"
                        )
    notes = []
    for name in results:
        for what, found, show in (
            ("plans faster", slower[name], fmt_time),
            ("plans in less memory", larger[name], lambda mb: f"{mb:.3g} MB"),
        ):
            for key, pairs in found.items():
                ours, theirs = zip(*pairs)
                notes.append(
                    f"{TITLES[name]}: {SAMPLERS[key]} {what} than binpack at {len(pairs)} of "
                    f"{len(_groups(results[name]['rows']))} rank counts and budgets (it "
                    f"{show(min(theirs))}-{show(max(theirs))}, binpack {show(min(ours))}-"
                    f"{show(max(ours))})"
                )
    return lines, notes


def summary(results: dict) -> list[str]:
    """Per data set: in how many rows binpack has the fewest steps and the shortest epoch of the
    samplers with a budget, and how much longer their epochs are."""
    out = []
    for name, res in results.items():
        groups = _groups(res["rows"])
        fewest = shortest = 0
        ratios = {k: [] for k in PEERS}
        for g in groups.values():
            b = g["binpack"]
            peers = [g[k] for k in PEERS if g.get(k, {}).get("steps")]
            fewest += all(b["steps"] <= p["steps"] for p in peers)
            shortest += all(b["epoch"] <= p["epoch"] * 1.001 for p in peers)
            for k in PEERS:
                if g.get(k, {}).get("vs_binpack"):
                    ratios[k].append(g[k]["vs_binpack"])
        spans = ", ".join(
            f"{SAMPLERS[k]}'s {min(v):.3f}-{max(v):.3f}x" for k, v in ratios.items() if v
        )
        out.append(
            f"{TITLES[name]}: binpack has the fewest steps of the samplers with a budget at "
            f"{fewest} of {len(groups)} rank counts and budgets and the shortest predicted epoch "
            f"(within 0.1 %) at {shortest}; their epochs over binpack's: {spans} (refusals left "
            "out)"
        )
    return out


def draw(results: dict, path: Path) -> None:
    """Predicted epoch by rank count, one line per sampler; a panel per data set and budget."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 2, figsize=(11, 3.4 * len(names)), squeeze=False)
    style = {
        "distributed": ("tab:red", "o"),
        "hydragnn": ("tab:green", "^"),
        "fairchem": ("tab:orange", "v"),
        "metatrain": ("tab:purple", "x"),
        "binpack": ("tab:blue", "s"),
    }
    for i, name in enumerate(names):
        rows = results[name]["rows"]
        caps = sorted({r["capacity"] for r in rows}, reverse=True)
        for j, cap in enumerate(caps):
            ax = axes[i][j]
            for key, label in SAMPLERS.items():
                pts = [
                    (r["ranks"], r["epoch"])
                    for r in rows
                    if r["key"] == key and r["capacity"] == cap and r.get("epoch")
                ]
                if pts:
                    xs, ys = zip(*pts)
                    color, marker = style[key]
                    ax.plot(xs, ys, color=color, marker=marker, label=label, alpha=0.85)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ranks = sorted({r["ranks"] for r in rows})
            ax.set_xticks(ranks)
            ax.set_xticklabels([str(w) for w in ranks], fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{TITLES[name]}, {cap:g} atoms", fontsize=9)
            ax.set_ylabel("predicted epoch (s)")
            if i == len(names) - 1:
                ax.set_xlabel("ranks")
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20k graphs, 60 structures a set")
    ap.add_argument("--graphs", type=int, help="Table-3 graphs (default: all 2,650,823)")
    ap.add_argument("--structures", type=int, help="structures per real set (default 3000)")
    ap.add_argument("--ranks", default=",".join(map(str, RANKS)), help="rank counts")
    ap.add_argument("--sets", default=",".join(SETS), help=f"data sets: {', '.join(SETS)}")
    ap.add_argument(
        "--data", help="where the real sets are made once (default: <out>/samplers_data)"
    )
    add_out_argument(ap)
    args = ap.parse_args(argv)
    n_req = args.graphs or (20_000 if args.quick else None)
    n_real = args.structures or (60 if args.quick else 3000)
    ranks = sorted({int(x) for x in args.ranks.split(",")})
    sets = [s for s in args.sets.split(",") if s]
    unknown = set(sets) - set(SETS)
    if unknown:
        ap.error(f"--sets: unknown {sorted(unknown)}; expected some of {', '.join(SETS)}")
    out = Path(args.out) if args.out not in (None, "-") else DEFAULT_OUT
    data = Path(args.data) if args.data else out / "samplers_data"
    cmd = command_line(argv)
    model, model_text = time_model()
    print("command:", cmd)
    print(model_text, flush=True)
    results, texts = {}, []
    for name in sets:
        if name == "table3":
            atoms, edges, text = table3(n_req, 2_000 if n_req is not None else 20_000)
        else:
            atoms, edges, text = real_set(name, data, n_real)
        caps = (float(CAPACITY), float(64 * math.ceil(atoms.max() / 64)))
        print(f"{name}: {text}", flush=True)
        rows = run_set(atoms, edges, caps, ranks, model)
        results[name] = {"rows": rows, "text": text, "n": len(atoms)}
        texts.append(f"{name}: {text}")
        lines = table(rows, timed=True)
        print("\n".join(["", f"{TITLES[name]} ({text})", *lines, ""]), flush=True)
    found = targets(results)
    print("Targets:\n" + "\n".join(f"- {t}" for t in found), flush=True)
    print("\n".join(summary(results)))
    behind, behind_notes = ahead(results)
    print("\n".join(["", "Where another sampler is ahead of binpack:", *behind, *behind_notes]))
    png = picture_path("samplers.png" if n_req is None else "samplers_quick.png", args.out)
    draw(results, png)
    caption = (
        "steps per epoch; padding = 1 - atoms / (batches x max(budget, largest batch)); LIF = sum "
        "of each step's slowest rank / sum of its mean rank, in atoms, edges and predicted time; "
        "dropped / repeated: structures an epoch leaves out / trains more than once; plan: wall "
        "time of one rank's plan of the epoch, best of 3 (our models of the peers, numpy; one "
        "core of a shared machine); "
        "peak: its peak memory (tracemalloc: numpy's and Python's allocations, not torch's "
        "randperm buffers); epoch: predicted (every step waits for its slowest rank, plus the "
        "all-reduce), and over binpack's"
    )
    tables = [
        markdown_table(name, table(res["rows"], timed=True), f"{TITLES[name]}. {caption}")
        for name, res in results.items()
    ]
    if len(behind) > 2:
        tables.append(
            markdown_table(
                "ahead",
                behind,
                "Every row where another sampler is ahead of binpack: a lower figure than "
                "binpack's (by more than 1e-4; an epoch by more than 0.1 %)",
            )
        )
    headline = {}
    t3 = {
        r["key"]: r
        for r in results.get("table3", {}).get("rows", [])
        if r["ranks"] == 740 and r["capacity"] == CAPACITY and r.get("vs_binpack")
    }
    for key in ("hydragnn", "fairchem"):
        if key in t3:
            ratio = round(t3[key]["vs_binpack"], 4)
            headline[f"epoch {key} / binpack (Table 3, 740 ranks)"] = ratio
    write_record(
        "samplers" if n_req is None and args.structures is None else "samplers_quick",
        "binpack against the peers' samplers: steps, balance and predicted epoch",
        tables,
        description="; ".join(texts)
        + f"; ranks {', '.join(map(str, ranks))}; budgets {CAPACITY} atoms and the largest "
        f"structure rounded up to 64; seed 0, epoch 0; {model_text}, plus the all-reduce of "
        f"{PARAMS:,} float32 gradients over {FABRIC}",
        headline=headline,
        notes=[
            *summary(results),
            "Planning times are of our models on a shared machine: indicative only.",
            "metatrain's sampler is a port of fairchem's: at seed 0 and epoch 0 the two give the "
            "same batches (its rows equal fairchem's).",
            *(f"Target {t}" for t in found),
            *behind_notes,
        ],
        picture=png,
        out=args.out,
        command=cmd,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
