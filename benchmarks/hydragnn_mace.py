"""HydraGNN's MACE stack trained with and without the plugins, 2 MPI ranks on this CPU, ratios in one run.

    flock /tmp/cfm-bench.lock env OMP_NUM_THREADS=1 .venv-hydragnn/bin/python -m benchmarks.hydragnn_mace

(``make bench-hydragnn-src``). Needs HydraGNN from source (``.venv-hydragnn``, ``make venv-hydragnn-src``).

Workload: the example ``examples/hydragnn/mace/`` (its train.py and config.json: ``MACEStack``,
hidden --hidden, 2 layers, correlation 3, max_ell 2, node_max_ell 1, float64, energy + forces
loss, ``batch_size`` --batch-size) on --n EMT structures of :mod:`cfm_plugins.datasets.clusters`
(molecules and metal clusters, 3 to --max-atoms atoms, energies and forces), 80 % of them for
training, under ``mpirun -np 2 cfm-run --enable hydragnn[,binpack][,fused]``. "stock" is
``--enable hydragnn`` alone: HydraGNN's DistributedSampler batches and its e3nn modules (cfm-run
provides the rendezvous and the step log, nothing else). Per configuration, from the step logs
of the last epoch: the training time of the epoch (per rank the sum over its steps of data
loading, forward with forces, backward and optimizer step; the slowest rank), the same in CPU
time of the training threads (what a rank computed, unaffected by other processes on a shared
machine), the steps, and the load imbalance factor of the compute time. Writes
docs/_fragments/hydragnn_mace.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cfm_plugins.testing import mpirun_command

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "hydragnn" / "mace"

CONFIGS = {"stock": "hydragnn", "binpack": "hydragnn,binpack", "fused": "hydragnn,fused",
           "both": "hydragnn,binpack,fused"}
REGIONS = ("dataload", "forward", "backward", "opt_step")


def epoch_times(ranks: list[list[dict]], epochs: int) -> dict:
    """Training time of the last epoch (wall and thread CPU, slowest rank), its steps and LIF."""
    from cfm_plugins.steplog import load_imbalance

    steps = len(ranks[0]) // epochs
    last = [rank[-steps:] for rank in ranks]
    wall = max(sum(r.get(f"{g}_s", 0.0) for r in rank for g in REGIONS) for rank in last)
    cpu = max(sum(r.get(f"{g}_cpu_s", 0.0) for r in rank for g in REGIONS) for rank in last)
    return dict(wall_s=wall, cpu_s=cpu, steps=steps, lif=load_imbalance(last, "compute_cpu_s"),
                lif_atoms=load_imbalance(last, "atoms"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100, help="structures (80 %% train, 10 %% validation, 10 %% test)")
    p.add_argument("--max-atoms", type=int, default=100)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--hidden", type=int, default=16, help="HydraGNN hidden_dim (channels)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default="/tmp/cfm_bench_hydragnn_mace")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from cfm_plugins.datasets.clusters import make_dataset
    from cfm_plugins.steplog import read_step_logs

    config = json.loads((EXAMPLE / "config.json").read_text())
    config["Dataset"].update(num_structures=args.n, max_atoms=args.max_atoms)
    config["NeuralNetwork"]["Architecture"]["hidden_dim"] = args.hidden
    config["NeuralNetwork"]["Training"].update(num_epoch=args.epochs, batch_size=args.batch_size)
    data = out / config["Dataset"]["path"]["total"]
    data.parent.mkdir(parents=True, exist_ok=True)
    graphs = make_dataset(args.n, seed=0, max_atoms=args.max_atoms, forces=True)
    torch.save(graphs, data)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    atoms = [g.num_nodes for g in graphs]
    print(f"command: {' '.join(['python -m benchmarks.hydragnn_mace'] + sys.argv[1:])}\nworkload: {args}; "
          f"{len(graphs)} graphs of {min(atoms)}..{max(atoms)} atoms (mean {sum(atoms) / len(atoms):.1f}); "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    mpirun = mpirun_command(2)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    rows = {}
    for label, enable in CONFIGS.items():
        steps = out / "steps" / label
        for f in steps.parent.glob(f"{label}.rank*.jsonl"):
            f.unlink()
        cmd = mpirun + [str(BIN / "cfm-run"), "--enable", enable, "-o", f"step_log={steps}", "--", str(sys.executable),
                        str(EXAMPLE / "train.py"), str(out / "config.json"), "--log", label]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=out)
        (out / f"{label}.log").write_text(res.stdout)
        if res.returncode != 0:
            print(res.stdout[-3000:])
            raise SystemExit(f"{label} failed (log: {out / label}.log)")
        rows[label] = dict(epoch_times(read_step_logs(str(steps)), args.epochs), run_s=time.perf_counter() - t0)
        r = rows[label]
        print(f"{label:8s} epoch {r['wall_s']:7.2f} s (cpu {r['cpu_s']:7.2f} s)  steps {r['steps']:3d}  "
              f"LIF {r['lif']:.3f} (atoms {r['lif_atoms']:.3f})  whole run {r['run_s']:.0f} s", flush=True)

    base = rows["stock"]
    lines = ["## HydraGNN MACE-stack training (benchmarks/hydragnn_mace.py)", "",
             f"Command: `flock /tmp/cfm-bench.lock env OMP_NUM_THREADS=1 .venv-hydragnn/bin/python -m "
             f"benchmarks.hydragnn_mace --n {args.n} --max-atoms {args.max_atoms} --epochs {args.epochs} "
             f"--hidden {args.hidden} --batch-size {args.batch_size}`", "",
             f"Workload: HydraGNN from source (d251f81) `MACEStack` as `examples/hydragnn/mace/` builds it "
             f"(hidden_dim {args.hidden}, 2 layers, correlation 3, max_ell 2, node_max_ell 1, float64, "
             f"energy + forces loss, AdamW), {args.n} EMT molecules and metal clusters of {min(atoms)}..{max(atoms)} "
             f"atoms (mean {sum(atoms) / len(atoms):.1f}), 80 % training, `batch_size` {args.batch_size}; "
             f"`mpirun -np 2 cfm-run --enable hydragnn[,binpack][,fused] -- python train.py config.json`, 2 MPI "
             f"ranks x 1 thread (gloo) on a shared 2-core CPU; last of {args.epochs} epochs. Epoch = the "
             "training steps of the slowest rank (data loading, forward with forces, backward, optimizer step); "
             "CPU = the same in CPU time of the training threads (other processes on the machine do not count).",
             "",
             "| configuration | epoch (s) | ratio to stock | epoch CPU (s) | CPU ratio | steps | LIF (compute CPU) | "
             "LIF (atoms) |", "|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['wall_s']:.2f} | {r['wall_s'] / base['wall_s']:.2f}x | {r['cpu_s']:.2f} | "
                     f"{r['cpu_s'] / base['cpu_s']:.2f}x | {r['steps']} | {r['lif']:.3f} | {r['lif_atoms']:.3f} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    (ROOT / "docs" / "_fragments").mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "_fragments" / "hydragnn_mace.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
