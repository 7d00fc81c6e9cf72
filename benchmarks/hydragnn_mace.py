"""HydraGNN's MACE stack trained with and without the plugins, 2 MPI ranks on this CPU, ratios in
one run.

    OMP_NUM_THREADS=1 .venv-hydragnn/bin/python -m benchmarks.hydragnn_mace [--n-train 80]
        [--out DIR]

(``make bench-hydragnn-src``; HydraGNN from source in ``.venv-hydragnn``, ``make
venv-hydragnn-src``.) Workload: the example ``examples/hydragnn/mace/`` (its train.py and
config.json: ``MACEStack``, hidden --hidden, 2 layers, correlation 3, float64, energy + forces
loss) on EMT molecules and metal clusters of :mod:`cfm_plugins.datasets.clusters`, under ``mpirun
-np 2 cfm-run --enable hydragnn[,binpack][,fused]`` (:data:`CONFIGS`, :func:`run_example`). Per
configuration, from the step logs of the last epoch (:func:`epoch_times`): the training time, its
CPU time, the steps and the load imbalance factor. Writes the record ``hydragnn_mace_cpu``
(:mod:`benchmarks.record`) to ``--out`` (default ``out/benchmarks/``); the runs, their logs and
data set go to ``--work``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.record import command_line, markdown_table, write_record
from benchmarks.training import config_table, parser, plugin_configs
from cfm_plugins.testing import BIN, mpirun_command

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hydragnn" / "mace"
#: stock, binpack, fused, both: "stock" is ``--enable hydragnn`` alone, HydraGNN's
#: DistributedSampler batches and its e3nn modules (cfm-run provides the rendezvous and the step
#: log, nothing else)
CONFIGS = plugin_configs("hydragnn")
REGIONS = ("dataload", "forward", "backward", "opt_step")


def epoch_times(ranks: list[list[dict]], epochs: int) -> dict:
    """Training time of the last epoch (wall and thread CPU, slowest rank), its steps and LIF.

    ``epoch_s``: per rank the sum over its steps of data loading, forward with forces, backward
    and optimizer step (:data:`REGIONS`), the slowest rank's; ``cpu_s``: the same in CPU time of
    the training threads (what a rank computed, unaffected by other processes on a shared
    machine), per step the slowest rank's, summed over the steps; ``lif`` and ``lif_atoms``: the
    load imbalance factor of the forward's CPU time and of the atoms."""
    from cfm_plugins.steplog import load_imbalance

    steps = len(ranks[0]) // epochs
    last = [rank[-steps:] for rank in ranks]
    wall = max(sum(r.get(f"{g}_s", 0.0) for r in rank for g in REGIONS) for rank in last)
    # ranks step together: the CPU time of a step is that of its slowest rank
    cpu = sum(
        max(sum(rank[s].get(f"{g}_cpu_s", 0.0) for g in REGIONS) for rank in last)
        for s in range(steps)
    )
    return dict(
        epoch_s=wall,
        cpu_s=cpu,
        steps=steps,
        lif=load_imbalance(last, "forward_cpu_s"),
        lif_atoms=load_imbalance(last, "atoms"),
    )


