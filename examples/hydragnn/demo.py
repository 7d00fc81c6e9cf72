"""HydraGNN on 2 MPI ranks with and without binpack: the load imbalance factor of each (`make
demo-hydragnn`).

    python examples/hydragnn/demo.py [--epochs 3] [--cost edges,auto] [--seeds 1]   # or --help

1. make the EMT set of molecules and metal clusters (3-300 atoms) when it is missing;
2. train HydraGNN (``train.py`` and ``config.json`` beside this file) under ``mpirun -np 2
   cfm-run --enable hydragnn`` (HydraGNN's own DistributedSampler batches) and ``--enable
   hydragnn,binpack`` once per ``--cost`` (default ``edges,auto``), all with ``step_log``;
3. print each run's load imbalance factors (LIF), steps, graphs per step, epoch losses and
   ``cost=auto`` fits (:func:`summarize`); draw the first steps of the stock and the first binpack
   run as batches.png.

Outputs in examples/hydragnn/out/ (``summary.json``, ``batches.png``, the step logs, HydraGNN's
logs/). ``--seeds N`` repeats every run with other training-set orders and packing seeds.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cfm_plugins.testing import at_least, clean_env, demo_costs, mpirun_command

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


# glibc's malloc hands large freed blocks back to the kernel (mmap/munmap, heap trimming); with
# batches of a different size at every step, each step then page-faults its tensors in afresh, at
# times that differ between ranks: a jitter of several ms per step on CPU, as large as the
# imbalance being measured. Keeping freed memory in the process (what jemalloc and tcmalloc do, and
# what PyTorch's CPU tuning guide recommends them for) removes it. Both runs get the same setting.
STEADY_MALLOC = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def run_env(steady_malloc: bool = True) -> dict:
    env = clean_env()
    if steady_malloc:
        env.setdefault("GLIBC_TUNABLES", STEADY_MALLOC)
    return env


def train(
    out: Path,
    label: str,
    enable: str,
    config: Path,
    np_: int,
    options: list[str],
    seed: int,
    env: dict,
) -> dict:
    steps = out / "steps" / label
    cmd = mpirun_command(np_) + [
        str(BIN / "cfm-run"),
        "--enable",
        enable,
        "-o",
        f"step_log={steps}",
        *options,
        "--",
        "python",
        str(HERE / "train.py"),
        str(config),
        "--log",
        f"demo_{label}",
        "--seed",
        str(seed),
    ]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out, env=env
    )
    wall = time.perf_counter() - t0
    (out / f"{label}.log").write_text(res.stdout)
    if res.returncode != 0:
        print(res.stdout[-4000:])
        raise SystemExit(
            f"{label} run failed (exit {res.returncode}); log: {out / (label + '.log')}"
        )
    losses = [float(x) for x in re.findall(r"Epoch: \d+, Train Loss: ([0-9.eE+-]+)", res.stdout)]
    cap = re.search(
        r"binpack train: \d+ steps? on each of \d+ ranks, capacity ([0-9.]+)", res.stdout
    )
    return {
        "wall_s": wall,
        "train_losses": losses,
        "capacity": float(cap.group(1)) if cap else None,
        "steps_path": str(steps),
    }


def summarize(ranks: list[list[dict]], epochs: int) -> dict:
    """The figures of one run from its step logs (``ranks``: each rank's records, from HydraGNN's
    own trace regions): the LIF of the compute time per step (forward + backward up to the gradient
    all-reduce; max over ranks / mean, summed over steps), over all steps but the first 3 (one-off
    costs) and over the epochs after the first (the ones ``cost=auto`` plans with its fit), the LIF
    of the forward alone and of HydraGNN's whole backward region (which contains the all-reduce
    wait), steps per rank per epoch and graphs per step."""
    from cfm_plugins.steplog import epoch_imbalance, load_imbalance

    per_rank = [len(r) for r in ranks]
    per_epoch = per_rank[0] // epochs
    skip = min(per_epoch, 3)  # the first steps pay one-off costs (allocation, DDP bucket rebuild)
    graphs = np.array([s["graphs"] for r in ranks for s in r])
    atoms = np.array([[s["atoms"] for s in r[: min(per_rank)]] for r in ranks])
    # binpack's records name their epoch; HydraGNN's own batches are the same count every epoch
    later = [
        [s for k, s in enumerate(r) if s.get("epoch", k // max(per_epoch, 1)) >= 1] for r in ranks
    ]
    return {
        "steps_per_rank": per_rank,
        "steps_per_epoch": per_epoch,
        "lif_compute": load_imbalance(ranks, "compute_s", skip),
        "lif_compute_cpu": load_imbalance(ranks, "compute_cpu_s", skip),
        "lif_compute_cpu_after_epoch0": load_imbalance(later, "compute_cpu_s")
        if epochs > 1
        else float("nan"),
        "lif_forward": load_imbalance(ranks, "forward_s", skip),
        "lif_backward_region": load_imbalance(ranks, "backward_s", skip),
        "lif_epoch_compute": epoch_imbalance(ranks, "compute_s", skip),
        "lif_atoms": float(atoms.max(axis=0).sum() / atoms.mean(axis=0).sum()),
        "mean_graphs_per_step": float(graphs.mean()),
        "compute_s_per_rank": [float(sum(s["compute_s"] for s in r)) for r in ranks],
    }


def auto_fits(steps_path: str) -> list[dict]:
    """The cost=auto fits of a run, as its step log recorded them (rank 0's)."""
    from cfm_plugins.steplog import read_step_events

    return read_step_events(steps_path)[0]


def cost_options(kind: str, stock_steps: str) -> list[str]:
    """binpack's cost options (``auto``: fitted by binpack on the run's own first epoch);
    ``calibrated`` fits the stock run's own step timings (HydraGNN's trace regions, thread CPU
    time of forward + backward) as c0 + a*atoms + b*edges with all three coefficients >= 0
    (:func:`cfm_plugins.sampler.fit_linear_cost`: the atoms and edges of random batches are
    nearly collinear, and an unconstrained fit can give a negative coefficient), then uses atoms
    + (b/a)*edges, or the one count left when the other coefficient is 0."""
    if kind != "calibrated":
        return ["-o", f"cost={kind}"]
    from cfm_plugins.sampler import fit_linear_cost
    from cfm_plugins.steplog import read_step_logs

    recs = [r for rank in read_step_logs(stock_steps) for r in rank[3:]]
    # with an intercept: the fixed cost of a step (paid by every rank alike) must not leak into a, b
    fit = fit_linear_cost(
        [r["atoms"] for r in recs],
        [r["edges"] for r in recs],
        [r["compute_cpu_s"] for r in recs],
        intercept=True,
    )
    a, b = fit
    print(
        f"calibrated on {len(recs)} stock steps: compute ~ {fit.c0:.3g} s + {a:.3g} s/atom + "
        f"{b:.3g} s/edge (R^2 {fit.r2:.3f})"
    )
    if a <= 0 and b <= 0:
        raise SystemExit(
            "calibration failed: step time does not grow with atoms or edges in the stock run"
        )
    if a <= 0 or b <= 0:
        return ["-o", f"cost={'edges' if a <= 0 else 'atoms'}"]
    return ["-o", "cost=linear", "-o", "cost_a=1", "-o", f"cost_b={b / a:.6g}"]


def draw_batches(
    out: Path, config: dict, data_path: Path, np_: int, capacity: float, cost: dict
) -> str:
    """Epoch 0 of both runs, rebuilt exactly: HydraGNN's DistributedSampler batches and the binpack
    plan."""
    import hydragnn
    import torch
    from torch.utils.data.distributed import DistributedSampler

    from cfm_plugins.sampler import BinPackBatchSampler, graph_costs, plot_batches
    from cfm_plugins.sampler.packing import Packing

    dataset = torch.load(data_path, weights_only=False)
    trainset, _, _ = hydragnn.preprocess.split_dataset(
        dataset, config["NeuralNetwork"]["Training"]["perc_train"], False
    )
    atoms = np.array([g.num_nodes for g in trainset])
    edges = np.array([g.edge_index.shape[1] for g in trainset])
    costs = graph_costs(atoms, edges, **cost)
    bs = config["NeuralNetwork"]["Training"]["batch_size"]
    per_rank = []
    for r in range(np_):
        s = DistributedSampler(trainset, num_replicas=np_, rank=r, seed=0)
        s.set_epoch(0)
        idx = list(s)
        per_rank.append([idx[i : i + bs] for i in range(0, len(idx), bs)])
    bins = [b for step in zip(*per_rank) for b in step]
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in bins])])
    stock = Packing(np.concatenate(bins), offsets, world_size=np_)
    plan = BinPackBatchSampler(costs, capacity, rank=0, world_size=np_, seed=0).plan()
    label = (
        cost["kind"]
        if cost["kind"] != "linear"
        else f"{cost['a']:g} x atoms + {cost['b']:g} x edges"
    )
    return plot_batches(
        plan,
        costs,
        np_,
        out / "batches.png",
        steps=range(4),
        baseline=stock,
        capacity=capacity,
        titles=(
            f"HydraGNN DistributedSampler, {bs} graphs per batch",
            f"binpack, capacity {capacity:g}",
        ),
        cost_label=label,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(HERE / "out"))
    p.add_argument("--epochs", type=at_least(1), default=3)
    p.add_argument("--np", type=at_least(1), default=2)
    p.add_argument("--num", type=int, default=400, help="structures in the data set")
    p.add_argument(
        "--cost",
        default="edges,auto",
        help="binpack costs to run, comma-separated, each against the same stock run "
        "(edges: EGNN's forward grows with the edge count; auto: fitted by binpack on the run's "
        "own first epoch; calibrated: atoms + b*edges with a, b >= 0 fitted offline on the "
        "stock run's step timings)",
    )
    p.add_argument(
        "--seeds",
        type=at_least(1),
        default=1,
        help="repeat every run with this many training-set orders (and binpack packing seeds): "
        "spread of the LIF and of the losses",
    )
    p.add_argument(
        "--cost-b",
        type=float,
        default=None,
        help="use cost = atoms + COST_B * edges (binpack's linear cost) instead of --cost",
    )
    p.add_argument(
        "--max-tokens",
        type=at_least(0, float, above=True),
        default=None,
        help="bin capacity (default: batch size x mean cost)",
    )
    p.add_argument(
        "--default-malloc",
        action="store_true",
        help=f"leave glibc's malloc as it is "
        f"(default: GLIBC_TUNABLES={STEADY_MALLOC}, for every run)",
    )
    args = p.parse_args(argv)
    kinds = (
        ["linear"]
        if args.cost_b is not None
        else demo_costs(p, args.cost, ("edges", "atoms", "auto", "calibrated"))
    )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    config = json.loads((HERE / "config.json").read_text())
    config.pop("cfm_plugins", None)  # the runs below name their plugins with --enable
    config["NeuralNetwork"]["Training"]["num_epoch"] = args.epochs
    data_path = out / "dataset" / "clusters.pt"
    config["Dataset"]["path"]["total"] = str(data_path)
    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps(config, indent=2))

    print(f"[1/3] data set: {data_path}", flush=True)
    if not data_path.exists():
        import torch

        from cfm_plugins.datasets.clusters import make_dataset

        data_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(make_dataset(args.num, seed=0), data_path)

    env = run_env(steady_malloc=not args.default_malloc)
    print(
        f"[2/3] HydraGNN ({config['NeuralNetwork']['Architecture']['model_type']}) on {args.np} "
        f"ranks, {args.epochs} epochs, stock and binpack with cost {', '.join(kinds)}; "
        f"GLIBC_TUNABLES={env.get('GLIBC_TUNABLES', '(unset)')}",
        flush=True,
    )
    common = ["-o", f"max_tokens={args.max_tokens}"] if args.max_tokens is not None else []
    runs, options = {}, {}
    for seed in range(args.seeds):
        tag = "" if seed == 0 else f"_seed{seed}"
        runs["stock" + tag] = train(
            out, "stock" + tag, "hydragnn", cfg_path, args.np, [], seed, env
        )
        for kind in kinds:
            if kind not in options:
                options[kind] = (
                    ["-o", "cost=linear", "-o", "cost_a=1", "-o", f"cost_b={args.cost_b}"]
                    if kind == "linear"
                    else cost_options(kind, runs["stock"]["steps_path"])
                )
                print(f"binpack {kind}:", " ".join(options[kind][1::2]), flush=True)
            runs[kind + tag] = train(
                out,
                kind + tag,
                "hydragnn,binpack",
                cfg_path,
                args.np,
                common + options[kind] + ["-o", f"seed={seed}"],
                seed,
                env,
            )

    from cfm_plugins.steplog import read_step_logs

    for label, run in runs.items():
        run.update(summarize(read_step_logs(run["steps_path"]), args.epochs))
        if label.split("_")[0] == "auto":
            run["fits"] = auto_fits(run["steps_path"])
    print(
        "[3/3] results (LIF: max over ranks / mean, per step, summed over steps; cpu = thread CPU "
        "time of forward + backward, compute = wall time of forward + backward up to the "
        "all-reduce; 'cpu e1+' = the epochs after the first, those cost=auto plans with its fit)",
        flush=True,
    )
    print(
        f"{'':16s} {'LIF cpu':>8s} {'cpu e1+':>8s} {'LIF compute':>12s} {'LIF forward':>12s} "
        f"{'LIF bwd region':>15s} {'LIF atoms':>10s} {'steps/epoch':>12s} {'graphs/step':>12s}  "
        "train loss per epoch"
    )
    for label, r in runs.items():
        print(
            f"{label:16s} {r['lif_compute_cpu']:8.3f} {r['lif_compute_cpu_after_epoch0']:8.3f} "
            f"{r['lif_compute']:12.3f} {r['lif_forward']:12.3f} {r['lif_backward_region']:15.3f} "
            f"{r['lif_atoms']:10.3f} {r['steps_per_epoch']:12d} {r['mean_graphs_per_step']:12.2f}  "
            f"{', '.join(f'{x:.4f}' for x in r['train_losses'])}"
        )
    for label, r in runs.items():
        for fit in r.get("fits", []):
            f = fit["fit"]
            terms = " + ".join(
                f"{v:.3g} s/{n}"
                for n, v in (("atom", f["a"]), ("edge", f["b"]), ("graph", f["g"]))
                if v
            )
            print(
                f"{label} fit from epoch {fit['from_epoch']}: {f['c0']:.3g} s + {terms} "
                f"({f['clock']}, {f['steps']} steps, R^2 {f['r2']:.3f}); LIF measured "
                f"{fit['lif_measured']:.3f}, predicted for the new plan {fit['lif_predicted']:.3f}"
            )
    if args.seeds > 1:
        for kind in ["stock"] + kinds:
            of_kind = [r for k, r in runs.items() if k.split("_")[0] == kind]
            last = [r["train_losses"][-1] for r in of_kind]
            lif = [r["lif_compute_cpu"] for r in of_kind]
            later = [r["lif_compute_cpu_after_epoch0"] for r in of_kind]
            print(
                f"{kind} over {args.seeds} seeds: LIF cpu median {np.median(lif):.3f} (min "
                f"{min(lif):.3f}, max {max(lif):.3f}); epochs 1+ median {np.median(later):.3f} "
                f"(min {min(later):.3f}, max {max(later):.3f}); final train loss mean "
                f"{np.mean(last):.4f} (min {min(last):.4f}, max {max(last):.4f})"
            )
    first = next((k for k in kinds if k != "auto"), None)
    if first is not None:
        opts = dict(o.split("=", 1) for o in options[first][1::2])
        cost = {
            "kind": opts.get("cost", "atoms"),
            "a": float(opts.get("cost_a", 1)),
            "b": float(opts.get("cost_b", 0)),
        }
        png = draw_batches(out, config, data_path, args.np, runs[first]["capacity"], cost)
        runs[first]["cost"] = cost
        print(f"batches: {png}")
    (out / "summary.json").write_text(json.dumps(runs, indent=2))
    print(f"summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
