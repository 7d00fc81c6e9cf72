"""The NequIP demo, end to end, into examples/out/nequip/ (`make demo-nequip`, in .venv-nequip):

    .venv-nequip/bin/python examples/demo_nequip.py [--epochs 3] [--cost atoms,auto]  # or --help

1. make a size-diverse CuNi training set with ASE + EMT (cfm_plugins.datasets.cuni);
2. train a small NequIP model with
   `mpirun -np 2 cfm-run --enable nequip,binpack,fused -- nequip-train -cp DIR -cn cuni`
   (an unmodified nequip-train; the config is cfm_plugins.datasets.nequip_config's), once per
   binpack ``--cost`` (default ``atoms``; ``--cost atoms,auto`` compares the atom count with the
   cost fitted on the run's own first epoch), and again per ``--seeds`` packing seed (other bin
   orders and rank deals; the summary gives each cost's median LIF over them);
3. run MD on a 512-atom cell through NequIP's own ASE calculator (NequIPCalculator) with the
   (first) trained checkpoint, stock and with the `enable_CFMFused` model modifier, timed per step;
4. print a summary: time per epoch, steps, each run's load imbalance (LIF) of the last epoch and
   of the epochs after the first (those ``cost=auto`` plans with its fit), MD times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cfm_plugins.datasets.cuni import MIN_ATOMS
from cfm_plugins.testing import at_least, demo_costs, mpirun_command

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def stage(n, text):
    print(f"\n[{n}/4] {text}", flush=True)


def nequip_calculator(ckpt: str, fused: bool, device: str = "cpu"):
    """NequIP's ASE calculator on a training checkpoint (eager model), optionally fused."""
    from nequip.integrations.ase import NequIPCalculator
    from nequip.model import modify

    # eager model from a training checkpoint (from_compiled_model needs nequip-compile output)
    calc = NequIPCalculator._from_saved_model(
        ckpt, device=device, chemical_species_to_atom_type_map=True
    )
    if fused:
        calc.model = modify(calc.model, [{"modifier": "enable_CFMFused"}])
    return calc


