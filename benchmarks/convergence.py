"""Training quality with binpack: does token batching change the model? Validation curves per epoch.

    .venv/bin/python -m benchmarks.convergence mace [--epochs 40] [--seeds 1 2 3]
        [--only CONFIG,...] [--force]
    .venv/bin/python -m benchmarks.convergence hydragnn [--epochs 30] [--seeds 1 2 3]
    .venv-nequip/bin/python -m benchmarks.convergence nequip [--epochs 30] [--seeds 1 2 3]
    .venv/bin/python -m benchmarks.convergence report [--out DIR]   # the tables and plots

The configurations of :data:`CONFIGS` (the trainer's own batches against binpack's, with either
loss weighting), each trained with every seed on 2 MPI ranks, per trainer: ``mace``
(:func:`run_mace`), ``hydragnn`` (:func:`run_hydragnn`), ``nequip`` (:func:`run_nequip`). Every
finished run keeps its result (:func:`prepare_run`), so the benchmark can be resumed or rerun per
configuration (``--only``); ``report`` (:func:`report`) writes, per part, the record
``convergence_<part>`` and its plot to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.record import (
    add_out_argument,
    command_line,
    markdown_table,
    picture_path,
    write_record,
)
from benchmarks.training import ROOT
from cfm_plugins.testing import BIN, clean_env, mpirun_command

#: the configurations (cfm-run options beyond the trainer's plugin and binpack), each trained with
#: every seed on 2 MPI ranks (``mpirun -np 2 cfm-run ...``) with the same learning-rate schedule and
#: about the same number of optimizer steps (binpack's default capacity is the batch size x the
#: mean atom count): ``stock``, the trainer's own batches (a fixed number of graphs per rank);
#: ``binpack``, binpack's batches with ``loss_weighting=stock`` (the trainer's per-batch loss
#: means); ``per_sample``, binpack's batches with ``loss_weighting=per_sample`` (every graph and
#: atom weighs the same over an epoch, :mod:`cfm_plugins.sampler.weighting`)
CONFIGS = {
    "stock": [],
    "binpack": ["-o", "loss_weighting=stock"],
    "per_sample": ["-o", "loss_weighting=per_sample"],
}
LABELS = {
    "stock": "stock batches",
    "binpack": "binpack, loss_weighting=stock",
    "per_sample": "binpack, loss_weighting=per_sample",
}
DEFAULT_WORK = "/tmp/cfm_bench_convergence"


# ----------------------------------------------------------------------------- runs
def prepare_run(args, part: str, config: str, seed: int) -> tuple[Path, dict | None]:
    """The run's folder and its earlier result (``None``: run it; the folder is then made afresh,
    since the trainers append to their logs). Every run writes
    ``WORK/<part>/<config>/seed<k>/result.json`` when it finishes (``--work``, default
    :data:`DEFAULT_WORK`); a rerun skips the runs that have one (``--force`` redoes them)."""
    run = Path(args.work) / part / config / f"seed{seed}"
    done = run / "result.json"
    if done.exists() and not args.force:
        print(f"  {config} seed {seed}: done before ({done})", flush=True)
        return run, json.loads(done.read_text())
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    return run, None


def train(cmd: list[str], run: Path, what: str) -> tuple[str, float]:
    """Run a training command in ``run`` (output in ``run/train.log``); its output and wall time."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(), cwd=run
    )
    (run / "train.log").write_text(res.stdout)
    if res.returncode != 0:
        print(res.stdout[-4000:])
        raise SystemExit(f"{what} failed (exit {res.returncode}); log: {run / 'train.log'}")
    return res.stdout, time.perf_counter() - t0


def finish(run: Path, result: dict) -> dict:
    (run / "result.json").write_text(json.dumps(result))
    return result


# ----------------------------------------------------------------------------- MACE: data
def molecules(n: int, rng: np.random.Generator) -> list:
    """``n`` rattled G2 molecules of H, C, N, O (2..14 atoms) in a box, labelled with EMT."""
    from ase.build import molecule

    from cfm_plugins.datasets.clusters import _molecule_names
    from cfm_plugins.datasets.cuni import label

    names = _molecule_names(2)
    out = []
    for _ in range(n):
        at = molecule(str(rng.choice(names)))
        at.positions += rng.normal(0.0, 0.05, size=at.positions.shape)
        at.center(vacuum=6.0)
        at.pbc = False
        at.info["config_type"] = "molecule"
        out.append(label(at, with_stress=False))
    return out


