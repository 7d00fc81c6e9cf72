"""CPU training epoch: eager fused kernels vs compiled fused kernels on static shapes, 2 MPI ranks,
one run.

    .venv/bin/python -m benchmarks.static_train [--n-train 40] [--epochs 3] [--batch-size 4]
        [--cost atoms|edges] [--out DIR]

Workload: the example CuNi set (cfm_plugins.datasets.cuni: bulk, slabs, clusters of up to
--max-atoms atoms, EMT labels) and a MACE-MP-medium-like model (:func:`mace_args`), trained by an
unmodified ``mace_run_train`` under ``mpirun -np 2 cfm-run``, 1 thread per rank, in each
configuration of :data:`CONFIGS` one after the other, with the same data, seed, batch size and
binpack capacity. The ratio is eager / compiled over the optimizer steps of the epochs after the
first (:func:`epoch_times`), each whole run's wall time beside it. Writes the record
``static_train_<cost>`` (:mod:`benchmarks.record`) to ``--out`` (default ``out/benchmarks/``);
the runs and their logs go to ``--work``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.record import command_line, markdown_table, write_record
from benchmarks.training import parser
from cfm_plugins.testing import BIN, mpirun_command

#: the configurations: ``eager``, binpack + the fused kernels; ``static eager``, every batch padded
#: to one budget (bins even in atoms and edges, one pad graph), not compiled: what the padding
#: costs; ``compiled``, the same with the forward with forces compiled by inductor once per shape
#: (training, validation and mace's final evaluation are separate graphs)
CONFIGS = {
    "eager": ["--enable", "mace,binpack,fused"],
    "static eager": ["--enable", "mace,binpack,fused,static"],
    "compiled": ["--enable", "mace,binpack,fused,static", "-o", "compile=default"],
}


def mace_args(args, files: dict, run: Path, label: str) -> list[str]:
    """mace_run_train's command line: the MACE-MP-medium-like model of
    :func:`benchmarks.gpu_mace.build_model` (ScaleShiftMACE, 2 interactions, hidden ``--hidden``,
    spherical harmonics l <= 3, correlation 3, radial MLP [64, 64, 64], 10 Bessel functions,
    r_max ``--r-max``), on the CPU, each optimizer step logged (``--cfm-step-log``)."""
    return [
        "mace_run_train",
        f"--name={label}",
        f"--train_file={files['train']}",
        f"--valid_file={files['valid']}",
        "--E0s=isolated",
        "--model=ScaleShiftMACE",
        f"--hidden_irreps={args.hidden}",
        f"--r_max={args.r_max}",
        "--max_L=1",
        "--max_ell=3",
        "--correlation=3",
        "--num_interactions=2",
        "--num_radial_basis=10",
        "--radial_MLP=[64, 64, 64]",
        f"--max_num_epochs={args.epochs}",
        f"--batch_size={args.batch_size}",
        f"--valid_batch_size={args.batch_size}",
        "--device=cpu",
        f"--default_dtype={args.dtype}",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--stress_key=REF_stress",
        "--seed=1",
        "--eval_interval=1",
        "--num_workers=0",
        "--save_cpu",
        f"--work_dir={run}",
        f"--model_dir={run}",
        f"--cfm-step-log={run / 'steps'}",
    ]


def epoch_times(ranks: list[list[dict]]) -> list[float]:
    """Per epoch: the slowest rank's summed step times (``wall_s`` of each optimizer step, from
    the step logs); epoch 0 of the compiled run includes compiling."""
    out = {}
    for records in ranks:
        per = {}
        for r in records:
            per[r["epoch"]] = per.get(r["epoch"], 0.0) + r["wall_s"]
        for e, t in per.items():
            out[e] = max(out.get(e, 0.0), t)
    return [out[e] for e in sorted(out)]


def main(argv=None) -> int:
    p = parser(__doc__, max_atoms=200, work="/tmp/cfm_bench_static_train")
    p.set_defaults(epochs=3)
    p.add_argument("--hidden", default="128x0e+128x1o")
    p.add_argument("--r-max", type=float, default=6.0)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument(
        "--only", default=",".join(CONFIGS), help="configurations to run: " + ", ".join(CONFIGS)
    )
    p.add_argument(
        "--cost",
        default="atoms",
        choices=["atoms", "edges"],
        help="binpack's cost in every configuration "
        "(edges: the budget is tight in edges, MACE's main work)",
    )
    args = p.parse_args(argv)
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    if set(only) - set(CONFIGS) or "eager" not in only:
        p.error(
            f"--only: choose among {', '.join(CONFIGS)}, eager included (the ratios are against it)"
        )
    if args.epochs < 2:
        p.error("--epochs must be at least 2: the ratio is taken over the epochs after the first")
    out = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.steplog import read_step_logs

    files = make_dataset(
        out / "data", n_train=args.n_train, n_valid=4, n_test=2, seed=0, max_atoms=args.max_atoms
    )
    command = command_line(argv)
    print(f"command: {command}\nworkload: {args}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    rows = {}
    for label in only:
        name = label.replace(" ", "_")
        run = out / name
        run.mkdir(exist_ok=True)
        for old in run.glob("steps.rank*.jsonl"):
            old.unlink()
        cmd = mpirun_command(2) + [
            str(BIN / "cfm-run"),
            *CONFIGS[label],
            "-o",
            f"cost={args.cost}",
            "--",
            *mace_args(args, files, run, name),
        ]
        print("$", " ".join(cmd), flush=True)
        t0 = time.perf_counter()
        res = subprocess.run(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        wall = time.perf_counter() - t0
        (run / "train.log").write_text(res.stdout)
        if res.returncode != 0:
            print(res.stdout[-4000:])
            raise SystemExit(f"{label} failed (exit {res.returncode}); log: {run / 'train.log'}")
        epochs = epoch_times(read_step_logs(str(run / "steps")))
        compiled = re.findall(
            r"dynamo compiled (\d+) graph\(s\) for (\d+) shape\(s\).*graph breaks: (.*)", res.stdout
        )
        budget = re.findall(
            r"static shapes \(train\): every batch padded to (.*?) \(pad over.*?: (.*)\)",
            res.stdout,
        )
        rows[label] = dict(
            epochs=epochs,
            wall=wall,
            compiled=compiled[:1],
            budget=budget[:1],
            raised=res.stdout.count("over the budget"),
            load=os.getloadavg()[0],
        )
        print(
            f"{label}: epochs {', '.join(f'{t:.1f}' for t in epochs)} s, run {wall:.0f} s, "
            f"{compiled[:1] or ''} {budget[:1] or ''}",
            flush=True,
        )

    # the steady state: the epochs after the first; each whole run's wall time (compiling,
    # validation and saving included) is reported beside it
    steady = {k: sum(v["epochs"][1:]) / len(v["epochs"][1:]) for k, v in rows.items()}
    description = (
        f"{args.n_train} CuNi structures (1..{args.max_atoms} atoms, EMT), MACE-MP-medium-like "
        f"ScaleShiftMACE {args.hidden}, l <= 3, correlation 3, 2 interactions, radial MLP "
        f"[64, 64, 64], r_max {args.r_max:g}, {args.dtype}, --batch_size {args.batch_size} "
        f"(binpack cost={args.cost}, its default capacity), {args.epochs} epochs, 2 MPI ranks x "
        "1 thread; optimizer steps per epoch, slowest rank"
    )
    table = [
        "| configuration | epoch 0 (s) | later epochs (s, mean) | eager / this (later epochs) | "
        "whole run (s) | compiled graphs / shapes, graph breaks | budget (pad) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows.items():
        graphs = "; ".join(f"{g} / {s}, {b.strip()}" for g, s, b in r["compiled"]) or "-"
        budget = "; ".join(f"{b} ({o})" for b, o in r["budget"]) or "-"
        if r["raised"]:
            budget += f"; raised {r['raised']}x"
        speed = steady["eager"] / steady[label]
        table.append(
            f"| {label} | {r['epochs'][0]:.1f} | {steady[label]:.1f} | {speed:.2f}x | "
            f"{r['wall']:.0f} | {graphs} | {budget} |"
        )
    loads = ", ".join(f"{k} {v['load']:.1f}" for k, v in rows.items())
    notes, headline = [f"Load average at the end of each run: {loads}."], {}
    if "compiled" in steady:
        ratio = f"{steady['eager'] / steady['compiled']:.2f}x"
        notes.insert(0, f"Compiled + static vs eager fused, later epochs: {ratio}.")
        headline["later epochs, eager / compiled + static"] = ratio
    print("\n".join(["", f"Workload: {description}.", "", *table, "", *notes]), flush=True)
    write_record(
        f"static_train_{args.cost}",
        "Static shapes + compile vs eager, MACE training on 2 CPU ranks",
        [
            markdown_table(
                "epochs",
                table,
                "per configuration: epoch 0 (compiling included) and the mean of the later "
                "epochs (s, slowest rank), eager's time over this one's, the whole run, what "
                "dynamo compiled and the padding budget",
            )
        ],
        description=description,
        headline=headline,
        notes=notes,
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