def run_key(cost: str, seed: int) -> str:
    """The name of the run of ``cost`` with the ``seed``-th packing seed in the summary."""
    return cost if seed == 0 else f"{cost}_seed{seed}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(HERE / "out" / "nequip"))
    p.add_argument("--epochs", type=at_least(1), default=3)
    p.add_argument("--n-train", type=at_least(1), default=40)
    p.add_argument("--max-atoms", type=at_least(MIN_ATOMS), default=150)
    p.add_argument("--np", type=at_least(1), default=2)
    p.add_argument("--md-steps", type=at_least(1), default=5)
    p.add_argument(
        "--cost",
        default="atoms",
        help="binpack costs to train with, comma-separated, one run each (atoms, edges, auto)",
    )
    p.add_argument(
        "--seeds",
        type=at_least(1),
        default=1,
        help="repeat every run with this many binpack packing seeds "
        "(the trainer's, 101, 102, ...); median LIF per cost",
    )
    args = p.parse_args(argv)
    costs = demo_costs(p, args.cost)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    stage(1, f"making {args.n_train} CuNi structures with EMT labels")
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config

    files = make_dataset(
        out / "data", n_train=args.n_train, n_valid=8, n_test=4, seed=0, max_atoms=args.max_atoms
    )

    stage(2, f"training NequIP on {args.np} MPI ranks with binpack + fused kernels")
    write_config(
        out / "cfg" / "cuni.yaml",
        train=files["train"],
        valid=files["valid"],
        epochs=args.epochs,
        features=16,
        l_max=1,
        layers=3,
        batch_size=4,
    )
    from cfm_plugins.steplog import (
        load_imbalance,
        read_step_events,
        read_step_logs,
        records_from_epoch,
    )

    results = {}
    for seed, cost in [(seed, cost) for seed in range(args.seeds) for cost in costs]:
        tag = ("" if cost == costs[0] else f"_{cost}") + ("" if seed == 0 else f"_seed{seed}")
        run, steps = out / f"run{tag}", out / f"steps{tag}"
        cmd = mpirun_command(args.np) + [
            str(BIN / "cfm-run"),
            "--enable",
            "nequip,binpack,fused",
            "-o",
            f"step_log={steps}",
            "-o",
            f"cost={cost}",
            *([] if seed == 0 else ["-o", f"seed={100 + seed}"]),
            "--",
            "nequip-train",
            "-cp",
            str(out / "cfg"),
            "-cn",
            "cuni",
            f"hydra.run.dir={run}",
        ]
        print("$", " ".join(cmd), flush=True)
        for f in out.glob(f"{steps.name}.rank*.jsonl"):
            f.unlink()
        t0 = time.perf_counter()
        res = subprocess.run(
            cmd,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        (out / f"train{tag}.log").write_text(res.stdout)
        if res.returncode != 0:
            print(res.stdout[-4000:])
            raise SystemExit(f"training failed (log: {out / f'train{tag}.log'})")
        train_s = time.perf_counter() - t0
        print("\n".join(line for line in res.stdout.splitlines() if "[cfm rank 0]" in line))
        ranks = [[r for r in rank if r["stage"] == "train"] for rank in read_step_logs(str(steps))]
        last = [[r for r in rank if r["epoch"] == args.epochs - 1] for rank in ranks]
        results[run_key(cost, seed)] = {
            "train_wall_s": round(train_s, 1),
            "last_epoch_s": round(max(sum(r["wall_s"] for r in rank) for rank in last), 3),
            "steps_per_epoch": len(last[0]),
            "lif_forward_time": round(load_imbalance(last), 3),
            "lif_atoms": round(load_imbalance(last, "atoms"), 3),
            "ranks": ranks,
            "fits": [
                f["fit"] | {"from_epoch": f["from_epoch"]} for f in read_step_events(str(steps))[0]
            ],
        }
    # every run's LIF also over the epochs planned with the first cost=auto fit (same epochs for
    # all)
    fitted = min((f["from_epoch"] for r in results.values() for f in r["fits"]), default=1)
    for r in results.values():
        later = records_from_epoch(r.pop("ranks"), fitted)
        r["lif_cpu_fitted_epochs"] = (
            round(load_imbalance(later, "compute_cpu_s"), 3) if fitted < args.epochs else None
        )
        r["fitted_from_epoch"] = fitted
    medians = {}
    if args.seeds > 1 and fitted < args.epochs:
        for cost in costs:
            lif = [results[run_key(cost, s)]["lif_cpu_fitted_epochs"] for s in range(args.seeds)]
            medians[cost] = {
                "median": round(float(np.median(lif)), 3),
                "min": min(lif),
                "max": max(lif),
            }
    run = out / "run"

    stage(
        3, f"MD ({args.md_steps} steps, 512 atoms) through NequIPCalculator with the trained model"
    )
    from ase.io import read

    from cfm_plugins.calculators.md import time_md

    atoms = read(files["cell512"])
    ckpt = str(run / "last.ckpt")
    md_stock = time_md(nequip_calculator(ckpt, fused=False), atoms, args.md_steps)
    md_fused = time_md(nequip_calculator(ckpt, fused=True), atoms, args.md_steps)

    stage(4, "summary")
    summary = {
        **(
            results[costs[0]] if len(results) == 1 else {f"cost={c}": r for c, r in results.items()}
        ),
        **({f"lif_cpu_fitted_epochs over {args.seeds} seeds": medians} if medians else {}),
        "md_ms_per_step_stock": round(md_stock * 1e3, 1),
        "md_ms_per_step_fused": round(md_fused * 1e3, 1),
        "checkpoint": ckpt,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for k, v in summary.items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
