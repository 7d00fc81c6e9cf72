"""NequIP training with and without the plugins, 2 MPI ranks on this CPU, ratios in one run.

    OMP_NUM_THREADS=1 .venv-nequip/bin/python -m benchmarks.nequip_train [--n-train 40]
        [--epochs 2] [--features 32] [--out DIR]

(``make bench-nequip``; NequIP lives in ``.venv-nequip``, ``make venv-nequip``.)

Workload: the example CuNi set (cfm_plugins.datasets.cuni: bulk, slabs, clusters up to --max-atoms
atoms, EMT labels), a NequIP GNN (cfm_plugins.datasets.nequip_config: --features channels, l_max 1,
--layers layers, r_max 4.0, float64, energy + forces loss), an unmodified `nequip-train` under
`mpirun -np 2 cfm-run --enable nequip[,binpack][,fused]` (:data:`CONFIGS`). Per configuration:
the training step time of the last epoch (slowest rank, summed over steps), steps per epoch, and
the load imbalance factor of the forward time and of the atoms. Writes the record
``nequip_train_cpu`` (:mod:`benchmarks.record`) to ``--out`` (default ``out/benchmarks/``); the
runs, their logs and data set go to ``--work``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.record import command_line, markdown_table, write_record
from benchmarks.training import config_table, parser, plugin_configs
from cfm_plugins.testing import BIN, mpirun_command

#: stock, binpack, fused, both: "stock" is ``--enable nequip`` alone (Lightning's
#: DistributedSampler over torch's DataLoader with ``batch_size`` structures, e3nn kernels; cfm-run
#: only provides the MPI rendezvous and the DDP Trainer settings)
CONFIGS = plugin_configs("nequip")


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=200, work="/tmp/cfm_bench_nequip")
    p.add_argument("--features", type=int, default=32, help="NequIP's channels")
    p.add_argument("--layers", type=int, default=3, help="NequIP's interaction layers")
    args = p.parse_args(argv)
    command = command_line(argv)
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config
    from cfm_plugins.steplog import load_imbalance, read_step_logs

    files = make_dataset(
        out / "data", n_train=args.n_train, n_valid=4, n_test=2, seed=0, max_atoms=args.max_atoms
    )
    write_config(
        out / "cfg" / "bench.yaml",
        train=files["train"],
        valid=files["valid"],
        epochs=args.epochs,
        features=args.features,
        l_max=1,
        layers=args.layers,
        batch_size=args.batch_size,
    )
    print(f"command: {command}\nworkload: {args}", flush=True)
    mpirun = mpirun_command(2)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    rows = {}
    for label, enable in CONFIGS.items():
        steps = out / f"{label}_steps"
        for f in out.glob(f"{label}_steps.rank*.jsonl"):
            f.unlink()
        cmd = mpirun + [
            str(BIN / "cfm-run"),
            "--enable",
            enable,
            "-o",
            f"step_log={steps}",
            "--",
            "nequip-train",
            "-cp",
            str(out / "cfg"),
            "-cn",
            "bench",
            f"hydra.run.dir={out / label}",
        ]
        res = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        (out / f"{label}.log").write_text(res.stdout)
        if res.returncode != 0:
            print(res.stdout[-3000:])
            raise SystemExit(f"{label} failed")
        ranks = [[r for r in rank if r["stage"] == "train"] for rank in read_step_logs(str(steps))]
        last = [[r for r in rank if r["epoch"] == args.epochs - 1] for rank in ranks]
        # LIF = sum_steps max_rank / sum_steps mean_rank of the forward (energy + forces) time
        # and of the atoms
        epoch_s = max(sum(r["wall_s"] for r in rank) for rank in last)
        rows[label] = dict(
            epoch_s=epoch_s,
            steps=len(last[0]),
            lif=load_imbalance(last),
            lif_atoms=load_imbalance(last, "atoms"),
        )
        print(
            f"{label:8s} epoch {epoch_s:7.2f} s  steps {len(last[0]):3d}  LIF "
            f"{rows[label]['lif']:.3f} (atoms {rows[label]['lif_atoms']:.3f})",
            flush=True,
        )

    from importlib.metadata import version

    description = (
        f"{args.n_train} CuNi structures (up to {args.max_atoms} atoms, EMT), NequIP GNN "
        f"{args.features} features, l_max 1, {args.layers} layers, r_max 4.0, float64, energy + "
        f"forces loss, batch_size {args.batch_size}; unmodified nequip-train "
        f"{version('nequip')} under mpirun -np 2 cfm-run, 2 MPI ranks x 1 thread (gloo); last "
        f"of {args.epochs} epochs"
    )
    epochs = config_table(
        rows, "training steps per epoch (s, slowest rank)", "ratio to stock", speedup=False
    )
    print("\n".join(["", f"Workload: {description}.", "", *epochs]), flush=True)
    write_record(
        "nequip_train_cpu",
        "NequIP training on 2 CPU ranks",
        [
            markdown_table(
                "epoch",
                epochs,
                "the training steps of the last epoch (s, slowest rank), the time ratio to stock "
                "in the same run, steps per epoch, and the load imbalance factor of the forward "
                "time and of the atoms",
            )
        ],
        description=description,
        headline={
            "epoch time, binpack + fused / stock": (
                f"{rows['both']['epoch_s'] / rows['stock']['epoch_s']:.2f}x"
            )
        },
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