def mixed_set(n: int, seed, max_atoms: int = 300, molecule_share: float = 0.2) -> list:
    """``n`` labelled structures: CuNi bulk/slabs/clusters (cfm_plugins.datasets.cuni, 1..max_atoms
    atoms, log-uniform) and about ``molecule_share`` H/C/N/O molecules, in random order."""
    from cfm_plugins.datasets.cuni import make_structures

    rng = np.random.default_rng(seed)
    n_mol = int(round(n * molecule_share))
    frames = make_structures(
        n - n_mol, seed=rng.integers(1 << 31), max_atoms=max_atoms
    ) + molecules(n_mol, rng)
    return [frames[i] for i in rng.permutation(len(frames))]


def mace_data(out: Path, n_train: int, n_valid: int, max_atoms: int) -> dict:
    """train.xyz (isolated atoms first, for --E0s=isolated) and valid.xyz, made once."""
    from ase.io import write

    from cfm_plugins.datasets.cuni import isolated_atoms

    files = {"train": out / "train.xyz", "valid": out / "valid.xyz"}
    if not all(p.exists() for p in files.values()):
        out.mkdir(parents=True, exist_ok=True)
        train, valid = mixed_set(n_train, [0, 0], max_atoms), mixed_set(n_valid, [0, 1], max_atoms)
        symbols = sorted({s for a in train + valid for s in a.get_chemical_symbols()})
        write(
            files["train"], isolated_atoms(symbols) + train, format="extxyz"
        )  # E0s of every element
        write(files["valid"], valid, format="extxyz")
    return files


# ----------------------------------------------------------------------------- MACE: runs
def mace_command(args, files: dict, run: Path, config: str, seed: int) -> list[str]:
    gamma = args.final_lr_factor ** (1.0 / max(args.epochs - 1, 1))
    return mpirun_command(2) + [
        str(BIN / "cfm-run"),
        "--enable",
        ("mace" if config == "stock" else "mace,binpack") + ",fused",
        *CONFIGS[config],
        "--",
        "mace_run_train",
        f"--name={config}",
        f"--train_file={files['train']}",
        f"--valid_file={files['valid']}",
        "--E0s=isolated",
        "--model=ScaleShiftMACE",
        f"--hidden_irreps={args.hidden}",
        f"--r_max={args.r_max}",
        "--max_L=1",
        "--max_ell=2",
        "--correlation=2",
        "--num_interactions=2",
        "--num_radial_basis=6",
        "--MLP_irreps=16x0e",
        "--radial_MLP=[16, 16]",
        "--skip_evaluate_heads=Default",
        f"--max_num_epochs={args.epochs}",
        f"--batch_size={args.batch_size}",
        f"--valid_batch_size={args.batch_size}",
        "--device=cpu",
        "--default_dtype=float64",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--stress_key=REF_stress",
        f"--seed={seed}",
        "--eval_interval=1",
        "--num_workers=0",
        "--save_cpu",
        f"--lr={args.lr}",
        "--scheduler=ExponentialLR",
        f"--lr_scheduler_gamma={gamma:.6f}",
        f"--energy_weight={args.energy_weight}",
        f"--forces_weight={args.forces_weight}",
        f"--work_dir={run}",
        f"--model_dir={run}",
        f"--results_dir={run / 'results'}",
        f"--checkpoints_dir={run / 'checkpoints'}",
        f"--log_dir={run / 'logs'}",
    ]


def read_mace_results(path: Path) -> tuple[list[dict], int]:
    """Per-epoch validation metrics (mace's results file, mode "eval") and the steps of epoch 0."""
    evals, steps0 = [], 0
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("mode") == "eval" and d.get("epoch") is not None:
            evals.append(
                {
                    "epoch": int(d["epoch"]),
                    "rmse_e_per_atom": float(d["rmse_e_per_atom"]),
                    "rmse_f": float(d["rmse_f"]),
                    "loss": float(d["loss"]),
                }
            )
        elif d.get("mode") == "opt" and d.get("epoch") == 0:
            steps0 += 1
    return evals, steps0


