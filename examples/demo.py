"""The main job, end to end (`make demo`):

1. make a size-diverse CuNi training set with ASE + EMT (bulk cells, slabs, clusters; 4..300 atoms);
2. train a small MACE model with `mpirun -np 2 cfm-run --enable mace,binpack,fused --
mace_run_train`,
   once per binpack ``--cost`` (default ``atoms``; ``--cost atoms,auto`` compares the atom count
   with the cost fitted on the run's own first epoch);
3. run a short MD with the (first) trained model through `CFMCalculator` (fused kernels);
4. print a summary: time per epoch, the LIF of each run (and over the epochs after the first, the
   ones ``cost=auto`` plans with its fit), the balance report of the batches, and draw
   ``batches.png``: epoch 0's batches of stock mace (its DistributedSampler, 4 graphs per batch;
   computed, not trained) beside binpack's (checked against the run's step log), each side's LIF
   in its title.

Everything goes to examples/out/. Options: --epochs, --n-train, --np (ranks), --cost.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from cfm_plugins.datasets.cuni import MIN_ATOMS
from cfm_plugins.testing import at_least, demo_costs, mpirun_command

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
#: mace_run_train's --batch_size and --seed here: the stock batches of the picture use them too
BATCH_SIZE = 4
SEED = 1
R_MAX = 4.5  # mace_run_train --r_max, and the edges binpack balances each step by


def stage(n, text):
    print(f"\n[{n}/4] {text}", flush=True)


def train_mace(args, files, run_dir: Path, cost: str) -> float | None:
    """One ``mace_run_train`` under ``mpirun cfm-run`` with binpack's ``cost``; its wall time (None
    if it failed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for f in run_dir.glob("steps.rank*.jsonl"):
        f.unlink()
    mpirun = mpirun_command(args.np)
    cmd = (
        mpirun
        + [
            str(BIN / "cfm-run"),
            "--enable",
            "mace,binpack,fused",
            "--",
            "mace_run_train",
            "--name=demo",
            f"--train_file={files['train']}",
            f"--valid_file={files['valid']}",
            "--E0s=isolated",
            "--model=MACE",
            "--hidden_irreps=16x0e+16x1o",
            f"--r_max={R_MAX}",
            "--max_L=1",
            "--correlation=3",
            "--num_interactions=2",
            f"--max_num_epochs={args.epochs}",
            f"--batch_size={BATCH_SIZE}",
            f"--valid_batch_size={BATCH_SIZE}",
            "--device=cpu",
            "--default_dtype=float64",
            "--energy_key=REF_energy",
            "--forces_key=REF_forces",
            "--stress_key=REF_stress",
            f"--seed={SEED}",
            "--eval_interval=1",
            "--num_workers=0",
            "--save_cpu",
            f"--work_dir={run_dir}",
            f"--model_dir={run_dir}",
            f"--cfm-step-log={run_dir / 'steps'}",
            f"--cfm-cost={cost}",
        ]
        + ([f"--cfm-max-tokens={args.max_tokens}"] if args.max_tokens is not None else [])
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    print("  $ " + " ".join(cmd[len(mpirun) :]), flush=True)
    start = time.monotonic()
    keep = re.compile(r"(Epoch \d+|binpack|fused kernels|process group|Error|error|Done)")
    with (
        subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        ) as proc,
        open(run_dir / "train.log", "w") as log,
    ):
        for line in proc.stdout:
            log.write(line)
            if keep.search(line):
                print("  " + line.rstrip()[-400:], flush=True)
    if proc.returncode != 0:
        print(
            f"training failed (exit {proc.returncode}); see {run_dir / 'train.log'}",
            file=sys.stderr,
        )
        return None
    return time.monotonic() - start


def training_atoms(train_file) -> np.ndarray:
    """Atom counts of the structures mace trains on, in its order: the training file less its
    ``IsolatedAtom`` entries (mace's ``load_from_xyz`` takes those for the E0s, not for
    training)."""
    from ase.io import read

    return np.array(
        [
            len(a)
            for a in read(train_file, ":")
            if not (len(a) == 1 and a.info.get("config_type") == "IsolatedAtom")
        ]
    )


