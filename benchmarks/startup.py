"""Start-up of a 2-rank binpack run (cost=edges) on a large sharded HDF5 set: the sizes pass.

    .venv/bin/python -m benchmarks.startup                        # 200,000 structures, 8 shards
    .venv/bin/python -m benchmarks.startup --structures 2000      # a smoke run

The sizes pass (edges and data checks) of ``mpirun -np 2 cfm-run --enable mace,binpack -o
cost=edges -- mace_run_train``, cold, with ``cfm-plan``'s cache and with the cache a run wrote,
against the time mace itself needs to read the data once (its average number of neighbours), on
``--structures`` tiny CuNi cells in ``--shards`` files of mace's HDF5 layout (:func:`make_set`).
The three runs are those of :func:`main`, what each times is :func:`run_once`'s. Writes the
record ``startup`` (``startup_quick`` below 200,000 structures) to ``--out`` (default
``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.record import ROOT, add_out_argument, command_line, table, write_record

BIN = Path(sys.executable).parent
FULL = 200_000
R_MAX = 4.0
VALID = 64
E0S = {28: -0.5, 29: -0.3}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) INFO: (.*)$")
_SIZES = re.compile(
    r"\[cfm rank 0\] INFO sizes of the (\w+) data \((.*?)\): (.*); ([0-9.]+) s \(and ([0-9.]+) s "
    r"waiting"
)


def write_shard(path: Path, n: int, distinct: int, seed: int) -> None:
    """``n`` structures in mace's HDF5 layout (what ``mace_prepare_data`` writes:
    ``config_batch_0/config_<i>``, read by mace's ``HDF5Dataset``), written with h5py: tiny CuNi
    cells (2 to 6 atoms, periodic, 4 A cubes) with energies and forces. Only ``distinct`` of them
    are real, the rest are HDF5 hard links to them: making HDF5 objects is slow (about 2,000
    structures a second on a busy core), and mace and the sizes pass read every link as a
    structure of its own (the same cost per structure), so a large set is made in seconds."""
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        f.attrs["drop_last"] = False
        batch = f.create_group("config_batch_0")
        for j in range(min(n, distinct)):
            m = int(rng.integers(2, 7))
            c = batch.create_group(f"config_{j}")
            c["atomic_numbers"] = rng.choice([28, 29], m)
            c["positions"] = rng.random((m, 3)) * 4.0
            c["cell"] = np.eye(3) * 4.0
            c["pbc"] = np.ones(3, bool)
            c["weight"] = 1.0
            c["config_type"] = "Default"
            c["head"] = "Default"
            p = c.create_group("properties")
            p["energy"] = -0.4 * m + 0.01 * rng.normal()
            p["forces"] = rng.normal(size=(m, 3)) * 0.1
            w = c.create_group("property_weights")
            w["energy"] = 1.0
            w["forces"] = 1.0
        for j in range(distinct, n):
            batch[f"config_{j}"] = batch[f"config_{j % distinct}"]


def make_set(folder: Path, n: int, shards: int, distinct: int) -> float:
    """The training folder (``n`` structures in ``shards`` files, :func:`write_shard`) and a
    validation folder of :data:`VALID` structures beside it; the seconds it took."""
    t0 = time.perf_counter()
    for name, total, parts in (("train", n, shards), ("valid", VALID, 1)):
        (folder / name).mkdir(parents=True)
        sizes = [len(x) for x in np.array_split(np.arange(total), parts)]
        for k, size in enumerate(sizes):
            write_shard(folder / name / f"{name}_{k}.h5", size, distinct, seed=k + 100 * len(name))
    return time.perf_counter() - t0


def mace_args(folder: Path, work: Path) -> list[str]:
    """mace_run_train's arguments: the smallest model, given ``--E0s`` and ``--atomic_numbers``
    (no statistics file to compute), its folders in ``work``."""
    return [
        "--name=startup",
        f"--train_file={folder / 'train'}",
        f"--valid_file={folder / 'valid'}",
        f"--E0s={E0S}",
        f"--atomic_numbers={sorted(E0S)}",
        "--model=MACE",
        "--hidden_irreps=8x0e",
        "--max_L=0",
        "--correlation=2",
        "--num_interactions=1",
        f"--r_max={R_MAX}",
        "--max_num_epochs=1",
        "--batch_size=32",
        "--valid_batch_size=32",
        "--device=cpu",
        "--default_dtype=float64",
        "--seed=1",
        "--num_workers=0",
        f"--work_dir={work}",
        f"--model_dir={work}",
        f"--log_dir={work}/logs",
        f"--checkpoints_dir={work}/checkpoints",
        f"--results_dir={work}/results",
    ]


def _env() -> dict:
    from cfm_plugins.testing import clean_env

    return clean_env()


def run_once(folder: Path, work: Path, timeout: float) -> dict:
    """One training run in ``work`` (mace's ``--work_dir``, where the sizes cache is looked up and
    written), stopped once mace has read every training graph: its figures.

    The run is ``mpirun -np 2 cfm-run --enable mace,binpack -o cost=edges -- mace_run_train``
    (:func:`mace_args`), stopped once mace has computed its average number of neighbours: its
    first read of every training graph, through the training loader (the model and training come
    after). ``sizes_s`` is the sum of rank 0's ``sizes of the ... data`` log lines (one per
    loader's pass: mace builds the training loader twice, per head and for all heads, and the
    validation loader once), ``wait_s`` the time those passes waited for the other rank;
    ``mace_s``, mace's own time, is the span of its log lines ``Computing average number of
    neighbors`` to ``Average number of neighbors`` (rank 0); ``startup_s`` is the wall time from
    the launch to the latter."""
    from cfm_plugins.testing import mpirun_command

    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        *mpirun_command(2),
        str(BIN / "cfm-run"),
        "--enable",
        "mace,binpack",
        "-o",
        "cost=edges",
        "--",
        "mace_run_train",
        *mace_args(folder, work),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=work,
        start_new_session=True,
    )
    lines, stamps, sizes, wall = [], {}, [], None
    try:
        for line in proc.stdout:
            line = line.rstrip("\n")
            lines.append(line)
            m = _STAMP.match(line)
            if m:
                when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                if m.group(2).startswith("Computing average number of neighbors"):
                    stamps["mace_start"] = when
                elif m.group(2).startswith("Average number of neighbors"):
                    stamps["mace_end"] = when
                    wall = time.perf_counter() - t0
                    break
            s = _SIZES.search(line)
            if s:
                read = int(s.group(2).rsplit(", ", 1)[1].split()[0])
                sizes.append((s.group(1), read, float(s.group(4)), float(s.group(5))))
            if time.perf_counter() - t0 > timeout:
                break
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if wall is None or "mace_start" not in stamps or not sizes:
        raise RuntimeError(
            "the run did not reach mace's average number of neighbours; its output ends:\n"
            + "\n".join(lines[-40:])
        )
    return {
        "sizes_s": sum(s for _, _, s, _ in sizes),
        "wait_s": sum(w for _, _, _, w in sizes),
        "passes": sizes,
        "mace_s": stamps["mace_end"] - stamps["mace_start"],
        "startup_s": wall,
    }


def run_plan(folder: Path, cache: Path) -> float:
    """Seconds of ``cfm-plan --cache CACHE`` on the training folder: ``cache`` is the run's
    ``--work_dir``, where the run looks for it; it holds the edges and the data checks
    (``cfm-plan`` keeps both for mace's HDF5 files), so that the run reads no structure."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cfm_plugins.plan",
            str(folder / "train"),
            f"--r-max={R_MAX}",
            "--ranks=2",
            "--cost=edges",
            f"--cache={cache}",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise RuntimeError(f"cfm-plan failed:\n{out.stdout[-3000:]}")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--structures", type=int, default=FULL, help=f"default {FULL:,}")
    ap.add_argument("--shards", type=int, default=8, help="HDF5 files of the training set")
    ap.add_argument(
        "--distinct", type=int, default=2000, help="real structures per shard (the rest: links)"
    )
    ap.add_argument("--data", help="make the set in this folder and keep it (default: temporary)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run at most")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    cmd = command_line(argv)
    base = Path(args.data).resolve() if args.data else Path(tempfile.mkdtemp(prefix="cfm_startup_"))
    try:
        folder = base / "h5"
        if folder.exists():
            shutil.rmtree(folder)
        made = make_set(folder, args.structures, args.shards, args.distinct)
        print(f"command: {cmd}\nset made in {made:.1f} s: {folder}", flush=True)
        # cold: no cache, every rank reads its share of every shard once (atoms, labels, elements,
        # geometry) and counts the edges with cfm::count_edges, rank 0 writes the cache; plan
        # cache: after cfm-plan (timed apart, run_plan) wrote its cache where the run looks; run
        # cache: the cache a run wrote. The last two read no structure.
        rows = {}
        rows["cold"] = run_once(folder, base / "cold", args.timeout)
        print("cold:", rows["cold"], flush=True)
        plan_s = run_plan(folder, base / "plan")
        print(f"cfm-plan: {plan_s:.1f} s", flush=True)
        rows["plan cache"] = run_once(folder, base / "plan", args.timeout)
        print("plan cache:", rows["plan cache"], flush=True)
        rows["run cache"] = run_once(folder, base / "plan", args.timeout)
        print("run cache:", rows["run cache"], flush=True)
    finally:
        if not args.data:
            shutil.rmtree(base, ignore_errors=True)
    n = args.structures
    mace_s = float(np.median([r["mace_s"] for r in rows.values()]))
    body = []
    for name, r in rows.items():
        body.append(
            [
                name,
                round(r["startup_s"], 1),
                round(r["sizes_s"], 3),
                round(r["mace_s"], 1),
                f"{100 * r['sizes_s'] / r['mace_s']:.1f}%",
                " + ".join(f"{role} {s:.2f} s ({k} read)" for role, k, s, _ in r["passes"]),
                round(r["wait_s"], 2),
            ]
        )
    columns = [
        "cache",
        "start-up (s)",
        "sizes and checks (s)",
        "mace's read (s)",
        "sizes / mace's read",
        "the passes (rank 0's log)",
        "waiting for the other rank (s)",
    ]
    for row in body:
        print(" | ".join(str(c) for c in row))
    warm = rows["run cache"]
    ratio = warm["sizes_s"] / warm["mace_s"]
    print(
        f"cfm-plan on the training folder: {plan_s:.1f} s; target (run cache) sizes < 10% of "
        f"mace's read: {'PASS' if ratio < 0.1 else 'FAIL'} ({100 * ratio:.1f}%)"
    )
    write_record(
        "startup" if n >= FULL else "startup_quick",
        "Start-up of a 2-rank binpack run (cost=edges) on sharded HDF5: the sizes pass against "
        "mace's own read of the data",
        [
            table(
                "startup",
                columns,
                body,
                "start-up = launch to mace's 'Average number of neighbors' (wall); sizes and "
                "checks = the sum of rank 0's 'sizes of the ... data' passes (two of the training "
                "set, one of the validation set); mace's read = its average-neighbours pass over "
                "the training loader (every training graph built once per rank share)",
            )
        ],
        description=(
            f"{n:,} structures of 2-6 atoms (CuNi, periodic 4 A cells) in {args.shards} HDF5 "
            f"shards of mace's layout ({args.distinct} distinct per shard, the rest hard links), "
            f"{VALID} validation structures; r_max {R_MAX} A; mpirun -np 2, CPU, "
            f"OMP_NUM_THREADS=1; cfm-plan on the training folder took {plan_s:.1f} s"
        ),
        headline={
            "sizes, run cache / mace's read": f"{100 * ratio:.1f}%",
            "sizes, cold (s)": round(rows["cold"]["sizes_s"], 2),
            "sizes, run cache (s)": round(warm["sizes_s"], 3),
            "mace's read (s)": round(mace_s, 1),
        },
        notes=[
            "Timings are noisy where other jobs share the cores; compare within one run.",
            f"Target: with the cache, the sizes part under 10% of mace's read: "
            f"{'PASS' if ratio < 0.1 else 'FAIL'} ({100 * ratio:.1f}%).",
        ],
        out=args.out,
        command=cmd,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
