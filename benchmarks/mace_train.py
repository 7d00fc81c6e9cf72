"""MACE training with and without the plugins, 2 MPI ranks on this CPU, ratios in one run.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.mace_train [--n-train 40] [--epochs 2]
        [--hidden 32x0e+32x1o] [--out DIR]

Workload: the example CuNi set (cfm_plugins.datasets.cuni: bulk, slabs, clusters, up to
--max-atoms atoms, EMT labels), a real MACE model (hidden irreps --hidden, correlation 3, max_L 1,
r_max 4.5, 2 interactions, float64), `mpirun -np 2 cfm-run --enable mace[,binpack][,fused] --
mace_run_train` (:data:`CONFIGS`). Per configuration: optimizer-step time of the last epoch
(slowest rank, summed over steps), steps per epoch, and the load imbalance factor of the forward
compute time. Then CFMCalculator vs MACECalculator time per MD step on a 512-atom cell with the
trained model. Prints the tables and writes the record ``mace_train_cpu`` (:mod:`benchmarks.record`)
to ``--out`` (default ``out/benchmarks/``); the runs, their logs and data set go to ``--work``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.record import command_line, markdown_table, table, write_record
from benchmarks.training import config_table, parser, plugin_configs
from cfm_plugins.testing import BIN, mpirun_command

#: stock, binpack, fused, both: "stock" is ``--enable mace`` alone (mace's DistributedSampler with
#: fixed --batch_size graphs and its e3nn kernels; cfm-run only provides the MPI rendezvous that
#: mace's own ``--launcher mpi`` lacks on CPU)
CONFIGS = plugin_configs("mace")


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=300, work="/tmp/cfm_bench_mace")
    p.add_argument("--hidden", default="32x0e+32x1o", help="MACE's hidden irreps")
    p.add_argument("--md-steps", type=int, default=3, help="MD steps timed per calculator")
    args = p.parse_args(argv)
    command = command_line(argv)
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    from cfm_plugins.datasets.cuni import make_dataset

    files = make_dataset(
        out / "data", n_train=args.n_train, n_valid=4, n_test=2, seed=0, max_atoms=args.max_atoms
    )
    print(f"command: {command}\nworkload: {args}", flush=True)
    mpirun = mpirun_command(2)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    from cfm_plugins.steplog import load_imbalance, read_step_logs

    rows = {}
    for label, enable in CONFIGS.items():
        run = out / label
        run.mkdir(exist_ok=True)
        cmd = mpirun + [
            str(BIN / "cfm-run"),
            "--enable",
            enable,
            "--",
            "mace_run_train",
            f"--name={label}",
            f"--train_file={files['train']}",
            f"--valid_file={files['valid']}",
            "--E0s=isolated",
            "--model=MACE",
            f"--hidden_irreps={args.hidden}",
            "--r_max=4.5",
            "--max_L=1",
            "--correlation=3",
            "--num_interactions=2",
            f"--max_num_epochs={args.epochs}",
            f"--batch_size={args.batch_size}",
            f"--valid_batch_size={args.batch_size}",
            "--device=cpu",
            "--default_dtype=float64",
            "--energy_key=REF_energy",
            "--forces_key=REF_forces",
            "--stress_key=REF_stress",
            "--seed=1",
            "--eval_interval=100",
            "--num_workers=0",
            "--save_cpu",
            f"--work_dir={run}",
            f"--model_dir={run}",
            f"--cfm-step-log={run / 'steps'}",
        ]
        res = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        (run / "train.log").write_text(res.stdout)
        if res.returncode != 0:
            print(res.stdout[-3000:])
            raise SystemExit(f"{label} failed")
        ranks = read_step_logs(str(run / "steps"))
        per_epoch = len(ranks[0]) // args.epochs
        last = [r[-per_epoch:] for r in ranks]
        # LIF = sum_steps max_rank / sum_steps mean_rank of the forward (energy + forces) compute
        # time, and of the atoms
        epoch_s = max(sum(s["wall_s"] for s in r) for r in last)
        rows[label] = dict(
            epoch_s=epoch_s,
            steps=per_epoch,
            lif=load_imbalance(last),
            lif_atoms=load_imbalance(last, "atoms"),
        )
        print(
            f"{label:8s} epoch {epoch_s:7.2f} s  steps {per_epoch:3d}  LIF "
            f"{rows[label]['lif']:.3f} (atoms {rows[label]['lif_atoms']:.3f})",
            flush=True,
        )

    from ase.io import read
    from mace.calculators import MACECalculator

    from cfm_plugins.calculators import CFMCalculator
    from cfm_plugins.calculators.md import time_md

    model = str(out / "stock" / "stock.model")
    atoms = read(files["cell512"])
    md_stock = time_md(
        MACECalculator(model_paths=model, device="cpu", default_dtype="float64"),
        atoms,
        args.md_steps,
    )
    md_fused = time_md(
        CFMCalculator(model, device="cpu", default_dtype="float64"), atoms, args.md_steps
    )

    description = (
        f"{args.n_train} CuNi structures (4..{args.max_atoms} atoms, EMT), MACE {args.hidden}, "
        "correlation 3, max_L 1, r_max 4.5, 2 interactions, float64, "
        f"--batch_size {args.batch_size}, 2 MPI ranks x 1 thread; last of {args.epochs} epochs. "
        f"MD: a 512-atom CuNi cell, {args.md_steps} steps with the trained model"
    )
    epochs = config_table(
        rows, "optimizer steps per epoch (s, slowest rank)", "speed-up vs stock", speedup=True
    )
    md = [
        ["MACECalculator", round(md_stock * 1e3, 1), "1.00x"],
        ["CFMCalculator", round(md_fused * 1e3, 1), f"{md_stock / md_fused:.2f}x"],
    ]
    print("\n".join(["", f"Workload: {description}.", "", *epochs, ""]))
    print(
        f"MD: MACECalculator {md[0][1]:.0f} ms/step, CFMCalculator {md[1][1]:.0f} ms/step, "
        f"speed-up {md[1][2]}",
        flush=True,
    )
    write_record(
        "mace_train_cpu",
        "MACE training on 2 CPU ranks, and MD with the trained model",
        [
            markdown_table(
                "epoch",
                epochs,
                "the optimizer steps of the last epoch (s, slowest rank), the speed-up against "
                "stock in the same run, steps per epoch, and the load imbalance factor of the "
                "forward time and of the atoms",
            ),
            table(
                "md",
                ["calculator", "ms per MD step", "speed-up"],
                md,
                "time per VelocityVerlet step on the 512-atom cell, the same trained model",
            ),
        ],
        description=description,
        headline={
            "epoch time, binpack + fused / stock": (
                f"{rows['both']['epoch_s'] / rows['stock']['epoch_s']:.2f}x"
            ),
            "MD step time, CFMCalculator / MACECalculator": f"{md_fused / md_stock:.2f}x",
        },
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