def stock_batches(num_samples: int, ranks: int, epoch: int = 0):
    """The batches stock mace trains on in ``epoch`` without binpack, per rank: mace_run_train
    gives every rank a ``DistributedSampler(train_set, num_replicas, rank, shuffle=True,
    drop_last=True, seed=--seed)``, calls ``set_epoch(epoch)`` and cuts its order into batches of
    ``--batch_size`` (mace-torch 0.3.16, ``mace/cli/run_train.py``). Torch's own sampler makes
    the same orders here, without training."""
    from torch.utils.data.distributed import DistributedSampler

    from cfm_plugins.sampler.balance import fixed_count_batches

    orders = []
    for rank in range(ranks):
        sampler = DistributedSampler(
            range(num_samples),
            num_replicas=ranks,
            rank=rank,
            shuffle=True,
            drop_last=True,
            seed=SEED,
        )
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return fixed_count_batches(orders, BATCH_SIZE)


def training_edges(train_file) -> np.ndarray:
    """Edge counts of the structures mace trains on, in its order (neighbours within the run's
    r_max, periodic images included, no atom with itself): what the binpack plugin reads from
    mace's graphs to choose each step's bins (``step_balance=edges``)."""
    from ase.io import read
    from ase.neighborlist import neighbor_list

    return np.array(
        [
            len(neighbor_list("i", a, R_MAX))
            for a in read(train_file, ":")
            if not (len(a) == 1 and a.info.get("config_type") == "IsolatedAtom")
        ]
    )


def binpack_batches(atoms: np.ndarray, ranks: int, max_tokens=None, epoch: int = 0, edges=None):
    """The plan binpack (``cost=atoms``) trains on in ``epoch``, and its capacity: what the
    plugin builds from mace's training set, batch size and seed on the CPU in float64 (with
    ``edges``, each step's bins chosen by their edges, as the plugin does by default)."""
    from cfm_plugins.plugins.binpack import default_capacity
    from cfm_plugins.sampler import BinPackBatchSampler

    capacity = max_tokens or default_capacity(atoms.mean(), atoms.max(), BATCH_SIZE)
    sampler = BinPackBatchSampler(
        atoms, capacity, rank=0, world_size=ranks, seed=SEED, repeat=True, step_sizes=edges
    )
    sampler.set_epoch(epoch)
    return sampler.plan(), capacity


def trained_as_planned(plan, atoms: np.ndarray, logged: list[list[dict]], epoch: int = 0) -> bool:
    """Whether every rank's logged training steps of ``epoch`` hold the atoms of the plan's
    batches, step by step (the picture shows what the run trained)."""
    ranks = plan.world_size
    if len(logged) != ranks:
        return False
    for rank, records in enumerate(logged):
        seen = [r.get("atoms") for r in records if r.get("epoch", 0) == epoch]
        if seen != [int(atoms[b].sum()) for b in plan.rank_bins(rank)]:
            return False
    return True


