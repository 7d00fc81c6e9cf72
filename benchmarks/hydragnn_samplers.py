"""HydraGNN's own node-budget sampler against binpack at the same node budget, 2 MPI ranks.

    OMP_NUM_THREADS=1 .venv-hydragnn/bin/python -m benchmarks.hydragnn_samplers [--quick]
        [--n-train 160] [--max-nodes N] [--rounds 3] [--out DIR]

Needs HydraGNN from source (``.venv-hydragnn``). examples/hydragnn/mace/ with the config's
``NeuralNetwork.Training.Batching: {mode: node_budget, max_nodes: N}`` (default N: batch size x
the mean graph's atoms), under ``mpirun -np 2 cfm-run --enable hydragnn`` (HydraGNN's
``DistributedCostAwareBatchSampler``) and ``--enable hydragnn,binpack`` (binpack, capacity N
atoms from that key), alternating for ``--rounds`` rounds. Per run, over the epochs after the
first: epoch time (slowest rank, step logs), its thread CPU time, steps, the LIF of the ranks'
per-step compute CPU time and of their atoms, graphs trained per epoch. Medians over the rounds,
ratios binpack / HydraGNN's; record ``hydragnn_samplers_cpu`` (``--quick``: a tiny model and data
set, ``hydragnn_samplers_quick``) to ``--out``.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
from pathlib import Path

from benchmarks.hydragnn_mace import EXAMPLE, REGIONS, run_example
from benchmarks.record import command_line, table, write_record
from benchmarks.training import parser

SAMPLERS = {"HydraGNN": "hydragnn", "binpack": "hydragnn,binpack"}
QUICK = dict(n_train=16, max_atoms=24, hidden=4, layers=1, epochs=2, rounds=1)


def hydragnn_epoch_steps(trainset, budget: int, epochs: int) -> list[int]:
    """Steps per epoch of HydraGNN's sampler as its ``create_dataloaders`` builds it on 2 ranks
    (its defaults: seed 0, shuffled, batches padded to a multiple of the ranks)."""
    from hydragnn.preprocess.batch_sampler import DistributedCostAwareBatchSampler

    sampler = DistributedCostAwareBatchSampler(
        trainset, budget, num_replicas=2, rank=0, pad_batches=True, shuffle=True, seed=0
    )
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append(len(sampler))
    return out


def split_epochs(ranks: list[list[dict]], lengths: list[int] | None) -> list[list[list[dict]]]:
    """Each rank's steps cut into epochs: by the records' ``epoch`` (binpack), else ``lengths``."""
    if lengths is None:
        epochs = sorted({rec["epoch"] for rec in ranks[0]})
        return [[[rec for rec in r if rec["epoch"] == e] for r in ranks] for e in epochs]
    if sum(lengths) != len(ranks[0]):
        raise SystemExit(f"step log has {len(ranks[0])} steps, HydraGNN's sampler {lengths}")
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    return [[r[s : s + n] for r in ranks] for s, n in zip(starts, lengths)]


def measure(epochs: list[list[list[dict]]], n_train: int) -> dict:
    """Means over the epochs after the first: epoch time (wall, slowest rank; thread CPU, per step
    the slowest rank's), steps, graphs trained and repeated; LIF over all their steps."""
    from cfm_plugins.steplog import load_imbalance

    kept = epochs[1:] or epochs
    wall, cpu, seen, repeated = [], [], [], []
    for ranks in kept:
        wall.append(max(sum(rec[f"{g}_s"] for rec in r for g in REGIONS) for r in ranks))
        cpu.append(
            sum(
                max(sum(r[s][f"{g}_cpu_s"] for g in REGIONS) for r in ranks)
                for s in range(len(ranks[0]))
            )
        )
        ids = [i for r in ranks for rec in r for i in rec["ids"]]
        seen.append(len(ids))
        repeated.append(len(ids) - len(set(ids)))
        if len(set(ids)) != n_train:
            raise SystemExit(f"an epoch trained {len(set(ids))} of the {n_train} graphs")
    steps = [[rec for e in kept for rec in e[k]] for k in range(len(kept[0]))]
    return dict(
        epoch_s=statistics.fmean(wall),
        cpu_s=statistics.fmean(cpu),
        steps=statistics.fmean(len(e[0]) for e in kept),
        lif=load_imbalance(steps, "compute_cpu_s"),
        lif_atoms=load_imbalance(steps, "atoms"),
        graphs=statistics.fmean(seen),
        repeated=statistics.fmean(repeated),
        max_atoms=max(rec["atoms"] for r in steps for rec in r),
    )


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=100, work="/tmp/cfm_bench_hydragnn_samplers")
    p.set_defaults(n_train=160, batch_size=8, epochs=3)
    p.add_argument("--hidden", type=int, default=16, help="HydraGNN hidden_dim (channels)")
    p.add_argument("--layers", type=int, default=2, help="HydraGNN num_conv_layers")
    p.add_argument("--max-nodes", type=int, default=None, help="the node budget (max_nodes)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each sampler, alternating")
    p.add_argument("--quick", action="store_true", help="a tiny model and data set, one round")
    args = p.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    command = command_line(argv)
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from hydragnn.preprocess.load_data import split_dataset

    from cfm_plugins.datasets.clusters import make_dataset
    from cfm_plugins.steplog import read_step_logs

    n = math.ceil(args.n_train / 0.8)  # the example's perc_train
    graphs = make_dataset(n, seed=0, max_atoms=args.max_atoms, forces=True)
    for i, g in enumerate(graphs):
        g.idx = torch.tensor([i])  # the step logs name each batch's graphs
    random.seed(0)  # train.py's split (--seed 0)
    trainset = split_dataset(graphs, 0.8, False)[0]
    atoms = [g.num_nodes for g in trainset]
    budget = args.max_nodes or max(math.ceil(args.batch_size * statistics.fmean(atoms)), max(atoms))
    config = json.loads((EXAMPLE / "config.json").read_text())
    arch = config["NeuralNetwork"]["Architecture"]
    arch.update(hidden_dim=args.hidden, num_conv_layers=args.layers)
    arch["output_heads"]["node"]["dim_headlayers"] = [args.hidden] * 2
    if args.quick:
        arch.update(max_ell=1, correlation=2)
    config["NeuralNetwork"]["Training"].update(
        num_epoch=args.epochs,
        batch_size=args.batch_size,
        Batching={"mode": "node_budget", "max_nodes": budget},
    )
    data = out / config["Dataset"]["path"]["total"]
    data.parent.mkdir(parents=True, exist_ok=True)
    torch.save(graphs, data)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    lengths = hydragnn_epoch_steps(trainset, budget, args.epochs)
    load = os.getloadavg()[0]
    print(
        f"command: {command}\nworkload: {args}; {len(trainset)} training graphs of "
        f"{min(atoms)}..{max(atoms)} atoms (mean {statistics.fmean(atoms):.1f}); node budget "
        f"{budget}; load average {load:.1f}",
        flush=True,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    runs: dict[str, list[dict]] = {label: [] for label in SAMPLERS}
    for k in range(args.rounds):
        order = list(SAMPLERS) if k % 2 == 0 else list(SAMPLERS)[::-1]
        for label in order:
            tag = f"{label}{k}"
            run_s = run_example(out, tag, SAMPLERS[label], env)
            steps = out / "steps" / tag
            cut = split_epochs(read_step_logs(str(steps)), lengths if label == "HydraGNN" else None)
            r = dict(measure(cut, len(trainset)), run_s=run_s)
            r["load"] = os.getloadavg()[0]
            runs[label].append(r)
            print(
                f"{tag:10s} epoch {r['epoch_s']:6.2f} s (cpu {r['cpu_s']:6.2f} s)  steps "
                f"{r['steps']:5.1f}  LIF {r['lif']:.3f} (atoms {r['lif_atoms']:.3f})  graphs "
                f"{r['graphs']:.0f} ({r['repeated']:.0f} repeated)  largest batch "
                f"{r['max_atoms']} atoms  run {r['run_s']:.0f} s  load {r['load']:.1f}",
                flush=True,
            )

    def med(label, key):
        return statistics.median(r[key] for r in runs[label])

    base = {key: med("HydraGNN", key) for key in ("epoch_s", "cpu_s")}
    rows = [
        [
            label,
            f"{med(label, 'epoch_s'):.2f}",
            f"{med(label, 'epoch_s') / base['epoch_s']:.2f}x",
            f"{med(label, 'cpu_s'):.2f}",
            f"{med(label, 'cpu_s') / base['cpu_s']:.2f}x",
            f"{med(label, 'steps'):.1f}",
            f"{med(label, 'lif'):.3f}",
            f"{med(label, 'lif_atoms'):.3f}",
            f"{med(label, 'graphs'):.0f} ({med(label, 'repeated'):.0f})",
        ]
        for label in SAMPLERS
    ]
    columns = [
        "sampler",
        "epoch (s, slowest rank)",
        "ratio",
        "epoch CPU (s)",
        "CPU ratio",
        "steps",
        "LIF (compute CPU)",
        "LIF (atoms)",
        "graphs (repeated)",
    ]
    import hydragnn

    source = Path(hydragnn.__file__).resolve().parents[1].name  # the source tree, HydraGNN-<commit>
    description = (
        f"HydraGNN from source ({source}), MACEStack as examples/hydragnn/mace/ builds it "
        f"(hidden_dim {args.hidden}, num_conv_layers {args.layers}, float64, energy + forces "
        "loss), "
        f"{len(trainset)} EMT molecules and metal clusters of {min(atoms)}..{max(atoms)} atoms "
        f"for training, NeuralNetwork.Training.Batching {{mode: node_budget, max_nodes: "
        f"{budget}}}; mpirun -np 2 cfm-run --enable hydragnn[,binpack] -- python train.py "
        f"config.json, 2 MPI ranks x 1 thread (gloo): HydraGNN's DistributedCostAwareBatchSampler "
        f"against binpack at the same budget (capacity from max_nodes), {args.rounds} runs each, "
        f"alternating; per run the mean over epochs 2..{args.epochs}, then the median over runs"
    )
    notes = [
        "Epoch = per rank the sum over its steps of data loading, forward with forces, backward "
        "and optimizer step (slowest rank); epoch CPU = per step the slowest rank's thread CPU "
        "time, summed; LIF = per step max/mean over ranks of the compute CPU time (forward start "
        "to end of backward), summed over the steps; graphs = graphs trained per epoch over both "
        "ranks (in brackets: repeated in that epoch).",
        "Each run's epoch CPU time (s) and LIF (compute CPU), round by round: "
        + "; ".join(
            f"{label} " + ", ".join(f"{r['cpu_s']:.2f} / {r['lif']:.3f}" for r in runs[label])
            for label in SAMPLERS
        )
        + ".",
        f"Load average (1 min) at the start {load:.1f}; after each run: "
        + ", ".join(f"{label} {r['load']:.1f}" for label in SAMPLERS for r in runs[label])
        + ". On a shared machine the wall times include waits for a core; the CPU times do not.",
    ]
    lines = [" | ".join(columns), *(" | ".join(map(str, r)) for r in rows)]
    print("\n".join(["", f"Workload: {description}.", "", *lines, "", *notes]), flush=True)
    write_record(
        "hydragnn_samplers_quick" if args.quick else "hydragnn_samplers_cpu",
        "HydraGNN's node-budget sampler against binpack, 2 CPU ranks",
        [
            table(
                "samplers",
                columns,
                rows,
                "epoch time and its thread CPU time (s; ratio to HydraGNN's sampler in the same "
                "run), steps per epoch, the load imbalance factor of the ranks' compute CPU time "
                "and of their atoms, graphs trained per epoch (repeated)",
            )
        ],
        description=description,
        headline={
            "epoch time, binpack / HydraGNN's sampler": f"{rows[1][2]}",
            "LIF (compute CPU), HydraGNN's sampler -> binpack": f"{rows[0][6]} -> {rows[1][6]}",
        },
        notes=notes,
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