def run_example(out: Path, label: str, enable: str, env: dict) -> float:
    """``mpirun -np 2 cfm-run --enable ENABLE -o step_log=out/steps/LABEL -- python train.py
    out/config.json --log LABEL`` (the example's script) in ``out``, its output kept in
    ``out/LABEL.log``; the seconds it took. A failed run ends the benchmark."""
    cmd = mpirun_command(2) + [
        str(BIN / "cfm-run"),
        "--enable",
        enable,
        "-o",
        f"step_log={out / 'steps' / label}",
        "--",
        str(sys.executable),
        str(EXAMPLE / "train.py"),
        str(out / "config.json"),
        "--log",
        label,
    ]
    t0 = time.perf_counter()
    res = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=out
    )
    (out / f"{label}.log").write_text(res.stdout)
    if res.returncode != 0:
        print(res.stdout[-3000:])
        raise SystemExit(f"{label} failed (log: {out / label}.log)")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=100, work="/tmp/cfm_bench_hydragnn_mace")
    p.set_defaults(n_train=80, batch_size=8)
    p.add_argument("--hidden", type=int, default=16, help="HydraGNN hidden_dim (channels)")
    args = p.parse_args(argv)
    command = command_line(argv)
    n = math.ceil(
        args.n_train / 0.8
    )  # the example's perc_train: 80 % training, 10 % validation, 10 % test
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from cfm_plugins.datasets.clusters import make_dataset
    from cfm_plugins.steplog import read_step_logs

    # the example's config.json (MACEStack, 2 layers, correlation 3, max_ell 2, node_max_ell 1,
    # float64, energy + forces loss) with this run's data set (3 to --max-atoms atoms), hidden_dim,
    # epochs and batch_size
    config = json.loads((EXAMPLE / "config.json").read_text())
    config["Dataset"].update(num_structures=n, max_atoms=args.max_atoms)
    config["NeuralNetwork"]["Architecture"]["hidden_dim"] = args.hidden
    config["NeuralNetwork"]["Training"].update(num_epoch=args.epochs, batch_size=args.batch_size)
    data = out / config["Dataset"]["path"]["total"]
    data.parent.mkdir(parents=True, exist_ok=True)
    graphs = make_dataset(n, seed=0, max_atoms=args.max_atoms, forces=True)
    torch.save(graphs, data)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    atoms = [g.num_nodes for g in graphs]
    load = os.getloadavg()[0]  # the machine at the start (the record notes it with the figures)
    print(
        f"command: {command}\nworkload: {args}; {len(graphs)} graphs of {min(atoms)}..{max(atoms)} "
        f"atoms (mean {sum(atoms) / len(atoms):.1f}); load average {load:.1f}",
        flush=True,
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    rows = {}
    for label, enable in CONFIGS.items():
        steps = out / "steps" / label
        for f in steps.parent.glob(f"{label}.rank*.jsonl"):
            f.unlink()
        run_s = run_example(out, label, enable, env)
        rows[label] = dict(
            epoch_times(read_step_logs(str(steps)), args.epochs),
            run_s=run_s,
            load=os.getloadavg()[0],
        )
        r = rows[label]
        print(
            f"{label:8s} epoch {r['epoch_s']:7.2f} s (cpu {r['cpu_s']:7.2f} s)  steps "
            f"{r['steps']:3d}  LIF {r['lif']:.3f} (atoms {r['lif_atoms']:.3f})  whole run "
            f"{r['run_s']:.0f} s  load average {r['load']:.1f}",
            flush=True,
        )

    description = (
        "HydraGNN from source, MACEStack as examples/hydragnn/mace/ builds it (hidden_dim "
        f"{args.hidden}, 2 layers, correlation 3, max_ell 2, node_max_ell 1, float64, energy + "
        f"forces loss, AdamW), {n} EMT molecules and metal clusters of {min(atoms)}..{max(atoms)} "
        f"atoms (mean {sum(atoms) / len(atoms):.1f}), {args.n_train} of them for training, "
        f"batch_size {args.batch_size}; mpirun -np 2 cfm-run --enable hydragnn[,binpack][,fused] "
        f"-- python train.py config.json, 2 MPI ranks x 1 thread (gloo); last of {args.epochs} "
        "epochs. Epoch = the training steps of the slowest rank (data loading, forward with "
        "forces, backward, optimizer step); LIF of the forward's CPU time"
    )
    epochs = config_table(rows, "epoch (s, slowest rank)", "ratio to stock", speedup=False)
    base = rows["stock"]["cpu_s"]
    notes = [
        "The same epochs in CPU time of the training threads (per step the slowest rank's, "
        "summed: what the epoch costs without other processes on the machine): "
        + ", ".join(
            f"{label} {r['cpu_s']:.2f} s ({r['cpu_s'] / base:.2f}x)" for label, r in rows.items()
        )
        + ".",
        f"Load average (1 min) at the start {load:.1f}, after each configuration: "
        + ", ".join(f"{label} {r['load']:.1f}" for label, r in rows.items())
        + ". On a loaded machine the wall times include the time a rank waited for a core; "
        "the CPU times do not.",
    ]
    print("\n".join(["", f"Workload: {description}.", "", *epochs, "", *notes]), flush=True)
    write_record(
        "hydragnn_mace_cpu",
        "HydraGNN MACE-stack training on 2 CPU ranks",
        [
            markdown_table(
                "epoch",
                epochs,
                "the training steps of the last epoch (s, slowest rank), the time ratio to stock "
                "in the same run, steps per epoch, and the load imbalance factor of the forward's "
                "CPU time and of the atoms",
            )
        ],
        description=description,
        headline={
            "epoch time, binpack + fused / stock": (
                f"{rows['both']['epoch_s'] / rows['stock']['epoch_s']:.2f}x"
            )
        },
        notes=notes,
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
