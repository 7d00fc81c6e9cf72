"""NequIP training with and without the plugins, 2 MPI ranks on this CPU, ratios in one run.

    .venv-nequip/bin/python benchmarks/nequip_train.py [--n-train 40] [--epochs 2] [--features 32]

Workload: the example CuNi set (cfm_plugins.datasets.cuni: bulk, slabs, clusters up to --max-atoms
atoms, EMT labels), a NequIP GNN (cfm_plugins.datasets.nequip_config: --features channels, l_max 1,
--layers layers, r_max 4.0, float64, energy + forces loss), an unmodified `nequip-train` under
`mpirun -np 2 cfm-run --enable nequip[,binpack][,fused]`. "stock" is `--enable nequip` alone
(Lightning's DistributedSampler over torch's DataLoader with `batch_size` structures, e3nn
kernels; cfm-run only provides the MPI rendezvous and the DDP Trainer settings). Per
configuration: the training step time of the last epoch (slowest rank, summed over steps), steps
per epoch, and the load imbalance factor LIF = sum_steps max_rank / sum_steps mean_rank of the
forward (energy + forces) time and of the atoms. Writes docs/_fragments/nequip_train.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.training import config_table, parser, plugin_configs, write_fragment
from cfm_plugins.testing import BIN, mpirun_command

CONFIGS = plugin_configs("nequip")


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=200, out="/tmp/cfm_bench_nequip")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--layers", type=int, default=3)
    args = p.parse_args(argv)
    out = Path(args.out)
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
    print(
        f"command: {' '.join([Path(sys.argv[0]).name] + sys.argv[1:])}\nworkload: {args}",
        flush=True,
    )
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
        epoch_s = max(sum(r["wall_s"] for r in rank) for rank in last)
        rows[label] = dict(
            epoch_s=epoch_s,
            steps=len(last[0]),
            lif=load_imbalance(last),
            lif_atoms=load_imbalance(last, "atoms"),
        )
        print(
            f"{label:8s} epoch {epoch_s:7.2f} s  steps {len(last[0]):3d}  LIF "
            f"{rows[label]['lif']:.3f} "
            f"(atoms {rows[label]['lif_atoms']:.3f})",
            flush=True,
        )

    lines = [
        "## NequIP training (benchmarks/nequip_train.py)",
        "",
        "Command: `OMP_NUM_THREADS=1 .venv-nequip/bin/python benchmarks/nequip_train.py --n-train "
        f"{args.n_train} "
        f"--max-atoms {args.max_atoms} --epochs {args.epochs} --features {args.features} --layers "
        f"{args.layers} "
        f"--batch-size {args.batch_size}`",
        "",
        f"Workload: {args.n_train} CuNi structures (up to {args.max_atoms} atoms, EMT), NequIP GNN "
        f"{args.features} features, l_max 1, {args.layers} layers, r_max 4.0, float64, energy + "
        "forces loss, "
        f"`batch_size: {args.batch_size}`; unmodified nequip-train 0.19.1 under `mpirun -np 2 "
        "cfm-run`, "
        f"2 MPI ranks x 1 thread (gloo) on a shared 2-core CPU; last of {args.epochs} epochs.",
        "",
    ]
    lines += config_table(
        rows, "training steps per epoch (s, slowest rank)", "ratio to stock", speedup=False
    )
    lines.append("")
    return write_fragment("nequip_train", lines)


if __name__ == "__main__":
    sys.exit(main())