def draw_picture(out: Path, atoms: np.ndarray, ranks: int, max_tokens=None, edges=None) -> tuple:
    """``out/batches.png``: epoch 0 of stock mace's batches (left) beside binpack's (right), as
    the MACE paper's Figure 12; returns the PNG's path, binpack's plan and its capacity."""
    from cfm_plugins.sampler import plot_batches

    stock = stock_batches(len(atoms), ranks)
    plan, capacity = binpack_batches(atoms, ranks, max_tokens, edges=edges)
    most = max(stock.num_steps(), plan.num_steps())
    png = plot_batches(
        plan,
        atoms,
        ranks,
        out / "batches.png",
        steps=None if most <= 10 else range(8),
        baseline=stock,
        capacity=capacity,
        titles=(
            f"stock mace: DistributedSampler, {BATCH_SIZE} graphs per batch",
            f"binpack: bins of up to {capacity:g} atoms",
        ),
    )
    return png, plan, capacity


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(HERE / "out"))
    p.add_argument("--epochs", type=at_least(1), default=3)
    p.add_argument("--n-train", type=at_least(1), default=60)
    p.add_argument("--max-atoms", type=at_least(MIN_ATOMS), default=300)
    p.add_argument("--np", type=at_least(1), default=2)
    p.add_argument(
        "--max-tokens",
        type=at_least(1),
        default=None,
        help="bin capacity in atoms (default: the binpack plugin's, batch size x mean atoms)",
    )
    p.add_argument(
        "--cost",
        default="atoms",
        help="binpack costs to train with, comma-separated, one run each (atoms, edges, auto)",
    )
    args = p.parse_args(argv)
    costs = demo_costs(p, args.cost)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    stage(1, f"making {args.n_train} CuNi structures with EMT labels")
    from cfm_plugins.datasets.cuni import make_dataset

    files = make_dataset(
        out / "data", n_train=args.n_train, n_valid=10, n_test=4, seed=0, max_atoms=args.max_atoms
    )

    stage(
        2,
        f"training MACE on {args.np} MPI ranks with binpack + fused kernels, cost "
        f"{', '.join(costs)}",
    )
    runs = {}
    for cost in costs:
        run_dir = out / ("run" if cost == costs[0] else f"run_{cost}")
        train_s = train_mace(args, files, run_dir, cost)
        if train_s is None:
            return 1
        runs[cost] = {"dir": run_dir, "train_s": train_s}
    run_dir = runs[costs[0]]["dir"]

    stage(3, "20 MD steps on the 512-atom cell with CFMCalculator (fused kernels)")
    from ase.io import read

    from cfm_plugins.calculators import CFMCalculator
    from cfm_plugins.calculators.md import time_md

    calc = CFMCalculator(str(run_dir / "demo.model"), device="cpu", default_dtype="float64")
    atoms = read(files["cell512"])
    per_step = time_md(calc, atoms, steps=20)
    print(f"  {per_step * 1e3:.0f} ms per MD step ({len(atoms)} atoms)")

    stage(4, "summary")
    from cfm_plugins.sampler import balance_report
    from cfm_plugins.steplog import (
        load_imbalance,
        read_step_events,
        read_step_logs,
        records_from_epoch,
    )

    summary = {}
    fits = {cost: read_step_events(str(run["dir"] / "steps"))[0] for cost, run in runs.items()}
    # every run's LIF also over the epochs planned with the first cost=auto fit (same epochs for
    # all)
    fitted = min((f["from_epoch"] for of in fits.values() for f in of), default=1)
    for cost, run in runs.items():
        ranks = read_step_logs(str(run["dir"] / "steps"))
        epoch_s = [
            max(sum(r["wall_s"] for r in rank if r["epoch"] == e) for rank in ranks)
            for e in range(args.epochs)
        ]
        later = records_from_epoch(ranks, fitted)
        summary[cost] = {
            "epoch_s": epoch_s,
            "train_s": run["train_s"],
            "lif": load_imbalance(ranks),
            "lif_cpu": load_imbalance(ranks, "compute_cpu_s"),
            "fitted_from_epoch": fitted,
            "lif_cpu_fitted_epochs": load_imbalance(later, "compute_cpu_s")
            if fitted < args.epochs
            else None,
            "fits": fits[cost],
        }
        print(
            f"  cost={cost}: training wall time {run['train_s']:.0f} s (start-up and evaluation "
            "included)"
        )
        print(
            "    time per epoch (optimizer steps, slowest rank): "
            + ", ".join(f"{t:.1f} s" for t in epoch_s)
        )
        print(
            "    load imbalance (LIF over ranks, per step) of the forward time "
            f"{summary[cost]['lif']:.3f}, of the "
            f"thread CPU time of forward + backward {summary[cost]['lif_cpu']:.3f}"
            + (
                f", the same over epochs {fitted}+ {summary[cost]['lif_cpu_fitted_epochs']:.3f}"
                if fitted < args.epochs
                else ""
            )
        )
    atoms_sizes = training_atoms(files["train"])
    png, plan, capacity = draw_picture(
        out, atoms_sizes, args.np, args.max_tokens, training_edges(files["train"])
    )
    report = balance_report(plan, atoms_sizes, capacity, args.np)
    print("  " + report.to_text().replace("\n", "\n  "))
    if "atoms" in runs and not trained_as_planned(
        plan, atoms_sizes, read_step_logs(str(runs["atoms"]["dir"] / "steps"))
    ):
        print(
            "  warning: the cost=atoms run's step log of epoch 0 differs from the binpack batches "
            "drawn in the picture"
        )
    (out / "summary.json").write_text(
        json.dumps(
            {"runs": summary, "md_step_s": per_step, "balance": report.to_dict()},
            indent=1,
            default=str,
        )
    )
    print(f"  picture of epoch 0's batches, stock mace's beside binpack's: {png}")
    print(f"  model: {run_dir / 'demo.model'}\n  summary: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