def per_structure_errors(model_path: Path, valid: Path) -> dict:
    """Energy-per-atom error and summed squared force error of every validation structure."""
    import torch
    from ase.io import read
    from mace.calculators import MACECalculator

    torch.set_num_threads(1)
    calc = MACECalculator(model_paths=str(model_path), device="cpu", default_dtype="float64")
    n, de, f2 = [], [], []
    for at in read(valid, index=":"):
        ref_e, ref_f = at.info["REF_energy"], at.arrays["REF_forces"]
        at = at.copy()
        at.calc = calc
        n.append(len(at))
        de.append((at.get_potential_energy() - ref_e) / len(at))
        f2.append(float(((at.get_forces() - ref_f) ** 2).sum()))
    return {"atoms": n, "de_per_atom": de, "f_sq": f2}


def subset_rmse(errors: dict, which: str) -> tuple[float, float]:
    """RMSE of the energy per atom and of the force components on the whole validation set or on
    the third of its structures with the fewest (``small``) or the most (``large``) atoms."""
    n = np.asarray(errors["atoms"])
    order = np.argsort(n, kind="stable")
    third = max(1, len(n) // 3)
    idx = {"all": order, "small": order[:third], "large": order[-third:]}[which]
    de, f2 = np.asarray(errors["de_per_atom"])[idx], np.asarray(errors["f_sq"])[idx]
    return float(np.sqrt(np.mean(de**2))), float(np.sqrt(f2.sum() / (3 * n[idx].sum())))


def run_mace(args, files: dict, config: str, seed: int) -> dict:
    """One MACE run: a small MACE (float64) on a size-diverse EMT set (CuNi bulk cells, slabs and
    clusters of 1..300 atoms plus H/C/N/O molecules of the G2 set, :func:`mixed_set`); per epoch
    mace's own validation RMSE of the energy per atom and of the forces; at the end the model mace
    saves is evaluated structure by structure on the validation set (:func:`per_structure_errors`),
    on the whole set and on its smallest and largest thirds (a weighting bias shows there
    first)."""
    run, result = prepare_run(args, "mace", config, seed)
    if result is not None:
        return result
    log, wall = train(
        mace_command(args, files, run, config, seed), run, f"mace {config} seed {seed}"
    )
    evals, steps = read_mace_results(next((run / "results").glob("*_train.txt")))
    errors = per_structure_errors(run / f"{config}.model", files["valid"])
    result = finish(
        run,
        {
            "part": "mace",
            "config": config,
            "seed": seed,
            "wall_s": wall,
            "steps_per_epoch": steps,
            "epochs": evals,
            "final": errors,
            "weight_log": re.findall(r"binpack loss_weighting=.*", log)[:1],
        },
    )
    e, f = subset_rmse(errors, "all")
    print(
        f"  {config} seed {seed}: {wall:.0f} s, {steps} steps/epoch, final RMSE E {e * 1e3:.2f} "
        f"meV/atom, F {f * 1e3:.1f} meV/A",
        flush=True,
    )
    return result


def mace_part(args) -> None:
    data = Path(args.work) / "mace" / f"data_{args.n_train}_{args.n_valid}_{args.max_atoms}"
    files = mace_data(data, args.n_train, args.n_valid, args.max_atoms)
    print(
        f"MACE convergence: {args.n_train} training / {args.n_valid} validation structures "
        f"({files['train'].parent}), "
        f"{args.epochs} epochs, seeds {args.seeds}, configurations {', '.join(args.only)}",
        flush=True,
    )
    for seed in args.seeds:
        for config in args.only:
            run_mace(args, files, config, seed)


# ----------------------------------------------------------------------------- HydraGNN
def run_hydragnn(args, config: str, seed: int) -> dict:
    """examples/hydragnn/train.py with its JSON config (EGNN on EMT molecules and clusters), this
    seed (training-set order, packing seed); its validation loss per epoch."""
    here = ROOT / "examples" / "hydragnn"
    run, result = prepare_run(args, "hydragnn", config, seed)
    if result is not None:
        return result
    cfg = json.loads((here / "config.json").read_text())
    cfg.pop("cfm_plugins", None)  # the plugins are named on the command line
    cfg["NeuralNetwork"]["Training"]["num_epoch"] = args.epochs
    data = Path(args.work) / "hydragnn" / "data" / "clusters.pt"
    cfg["Dataset"]["path"]["total"] = str(data)
    (run / "config.json").write_text(json.dumps(cfg, indent=2))
    if not data.exists():
        import torch

        from cfm_plugins.datasets.clusters import make_dataset

        data.parent.mkdir(parents=True, exist_ok=True)
        torch.save(make_dataset(args.num, seed=0), data)
    enable = "hydragnn" if config == "stock" else "hydragnn,binpack"
    options = (
        [] if config == "stock" else ["-o", "cost=edges", "-o", f"seed={seed}", *CONFIGS[config]]
    )
    cmd = mpirun_command(2) + [
        str(BIN / "cfm-run"),
        "--enable",
        enable,
        *options,
        "--",
        "python",
        str(here / "train.py"),
        str(run / "config.json"),
        "--log",
        f"conv_{config}_{seed}",
        "--seed",
        str(seed),
    ]
    log, wall = train(cmd, run, f"hydragnn {config} seed {seed}")
    num = r"([0-9.eE+-]+)"
    pat = rf"Epoch: (\d+), Train Loss: {num}, Val Loss: {num}, Test Loss: {num}"
    epochs = [
        {"epoch": int(e), "train_loss": float(t), "val_loss": float(v), "test_loss": float(s)}
        for e, t, v, s in re.findall(pat, log)
    ]
    result = finish(
        run, {"part": "hydragnn", "config": config, "seed": seed, "wall_s": wall, "epochs": epochs}
    )
    print(
        f"  {config} seed {seed}: {wall:.0f} s, final val loss {epochs[-1]['val_loss']:.5f}",
        flush=True,
    )
    return result


def hydragnn_part(args) -> None:
    print(
        f"HydraGNN convergence: examples/hydragnn ({args.num} structures), {args.epochs} epochs, "
        f"seeds {args.seeds}",
        flush=True,
    )
    for seed in args.seeds:
        for config in args.only:
            run_hydragnn(args, config, seed)


# ----------------------------------------------------------------------------- NequIP
def run_nequip(args, files: dict, config: str, seed: int) -> dict:
    """nequip-train (cfm_plugins.datasets.nequip_config) on the CuNi set, in ``.venv-nequip``;
    validation RMSE per epoch from Lightning's metrics.csv (nequip's ``val_metrics``)."""
    import csv

    from cfm_plugins.datasets.nequip_config import write_config

    run, result = prepare_run(args, "nequip", config, seed)
    if result is not None:
        return result
    write_config(
        run / "cfg" / "conv.yaml",
        train=files["train"],
        valid=files["valid"],
        epochs=args.epochs,
        features=args.features,
        l_max=1,
        layers=2,
        batch_size=args.batch_size,
        seed=seed,
        lr=args.lr,
    )
    enable = "nequip" if config == "stock" else "nequip,binpack"
    cmd = mpirun_command(2) + [
        str(BIN / "cfm-run"),
        "--enable",
        enable,
        *CONFIGS[config],
        "--",
        "nequip-train",
        "-cp",
        str(run / "cfg"),
        "-cn",
        "conv",
        f"hydra.run.dir={run / 'out'}",
    ]
    _, wall = train(cmd, run, f"nequip {config} seed {seed}")
    with open(run / "out" / "csv" / "version_0" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("val0_epoch/forces_rmse")]
    epochs = [
        {
            "epoch": int(r["epoch"]),
            "rmse_e_per_atom": float(r["val0_epoch/per_atom_energy_rmse"]),
            "rmse_f": float(r["val0_epoch/forces_rmse"]),
        }
        for r in rows
    ]
    result = finish(
        run, {"part": "nequip", "config": config, "seed": seed, "wall_s": wall, "epochs": epochs}
    )
    print(
        f"  {config} seed {seed}: {wall:.0f} s, final RMSE E "
        f"{epochs[-1]['rmse_e_per_atom'] * 1e3:.2f} "
        f"meV/atom, F {epochs[-1]['rmse_f'] * 1e3:.1f} meV/A",
        flush=True,
    )
    return result


def nequip_part(args) -> None:
    from cfm_plugins.datasets.cuni import make_dataset

    data = Path(args.work) / "nequip" / f"data_{args.n_train}_{args.n_valid}_{args.max_atoms}"
    files = {"train": data / "train.xyz", "valid": data / "valid.xyz"}
    if not all(p.exists() for p in files.values()):
        files = make_dataset(
            data,
            n_train=args.n_train,
            n_valid=args.n_valid,
            n_test=1,
            seed=0,
            max_atoms=args.max_atoms,
        )
    print(
        f"NequIP convergence: {args.n_train} training / {args.n_valid} validation CuNi structures, "
        f"{args.epochs} epochs, seeds {args.seeds}, configurations {', '.join(args.only)}",
        flush=True,
    )
    for seed in args.seeds:
        for config in args.only:
            run_nequip(args, files, config, seed)


# ----------------------------------------------------------------------------- report
def load_results(out: Path, part: str) -> dict:
    """config -> [result of each seed], for the runs that finished."""
    found = {}
    for config in CONFIGS:
        runs = sorted((out / part / config).glob("seed*/result.json"))
        if runs:
            found[config] = [json.loads(p.read_text()) for p in runs]
    return found


def spread(values) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def verdict(stock: list[float], other: list[float]) -> tuple[bool, float]:
    """The issue's target: |mean - stock mean| within stock's seed spread (sample std), or within
    5 % of stock's mean where that spread is smaller. Returns (met, |difference| / tolerance)."""
    m0, s0 = spread(stock)
    m1, _ = spread(other)
    tol = max(s0, 0.05 * m0)
    return abs(m1 - m0) <= tol, abs(m1 - m0) / tol


def curve(results: list[dict], key: str) -> np.ndarray:
    """(seeds, epochs) of one metric, cut to the shortest run."""
    n = min(len(r["epochs"]) for r in results)
    return np.array([[e[key] for e in r["epochs"][:n]] for r in results])


def mean_std(values, digits: int) -> str:
    m, s = spread(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def final_table(finals: dict, columns: list[str], digits: list[int]) -> list[str]:
    """``finals``: config -> list (per column) of per-seed values. Markdown rows of the values,
    mean ± sample std over the seeds."""
    lines = ["| configuration | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for config, cols in finals.items():
        lines.append(
            f"| {LABELS[config]} | "
            + " | ".join(mean_std(v, d) for v, d in zip(cols, digits))
            + " |"
        )
    return lines


def target_table(finals: dict, columns: list[str]) -> list[str]:
    """Against stock, per column: |difference from stock| / tolerance (:func:`verdict`; ≤ 1 meets
    the target, ✗ where it does not), and whether every column meets it. Empty without stock or
    another configuration."""
    if "stock" not in finals or len(finals) < 2:
        return []
    lines = [
        "| configuration | " + " | ".join(columns) + " | all met |",
        "|---|" + "---|" * (len(columns) + 1),
    ]
    for config in (c for c in finals if c != "stock"):
        cells, met = [], True
        for ref, got in zip(finals["stock"], finals[config]):
            ok, ratio = verdict(ref, got)
            met &= ok
            cells.append(f"{ratio:.2f}" + ("" if ok else " ✗"))
        lines.append(
            f"| {LABELS[config]} | " + " | ".join(cells) + f" | {'yes' if met else 'no'} |"
        )
    return lines


TARGET = (
    "against stock, |difference from stock| / tolerance per column; ≤ 1 meets the target: "
    "within stock's seed spread (its sample std), or within 5 % of stock's mean where that spread "
    "is smaller"
)


def epoch_table(curves: dict, names: list[str], digits: list[int]) -> list[str]:
    """Rows of chosen epochs: every configuration's metrics, mean ± std over seeds."""
    n = min(v[0].shape[1] for v in curves.values())
    marks = sorted({0, 1, 2, 4, 9, 14, 19, 24, 29, 34, 39, 49, n - 1} & set(range(n)))
    head = " | ".join(f"{name} {c}" for c in curves for name in names)
    lines = [f"| epoch | {head} |", "|---|" + "---|" * (len(names) * len(curves))]
    for ep in marks:
        cells = [mean_std(v[:, ep], d) for vals in curves.values() for v, d in zip(vals, digits)]
        lines.append(f"| {ep + 1} | " + " | ".join(cells) + " |")
    return lines


def seeds_of(res: dict, sep: str = ", ") -> str:
    """The seeds of every run of ``res``, sorted, joined by ``sep``."""
    return sep.join(map(str, sorted({r["seed"] for rs in res.values() for r in rs})))


def part_command(info: dict, part: str, res: dict) -> str:
    """The command that makes every run of the report (with all its seeds)."""
    base = info.get(f"{part}_command", f"python -m benchmarks.convergence {part}")
    return f"{base} --seeds {seeds_of(res, ' ')}"


def tables_of(
    finals: dict, columns: list[str], digits: list[int], what: str, curves: dict, names, caption
) -> list[dict]:
    """The record's tables of a part: the final values, the target against stock (when there
    is one), and the per-epoch curves, each printed as it is made."""
    out = [markdown_table("final", final_table(finals, columns, digits), what)]
    target = target_table(finals, columns)
    if target:
        out.append(markdown_table("target", target, TARGET))
    out.append(markdown_table("epochs", epoch_table(curves, names, digits), caption))
    for t in out:
        print(f"\n{t['caption']}:\n")
        print("\n".join(record_lines(t)))
    return out


def record_lines(t: dict) -> list[str]:
    """A record's table as markdown lines (to print it)."""
    return [
        "| " + " | ".join(t["columns"]) + " |",
        "|" + "---|" * len(t["columns"]),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in t["rows"]),
    ]


def mace_report(res: dict, info: dict, out) -> dict:
    """The MACE part's record: final errors by subset, the target, the curves and their plot."""
    finals = {}
    for config, rs in res.items():
        cols = []
        for which in ("all", "small", "large"):
            vals = np.array([subset_rmse(r["final"], which) for r in rs]) * 1e3
            cols += [vals[:, 0].tolist(), vals[:, 1].tolist()]
        finals[config] = cols
    curves = energy_force_curves(res)
    picture = picture_path("convergence_mace.png", out)
    plot_curves(
        curves, ("validation RMSE E (meV/atom)", "validation RMSE F (meV/Å)"), "MACE", picture
    )
    steps = {c: sorted({r["steps_per_epoch"] for r in rs}) for c, rs in res.items()}
    return dict(
        title="Training quality with binpack: MACE",
        description=info.get("mace_workload", ""),
        tables=tables_of(
            finals,
            [
                "E all",
                "F all",
                "E smallest third",
                "F smallest third",
                "E largest third",
                "F largest third",
            ],
            [1, 1] * 3,
            "the model mace saves (lowest validation loss) evaluated structure by structure: "
            "RMSE of the energy per atom (E, meV/atom) and of the force components (F, meV/Å) "
            "on the validation set and on its third with the fewest and the most atoms; mean ± "
            f"sample std over seeds {seeds_of(res)}",
            curves,
            ["E", "F"],
            "per epoch, mace's own validation RMSE on the whole set (E meV/atom, F meV/Å), mean "
            "± std over seeds",
        ),
        notes=[
            "Optimizer steps per epoch: "
            + "; ".join(f"{LABELS[c]} {'/'.join(map(str, v))}" for c, v in steps.items())
            + "."
        ],
        picture=picture,
        command=part_command(info, "mace", res),
    )


def energy_force_curves(res: dict) -> dict:
    """Per configuration, the (seeds, epochs) curves of ``rmse_e_per_atom`` and ``rmse_f`` in
    milli-units."""
    return {
        c: (curve(rs, "rmse_e_per_atom") * 1e3, curve(rs, "rmse_f") * 1e3) for c, rs in res.items()
    }


def nequip_report(res: dict, info: dict, out) -> dict:
    """The NequIP part's record: nequip's validation RMSE after the last epoch and per epoch."""
    finals = {
        c: [
            [r["epochs"][-1]["rmse_e_per_atom"] * 1e3 for r in rs],
            [r["epochs"][-1]["rmse_f"] * 1e3 for r in rs],
        ]
        for c, rs in res.items()
    }
    curves = energy_force_curves(res)
    picture = picture_path("convergence_nequip.png", out)
    plot_curves(
        curves, ("validation RMSE E (meV/atom)", "validation RMSE F (meV/Å)"), "NequIP", picture
    )
    return dict(
        title="Training quality with binpack: NequIP",
        description=info.get("nequip_workload", ""),
        tables=tables_of(
            finals,
            ["E", "F"],
            [1, 1],
            "nequip's validation RMSE (its val_metrics) after the last epoch, energy per atom "
            f"(E, meV/atom) and force components (F, meV/Å); mean ± sample std over seeds "
            f"{seeds_of(res)}",
            curves,
            ["E", "F"],
            "per epoch, nequip's validation RMSE (E meV/atom, F meV/Å), mean ± std over seeds",
        ),
        notes=[],
        picture=picture,
        command=part_command(info, "nequip", res),
    )


def hydragnn_report(res: dict, info: dict, out) -> dict:
    """The HydraGNN part's record: the example's validation loss after the last epoch and per
    epoch."""
    finals = {c: [[r["epochs"][-1]["val_loss"] * 1e3 for r in rs]] for c, rs in res.items()}
    curves = {c: (curve(rs, "val_loss") * 1e3,) for c, rs in res.items()}
    picture = picture_path("convergence_hydragnn.png", out)
    plot_curves(curves, ("validation loss (MSE, x 1e-3)",), "HydraGNN example", picture)
    return dict(
        title="Training quality with binpack: the HydraGNN example",
        description=(
            "examples/hydragnn as it is (EGNN, hidden 64, 3 layers; the energy per atom of "
            f"{info.get('hydragnn_num', 400)} EMT molecules and metal clusters of 3..300 atoms, "
            "80 % for training; batch size 8 per rank; binpack cost=edges), 2 MPI ranks. The seed "
            "orders the training set and seeds the packing; HydraGNN seeds its model itself"
        ),
        tables=tables_of(
            finals,
            ["validation loss (x 1e-3)"],
            [3],
            "HydraGNN's validation loss (its own definition: the MSE of the energy per atom, per "
            f"graph) after the last epoch, mean ± sample std over seeds {seeds_of(res)}",
            curves,
            ["loss"],
            "per epoch, validation loss x 1e-3, mean ± std over seeds",
        ),
        notes=[],
        picture=picture,
        command=part_command(info, "hydragnn", res),
    )


def plot_curves(curves: dict, ylabels, title: str, path: Path) -> None:
    """Mean over seeds (line) and min..max (band) of each configuration, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(ylabels)
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.6))
    axes = np.atleast_1d(axes)
    for k, (ax, ylabel) in enumerate(zip(axes, ylabels)):
        for config, values in curves.items():
            v = values[k]
            x = np.arange(1, v.shape[1] + 1)
            ax.plot(x, v.mean(axis=0), label=LABELS[config])
            ax.fill_between(x, v.min(axis=0), v.max(axis=0), alpha=0.2)
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{title}: validation error per epoch (mean over seeds, band: min..max)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


def report(args) -> int:
    """Tables and plots of whatever runs finished under ``--work``: one record per part
    (``convergence_<part>``: the final errors, the target against stock, the per-epoch curves)
    and its plot (``convergence_<part>.png``), in ``--out``."""
    work = Path(args.work)
    meta = work / "meta.json"
    info = json.loads(meta.read_text()) if meta.exists() else {}
    made = 0
    for part, make in (
        ("mace", mace_report),
        ("hydragnn", hydragnn_report),
        ("nequip", nequip_report),
    ):
        res = load_results(work, part)
        if not res:
            continue
        print(f"\n## Training quality: {part}\n")
        rec = make(res, info, args.out)
        notes = list(rec["notes"])
        loads = info.get("loads", {}).get(part)
        if loads:
            notes.append(
                f"1-minute load average of the machine when the runs started: {min(loads):.1f}.."
                f"{max(loads):.1f}. The errors do not depend on it (the run times do)."
            )
        notes.append(
            "The figures are errors, not times: they do not depend on the machine's load. "
            "Every run is resumable, one seed or configuration at a time (--seeds S --only "
            "CONFIG); python -m benchmarks.convergence report makes the tables and the plot."
        )
        write_record(
            f"convergence_{part}",
            rec["title"],
            rec["tables"],
            description=rec["description"],
            notes=notes,
            picture=rec["picture"],
            out=args.out,
            command=rec["command"],
        )
        made += 1
    if not made:
        raise SystemExit(
            f"no finished runs under {work}: run python -m benchmarks.convergence mace (or "
            "hydragnn, nequip) with the same --work first"
        )
    return 0


def save_meta(args, part: str, argv: list[str]) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    meta = work / "meta.json"
    info = json.loads(meta.read_text()) if meta.exists() else {}
    # without the run selection (--seeds, --only, --force): the command that makes every run
    kept, skipping = [], False
    for a in argv[1:]:
        if a.startswith("--"):
            skipping = a.split("=")[0] in ("--seeds", "--only")
            if skipping or a == "--force":
                continue
        elif skipping:
            continue
        kept.append(a)
    info[f"{part}_command"] = command_line([part, *kept])
    if part == "mace":
        info["mace_workload"] = (
            f"{args.n_train} training / {args.n_valid} validation structures (EMT: CuNi bulk "
            f"cells, slabs and clusters of 1..{args.max_atoms} atoms, about 20 % H/C/N/O molecules "
            f"of 2..14 atoms), ScaleShiftMACE {args.hidden}, max_L 1, max_ell 2, correlation 2, 2 "
            f"interactions, r_max {args.r_max}, radial MLP [16, 16], float64, fused kernels in "
            "every configuration (equal to mace's to round-off), --loss weighted (energy weight "
            f"{args.energy_weight}, forces weight {args.forces_weight}), --batch_size "
            f"{args.batch_size} per rank (binpack: its default capacity, batch size x mean atoms), "
            f"Adam lr {args.lr} decaying exponentially to {args.final_lr_factor:g} x over "
            f"{args.epochs} epochs, 2 MPI ranks x 1 thread."
        )
    elif part == "nequip":
        info["nequip_workload"] = (
            f"{args.n_train} training / {args.n_valid} validation CuNi structures of "
            f"1..{args.max_atoms} atoms (cfm_plugins.datasets.cuni: bulk, slabs, clusters; EMT), "
            f"NequIP GNN (cfm_plugins.datasets.nequip_config: {args.features} features, l_max 1, 2 "
            f"layers, r_max 4.0, float64, EnergyForceLoss), batch_size {args.batch_size} per rank, "
            f"Adam lr {args.lr}, {args.epochs} epochs, 2 MPI ranks x 1 thread."
        )
    else:
        info["hydragnn_num"] = args.num
    info.setdefault("loads", {}).setdefault(part, []).append(round(os.getloadavg()[0], 1))
    meta.write_text(json.dumps(info, indent=1))


#: per part: the defaults of the options that differ between trainers
PART_DEFAULTS = {
    "mace": dict(epochs=40, n_train=120, n_valid=60, max_atoms=300, batch_size=4, lr=0.01),
    "hydragnn": dict(epochs=30),
    "nequip": dict(epochs=30, n_train=60, n_valid=30, max_atoms=300, batch_size=4, lr=0.005),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["mace", "hydragnn", "nequip", "report"])
    p.add_argument(
        "--work",
        default=DEFAULT_WORK,
        metavar="DIR",
        help=f"folder of the runs and their results (default {DEFAULT_WORK})",
    )
    add_out_argument(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument(
        "--only", default=",".join(CONFIGS), help="configurations to run: " + ", ".join(CONFIGS)
    )
    p.add_argument("--force", action="store_true", help="redo runs that have a result")
    p.add_argument("--epochs", type=int, default=None, help="MACE 40, HydraGNN 30, NequIP 30")
    p.add_argument("--n-train", type=int, default=None, help="MACE 120, NequIP 60")
    p.add_argument("--n-valid", type=int, default=None, help="MACE 60, NequIP 30")
    p.add_argument("--max-atoms", type=int, default=None, help="300")
    p.add_argument(
        "--batch-size", type=int, default=None, help="graphs per rank of the stock batches: 4"
    )
    p.add_argument("--lr", type=float, default=None, help="MACE 0.01, NequIP 0.005")
    # MACE
    p.add_argument("--hidden", default="16x0e+16x1o")
    p.add_argument("--r-max", type=float, default=4.0)
    p.add_argument("--final-lr-factor", type=float, default=0.1)
    p.add_argument("--energy-weight", type=float, default=10.0)
    p.add_argument("--forces-weight", type=float, default=10.0)
    # HydraGNN
    p.add_argument(
        "--num", type=int, default=400, help="HydraGNN: structures in the example's data set"
    )
    # NequIP
    p.add_argument("--features", type=int, default=16)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.only = [c for c in args.only.split(",") if c]
    unknown = set(args.only) - set(CONFIGS)
    if unknown:
        p.error(
            f"--only: unknown configuration(s) {', '.join(sorted(unknown))}; choose from "
            f"{', '.join(CONFIGS)}"
        )
    if args.part == "report":
        return report(args)
    for key, value in PART_DEFAULTS[args.part].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    save_meta(args, args.part, argv)
    {"mace": mace_part, "hydragnn": hydragnn_part, "nequip": nequip_part}[args.part](args)
    print(
        f"done; python -m benchmarks.convergence report --work {args.work} writes the records "
        "and the plots",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
