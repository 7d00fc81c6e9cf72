"""MACE on the GPU end to end: stock e3nn vs cuEquivariance vs cfm-plugins, ratios in one run.

    python -m benchmarks.gpu_mace --device cuda                       # the full tables (a GPU)
    python -m benchmarks.gpu_mace --device cpu --quick --no-epoch     # a smoke run anywhere

The step table (:func:`step_table`): a MACE-MP-medium-like model (:func:`build_model`) on rattled
CuNi fcc cells of ~500 and ~4000 atoms, float32 and float64; inference (energy + forces), the
train step (force training's double backward) and its peak GPU memory per way of :data:`WAYS`,
with ratios to stock's and cuEquivariance's. The epoch table (:func:`epoch_table`, unless
``--no-epoch``): the second epoch of ``mace_run_train`` on the example data set per way of
:data:`EPOCH_WAYS`, against stock, cuEquivariance and cuEquivariance with binpack's batches.
Writes the records ``gpu_mace_step`` and ``gpu_mace_epoch`` (``_quick`` with ``--quick``) to
``--out`` (default ``out/benchmarks/``), the epoch runs' data set and logs to ``--work``.
``python -m benchmarks.gpu_md`` times MD.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.record import add_out_argument, command_line, markdown_table, write_record
from cfm_plugins.static_shapes import COMPILE_BACKENDS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: ways of the step table, run in one process: ``stock`` (mace's e3nn modules); ``cueq``
#: (``mace.cli.convert_e3nn_cueq.run``, conv fusion on CUDA; needs cuequivariance-torch, else
#: reported as missing); ``fused`` (this project's kernels,
#: ``cfm_plugins.ops.patching.patch_model``; ``--fused-kernels NAME ...`` swaps only those, in the
#: step rows and the epoch runs); ``fused+capture`` (the step captured once and replayed on padded
#: static shapes: its row names ``tools/gpu_capture.py``, which checks and times it, also with
#: ``--mode default``: inductor without capture; the epoch table's fused+capture way times it in
#: training)
WAYS = ("stock", "cueq", "fused", "fused+capture")


# ---------------------------------------------------------------------------- the workload
def build_model(dtype, hidden: str, seed: int = 0):
    """The MACE-MP-medium-like model the GPU benchmarks time, in ``dtype``, weights perturbed:
    ScaleShiftMACE, 2 RealAgnosticResidualInteractionBlock layers, hidden irreps ``hidden``
    (``--hidden``, default 128x0e+128x1o), spherical harmonics l<=3, correlation 3, 89 elements,
    radial MLP [64,64,64], 10 Bessel functions, r_max 6 A."""
    import numpy as np

    from cfm_plugins.testing import mace_model

    return mace_model(
        hidden,
        atomic_numbers=range(1, 90),
        atomic_energies=np.linspace(-5.0, -1.0, 89),
        r_max=6.0,
        num_bessel=10,
        avg_num_neighbors=40.0,
        radial_mlp=[64, 64, 64],
        scale=1.0,
        shift=0.0,
        dtype=dtype,
        seed=seed,
        perturb=0.05,
    )


def cuni_atoms(n_atoms: int, seed: int = 0):
    """A rattled CuNi fcc cell (30 % Ni) of about ``n_atoms`` atoms (ase.Atoms, no calculator)."""
    from ase.build import bulk

    reps = max(1, round((n_atoms / 4) ** (1 / 3)))
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((reps, reps, reps))
    rng = np.random.default_rng(seed)
    atoms.symbols[rng.random(len(atoms)) < 0.3] = "Ni"
    atoms.rattle(0.05, seed=seed)
    return atoms


def cuni_cell(n_atoms: int, seed: int = 0):
    """The cell of :func:`cuni_atoms` with its EMT energy and forces: (atoms, energy, forces)."""
    from ase.calculators.emt import EMT

    atoms = cuni_atoms(n_atoms, seed)
    atoms.calc = EMT()
    return atoms, float(atoms.get_potential_energy()), atoms.get_forces()


def make_batch(atoms, r_max: float, dtype, device):
    """mace's own graph construction and collation for one structure, on ``device``."""
    import torch
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable, torch_geometric

    z_table = AtomicNumberTable(list(range(1, 90)))
    config = mace_data.config_from_atoms(atoms)
    graph = mace_data.AtomicData.from_config(config, z_table=z_table, cutoff=r_max)
    batch = torch_geometric.batch.Batch.from_data_list([graph]).to(device)
    out = batch.to_dict()
    for key, value in out.items():
        if torch.is_tensor(value) and value.is_floating_point():
            out[key] = value.to(dtype)
    return out


def workload(n_atoms: int, dtype, device):
    """(atoms, batch, reference energy, reference forces) of the ``n_atoms`` cell on ``device``."""
    import torch

    atoms, e, f = cuni_cell(n_atoms)
    batch = make_batch(atoms, 6.0, dtype, device)
    return (
        atoms,
        batch,
        torch.tensor([e], dtype=dtype, device=device),
        torch.as_tensor(f, dtype=dtype, device=device),
    )


# ---------------------------------------------------------------------------- the ways
def _has_cueq() -> bool:
    import importlib.util

    return importlib.util.find_spec("cuequivariance_torch") is not None


def check_kernel_options(fused_kernels, kernels_also) -> None:
    """A ValueError naming a misspelt kernel of ``--fused-kernels`` (None: auto) or of a comma
    list of ``--kernels-also``, before any model is built."""
    from cfm_plugins.ops.kernel_table import check_kernels

    check_kernels(fused_kernels or (), "--fused-kernels")
    for value in kernels_also:
        check_kernels(value.split(","), f"--kernels-also {value}")


def prepare(way: str, stock, device, kernels=None):
    """The model for ``way``, or the reason it cannot run here (a string); the fused way swaps
    the kernels named in ``kernels`` (default: every registered kernel)."""
    if way == "stock":
        return stock
    if way == "cueq":
        if not _has_cueq():
            return "cuequivariance-torch not installed: pip install 'cfm-plugins[bench]'"
        from mace.cli.convert_e3nn_cueq import run as to_cueq

        return to_cueq(copy.deepcopy(stock), device=device.type).to(device)
    if way == "fused":
        from cfm_plugins.ops.patching import patch_model

        model = copy.deepcopy(stock)
        patch_model(model, kernels)
        return model
    if way == "fused+capture":
        return "see tools/gpu_capture.py (the captured static step: exactness, syncs, timing)"
    raise ValueError(f"unknown way {way!r}; choose from {', '.join(WAYS)}")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the GPU running out of memory: ``torch.cuda.OutOfMemoryError``, or the
    RuntimeError TorchScript wraps it in (e3nn's scripted tensor product: stock's conv TP at 32000
    nodes on an H100 ended the run with one)."""
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in str(exc)


def timed(fn, reps: int, warmup: int, device) -> float:
    """Median wall time of ``fn`` in seconds (synchronised on CUDA)."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def train_step(model, batch, e_ref, f_ref):
    """Energy + forces, a loss on both against the references, ``backward()`` (force training's
    double backward); the loss."""
    model.zero_grad(set_to_none=True)
    out = model(dict(batch), training=True, compute_force=True)
    loss = ((out["energy"] - e_ref) ** 2).mean() + ((out["forces"] - f_ref) ** 2).mean()
    loss.backward()
    return loss


def measure(model, batch, e_ref, f_ref, reps: int, warmup: int, device) -> dict:
    """One way's step row: ``inference`` (energy + forces, ``model(batch, compute_force=True)``, as
    an MD step does) and ``train`` (:func:`train_step` against the EMT labels), each the median of
    ``reps`` synchronised steps after ``warmup`` warm-up steps (:func:`timed`); the train step's
    peak GPU memory (``torch.cuda.max_memory_allocated``); the energy and forces, which the table
    compares with stock's."""
    import torch

    def inference():
        out = model(dict(batch), training=False, compute_force=True)
        return out["energy"], out["forces"]

    row = {"inference_s": timed(inference, reps, warmup, device)}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    row["train_s"] = timed(lambda: train_step(model, batch, e_ref, f_ref), reps, warmup, device)
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    energy, forces = inference()
    row["energy"], row["forces"] = energy.detach(), forces.detach()
    return row


def expand_ways(ways, backends, device) -> list[tuple[str, str | None]]:
    """(way label, kernel backend) pairs: the fused ways once per backend on CUDA."""
    out = []
    for way in ways:
        if way == "fused" and device.type == "cuda":
            out += [(f"{way}[{b}]", b) for b in backends]
        else:
            out.append((way, None))
    return out


@contextlib.contextmanager
def pinned_env(env: dict | None):
    """The debug switches of ``env`` (environment variables, :mod:`cfm_plugins.ops._debug`) set
    inside the block and read again there, as they were after it (nothing if ``env`` is None)."""
    from cfm_plugins.ops import _debug

    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    _debug.reread()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _debug.reread()


@contextlib.contextmanager
def pinned_tiles(value: str | None):
    """The Triton tiles ``value`` (the ``fused_tiles`` option's syntax) pinned inside the block,
    the tiles pinned before restored after it (nothing if ``value`` is None)."""
    from cfm_plugins.ops import configure

    if value is None:
        yield
        return
    previous = configure(tiles=value)
    try:
        yield
    finally:
        configure(**previous)


def check_tiles(values) -> None:
    """Each ``--tiles-also`` value parses as the ``fused_tiles`` option would, before any model
    is built (a typo found after the first rows would cost a GPU call)."""
    from cfm_plugins.ops.triton import configs

    for value in values:
        try:
            configs.parse_tiles(value)
        except ValueError as exc:
            raise SystemExit(
                f"--tiles-also {value!r}: {exc}; expected {configs.TILES_SYNTAX}"
            ) from None


STEP_HEADER = (
    "| dtype | atoms | edges | way | inference ms | train ms | train vs stock | peak GiB (train) "
    "| max abs dF vs stock | inference vs cueq | train vs cueq |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
)


def step_rows(group: list[tuple[str, dict | str]]) -> list[str]:
    """The rows of one dtype and size: each way's times and peak, and its ratios to stock's and to
    cuEquivariance's rows of the same group, whichever ran first, "-" where either has no time; a
    way that could not run says why."""
    rows = {row["way"]: row for _, row in group if isinstance(row, dict)}
    base, cq = rows.get("stock"), rows.get("cueq")

    def ratio(row, key, ref):
        return f"{row[key] / ref[key]:.2f}x" if ref else "-"

    lines = []
    for label, row in group:
        if isinstance(row, str):
            lines.append(f"{label} - | - | - | - | - | - | {row} |")
            continue
        de = f"{float((row['forces'] - base['forces']).abs().max()):.1e}" if base else "-"
        peak = f"{row['peak_gib']:.2f}" if row["peak_gib"] is not None else "-"
        lines.append(
            f"{label} {row['inference_s'] * 1e3:.1f} | {row['train_s'] * 1e3:.1f} | "
            f"{ratio(row, 'train_s', base)} | {peak} | {de} | {ratio(row, 'inference_s', cq)} | "
            f"{ratio(row, 'train_s', cq)} |"
        )
    return lines


def step_table(args, device) -> list[str]:
    """The step table (:data:`STEP_HEADER`, :func:`step_rows`) per dtype, size and way, each row
    printed as it is measured. On CUDA, ``--backend cuda triton`` runs the fused way once per
    kernel backend of the ``cfm::`` operators (``fused[cuda]``: the C++ CUDA kernels;
    ``fused[triton]``: the Triton kernels generated from the same descriptors,
    ``cfm_plugins.ops.triton``). More fused Triton rows, in the same process:

    - ``--tiles-also VALUE ...``: one per value, run with those tiles pinned (the ``fused_tiles``
      option's value, ``cfm_plugins.ops.configure(tiles=VALUE)``: tiles a sweep found, or another
      candidate), so that tiles are compared in one run against cuEquivariance (the last column);
    - ``--zero-filled-also``: one run with the debug switch ``CFM_PLUGINS_TRITON_UNFILLED=0`` (the
      conv TP zero-fills every output first, also those its kernels store whole, which the
      default leaves unfilled): what skipping that fill saves;
    - ``--kernels-also A,B ...``: one per comma list, swapping those kernels, e.g. the skip
      connection's GPU kernel (which runs only when named) beside the default row.
    """
    import mace  # noqa: F401
    import torch

    from cfm_plugins.ops import _backend
    from cfm_plugins.ops._debug import UNFILLED_ENV

    lines = list(STEP_HEADER)
    # (row label, way, kernel backend, pinned tiles or None, debug switches of the row or None,
    # the kernels the fused row swaps)
    kernels = args.fused_kernels
    ways = [
        (label, label.split("[")[0], backend, None, None, kernels)
        for label, backend in expand_ways(args.ways, args.backends, device)
    ]
    fused_triton = "fused[triton]" if device.type == "cuda" else "fused"
    ways += [
        (f"{fused_triton} tiles {v}", "fused", "triton", v, None, kernels) for v in args.tiles_also
    ]
    ways += (
        [(f"{fused_triton} zero-filled", "fused", "triton", None, {UNFILLED_ENV: "0"}, kernels)]
        if args.zero_filled_also
        else []
    )
    ways += [
        (f"{fused_triton} kernels {v}", "fused", "triton", None, None, v.split(","))
        for v in args.kernels_also
    ]
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        stock = build_model(dtype, args.hidden).to(device)
        for n_atoms in args.atoms:
            atoms, batch, e_ref, f_ref = workload(n_atoms, dtype, device)
            n_edges = batch["edge_index"].shape[1]
            group: list[
                tuple[str, dict | str]
            ] = []  # (row label, measured row or why there is none)
            for label_way, way, backend, tiles, env, named in ways:
                if backend is not None:
                    _backend.set_gpu_backend(backend)
                model = prepare(way, stock, device, named)
                label = f"| {dtype_name} | {len(atoms)} | {n_edges} | {label_way} |"
                if isinstance(model, str):
                    group.append((label, model))
                else:
                    try:
                        with pinned_tiles(tiles), pinned_env(env):
                            row = measure(
                                model, batch, e_ref, f_ref, args.reps, args.warmup, device
                            )
                        group.append((label, dict(row, way=way)))
                    except RuntimeError as exc:
                        if not out_of_memory(exc):
                            raise
                        group.append((label, "out of memory"))
                    del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(
                    step_rows(group)[-1], flush=True
                )  # its row, with the ratios to the rows run before it
            lines += step_rows(group)
    return lines


# ---------------------------------------------------------------------------- mace_run_train epochs
_EPOCH_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) INFO: (Initial|Epoch (\d+)):")


def epoch_seconds(log_text: str, epoch: int) -> float | None:
    """Seconds between mace's validation lines of ``epoch - 1`` (or "Initial") and ``epoch``."""
    stamps: dict[int, dt.datetime] = {}
    for line in log_text.splitlines():
        m = _EPOCH_LINE.match(line)
        if m:
            key = -1 if m.group(2) == "Initial" else int(m.group(3))
            stamps.setdefault(key, dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f"))
    if epoch not in stamps or epoch - 1 not in stamps:
        return None
    return (stamps[epoch] - stamps[epoch - 1]).total_seconds()


def run_logged(cmd: list[str], env: dict, timeout: float | None) -> tuple[str, int | None]:
    """(stdout and stderr, exit code) of ``cmd``; past ``timeout`` seconds its whole process group
    (mpirun and its ranks) is stopped and the code is None, the output so far kept (how far it
    got)."""
    import signal

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        return proc.communicate(timeout=timeout)[0], proc.returncode
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                return proc.communicate(timeout=10)[0], None
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                break
        return proc.communicate()[0], None


def epoch_data(folder: Path, structures: int, max_atoms: int = 500) -> dict[str, Path]:
    """The epochs' data set in ``folder``: made once per size (a GPU call spent ~30 s making 300
    structures), and found again by a later run with the same ``--work`` and sizes."""
    from cfm_plugins.datasets.cuni import make_dataset

    params = dict(
        n_train=structures, n_valid=max(4, structures // 10), n_test=2, seed=0, max_atoms=max_atoms
    )
    stamp = folder / "made_with.json"
    files = {name: folder / f"{name}.xyz" for name in ("train", "valid", "test", "cell512")}
    if (
        stamp.exists()
        and json.loads(stamp.read_text()) == params
        and all(f.exists() for f in files.values())
    ):
        print(f"data set: {folder} (made before, {structures} structures)", flush=True)
        return files
    files = make_dataset(folder, **params)
    stamp.write_text(json.dumps(params))
    return files


def epoch_table(args, device) -> tuple[list[str], list[str]]:
    """The epochs' table (:func:`epoch_rows`) and, where fused+static ran, its compile table
    (:func:`compile_rows`; else empty).

    ``mace_run_train`` on the example data set (:func:`epoch_data`: ``--epoch-structures`` CuNi
    structures of 4 to ``--epoch-max-atoms`` atoms, cfm_plugins.datasets.cuni), once per way of
    ``--epoch-ways`` (:data:`EPOCH_WAYS`; default stock, ``--enable_cueq=True`` and ``mpirun -np
    1 cfm-run --enable mace,binpack,fused``; the commands of :func:`epoch_commands`, the fused
    ways once per ``--backend`` with ``-o fused_backend=...``). A way's time is its second epoch
    (train + validation), read from the timestamps of mace's own "Epoch N" lines
    (:func:`epoch_seconds`); a fused+static run goes on for ``--static-epochs`` epochs, every one
    timed."""
    from cfm_plugins.testing import mpirun_command

    out = Path(args.work)
    files = epoch_data(out / "data", args.epoch_structures, args.epoch_max_atoms)
    mpirun = mpirun_command(1)
    common = [
        "--model=MACE",
        f"--hidden_irreps={args.hidden}",
        "--r_max=6.0",
        "--max_L=1",
        "--correlation=3",
        "--num_interactions=2",
        "--batch_size=8",
        "--valid_batch_size=8",
        f"--device={device.type}",
        "--default_dtype=float32",
        f"--train_file={files['train']}",
        f"--valid_file={files['valid']}",
        "--E0s=isolated",
        "--energy_key=REF_energy",
        "--forces_key=REF_forces",
        "--stress_key=REF_stress",
        "--seed=1",
        "--eval_interval=1",
        "--num_workers=0",
    ]
    ways = epoch_commands(
        args.epoch_ways, args.backends, device, mpirun, args.fused_kernels, args.compile_backend
    )
    timeouts = epoch_timeouts(args.epoch_timeout, args.epoch_ways, ways)
    results: dict = {}  # label -> seconds of its second epoch, or why there are none
    compiled: dict = {}  # label of a fused+static run -> every epoch's seconds
    env = dict(
        os.environ, PYTHONUNBUFFERED="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    )
    for label, cmd in ways.items():
        if label.startswith("cueq") and not _has_cueq():
            results[label] = "cuequivariance-torch not installed: pip install 'cfm-plugins[bench]'"
            print(epoch_rows(results)[-1], flush=True)
            continue
        static = epoch_way(label) == "fused+static"
        epochs = args.static_epochs if static else 2
        run = out / label.replace("+", "_").replace("[", "_").replace("]", "")
        run.mkdir(parents=True, exist_ok=True)
        full = cmd + common + [f"--max_num_epochs={epochs}", f"--name={run.name}"]
        full += [f"--work_dir={run}", f"--model_dir={run}"]
        print("$", " ".join(full), flush=True)
        text, rc = run_logged(full, env, timeouts[label])
        (run / "train.log").write_text(text)
        # the second epoch is over once its validation line is logged: a run stopped later still
        # counts
        seconds = epoch_seconds(text, 1) if rc in (0, None) else None
        if seconds is None:
            why = f"timed out after {timeouts[label]:g} s" if rc is None else f"failed (rc {rc})"
            seconds = f"{why}, see {run / 'train.log'}"
        results[label] = seconds
        if static:
            compiled[label] = [epoch_seconds(text, e) for e in range(epochs)]
        print(epoch_rows(results)[-1], flush=True)  # its row so far (stock runs first)
    return epoch_rows(results), compile_rows(compiled, results) if compiled else []


def compile_rows(compiled: dict, results: dict) -> list[str]:
    """Where ``compile=default`` is repaid: per fused+static run (label -> each epoch's seconds,
    None for an epoch not logged), its first epoch (which compiles), the median of its later
    epochs, the uncompiled fused+binpack run's second epoch of the same backend, and after how
    many epochs the compiled run's total is the smaller:
    ``first + (n - 1) later <= n uncompiled``, i.e. ``n >= (first - later) / (uncompiled -
    later)``."""
    lines = [
        "| way | epochs timed | epoch 1 s (compiles) | later epochs s (median) | fused+binpack "
        "epoch 2 s | repaid after |",
        "|---|---|---|---|---|---|",
    ]
    for label, seconds in compiled.items():
        tag = label[len(label.split("[")[0]) :]
        base = results.get("fused+binpack" + tag)
        timed_ = [t for t in seconds if t is not None]
        first = seconds[0] if seconds else None
        later = [t for t in seconds[1:] if t is not None]
        steady = statistics.median(later) if later else None
        if first is None or steady is None or not isinstance(base, float):
            pays = "-"
        elif steady >= base:
            pays = "never (no faster per epoch)"
        else:
            pays = f"{max(1, math.ceil((first - steady) / (base - steady)))} epochs"
        shown = [
            f"{x:.2f}" if isinstance(x, float) else "-"
            for x in (first, steady, base if isinstance(base, float) else None)
        ]
        lines.append(f"| {label} | {len(timed_)} | {' | '.join(shown)} | {pays} |")
    return lines


def epoch_rows(results: dict) -> list[str]:
    """The epochs' table: each way's second epoch (seconds, or why there is none) and its ratio to
    stock's, to cuEquivariance's and to cuEquivariance's with binpack's batches in the same run,
    "-" where either has no time."""

    def ratio(seconds, base):
        return (
            f"{seconds / base:.2f}x"
            if isinstance(seconds, float) and isinstance(base, float)
            else "-"
        )

    lines = [
        "| way | epoch 2 (train + validation) s | vs stock | vs cueq | vs cueq+binpack |",
        "|---|---|---|---|---|",
    ]
    for way, seconds in results.items():
        shown = f"{seconds:.2f}" if isinstance(seconds, float) else seconds
        lines.append(
            f"| {way} | {shown} | {ratio(seconds, results.get('stock'))} | "
            f"{ratio(seconds, results.get('cueq'))} | "
            f"{ratio(seconds, results.get('cueq+binpack'))} |"
        )
    return lines


def epoch_timeouts(given, ways, commands) -> dict:
    """Seconds per run of ``commands`` (label -> command): ``given`` is None (no limit), one
    value for every run, or one value per way of ``ways`` (a fused way's value for each of its
    backends)."""
    if given is None or len(given) == 1:
        return {label: given[0] if given else None for label in commands}
    if len(given) != len(ways):
        raise ValueError(
            f"--epoch-timeout: give one value, or one per epoch way ({len(ways)}: "
            f"{' '.join(ways)}), got {len(given)}"
        )
    per_way = dict(zip(ways, given))
    return {label: per_way[epoch_way(label)] for label in commands}


#: ways of the epoch table: stock mace; ``cfm-run --enable mace,binpack`` (binpack's batches,
# stock kernels); mace's cuEquivariance, alone and with binpack's batches; ``cfm-run --enable
# mace,binpack,fused`` (``fused``, labelled fused+binpack); the kernels with mace's own batches
# (``fused-only``: ``--enable mace,fused``); binpack + fused + ``static`` with the step compiled by
# inductor's default mode, no capture (``fused+static``, over ``--static-epochs`` epochs: where its
# compile is repaid); and the same compiled and captured (``fused+capture``: CUDA graphs;
# inductor's default mode on a CPU, where there are no graphs to capture)
EPOCH_WAYS = (
    "stock",
    "stock+binpack",
    "cueq",
    "cueq+binpack",
    "fused",
    "fused-only",
    "fused+static",
    "fused+capture",
)

#: the label of each fused way's runs (a ``[backend]`` tag follows on CUDA)
_FUSED_LABELS = {
    "fused": "fused+binpack",
    "fused-only": "fused",
    "fused+static": "fused+binpack+static+default",
    "fused+capture": "fused+binpack+static+capture",
}


def epoch_way(label: str) -> str:
    """The way of :data:`EPOCH_WAYS` an epoch row's label belongs to (labels drop the backend
    tag: ``fused+binpack[triton]`` -> ``fused``)."""
    base = label.split("[")[0]
    return {fused: way for way, fused in _FUSED_LABELS.items()}.get(base, base)


def compile_mode(way: str, device_type: str) -> str | None:
    """The ``compile=`` mode of an epoch way's runs: inductor's default mode for fused+static,
    CUDA graphs for fused+capture on CUDA (the default mode on a CPU), None for the eager ways."""
    if way == "fused+capture" and device_type == "cuda":
        return "reduce-overhead"
    return "default" if way in ("fused+static", "fused+capture") else None


def epoch_commands(
    ways, backends, device, mpirun, kernels=None, compile_backend="inductor"
) -> dict[str, list[str]]:
    """Label -> command (before mace_run_train's own arguments) of each epoch way; the fused ways
    once per kernel backend on CUDA, with ``-o fused_kernels=...`` where ``kernels`` names
    them, and the compiled ways with ``-o compile_backend=...`` where it is not inductor."""
    out: dict[str, list[str]] = {}
    for way in ways:
        if way in ("stock", "cueq"):
            out[way] = ["mace_run_train"] + (["--enable_cueq=True"] if way == "cueq" else [])
        elif way in ("stock+binpack", "cueq+binpack"):
            out[way] = mpirun + ["cfm-run", "--enable", "mace,binpack", "--", "mace_run_train"]
            out[way] += ["--enable_cueq=True"] if way.startswith("cueq") else []
        else:
            features = {
                "fused": "mace,binpack,fused",
                "fused-only": "mace,fused",
                "fused+static": "mace,binpack,fused,static",
                "fused+capture": "mace,binpack,fused,static",
            }[way]
            compiled = compile_mode(way, device.type)
            mode = ["-o", f"compile={compiled}"] if compiled else []
            if compiled and compile_backend != "inductor":
                mode += ["-o", f"compile_backend={compile_backend}"]
            for backend in backends if device.type == "cuda" else ["cuda"]:
                tag = f"[{backend}]" if device.type == "cuda" else ""
                named = ["-o", "fused_kernels=" + ",".join(kernels)] if kernels else []
                out[_FUSED_LABELS[way] + tag] = mpirun + [
                    "cfm-run",
                    "--enable",
                    features,
                    "-o",
                    f"fused_backend={backend}",
                    *named,
                    *mode,
                    "--",
                    "mace_run_train",
                ]
    return out


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    cores, threads = os.cpu_count(), torch.get_num_threads()
    return (
        f"CPU ({platform.machine()}, {cores} cores, {threads} threads), torch {torch.__version__}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--atoms", type=int, nargs="+", default=[500, 4000])
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"]
    )
    p.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    p.add_argument(
        "--backend",
        dest="backends",
        nargs="+",
        default=["cuda"],
        choices=["cuda", "triton"],
        help="kernel backends of the fused ways on CUDA: cuda (C++ CUDA kernels), triton "
        "(generated Triton kernels, the default where Triton imports); several give one row each",
    )
    p.add_argument(
        "--tiles-also",
        nargs="+",
        default=[],
        metavar="VALUE",
        help="one more fused Triton row per value, run with those tiles pinned (the fused_tiles "
        "option's syntax, e.g. tp_segment=8x32/w4, the former default), in the same process as "
        "the other rows",
    )
    p.add_argument(
        "--zero-filled-also",
        action="store_true",
        help="one more fused Triton row run with CFM_PLUGINS_TRITON_UNFILLED=0 (the conv TP's "
        "outputs zero-filled first, the former default), in the same process as the other rows",
    )
    p.add_argument(
        "--fused-kernels",
        nargs="+",
        default=None,
        metavar="KERNEL",
        help="the kernels the fused ways swap (default: auto, every kernel the model has; named "
        "kernels also run what only a request naming them runs: the skip connection's GPU "
        "kernel), in the step rows and the epoch runs (-o fused_kernels=...)",
    )
    p.add_argument(
        "--kernels-also",
        nargs="+",
        default=[],
        metavar="K1,K2",
        help="one more fused step row per value, swapping the kernels of that comma list (e.g. "
        "symmetric_contraction,conv_tp,skip_tp: the skip connection's GPU kernel beside the "
        "default row), in the same process as the other rows",
    )
    p.add_argument("--hidden", default="128x0e+128x1o")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--epoch-structures", type=int, default=600)
    p.add_argument(
        "--compile-backend",
        default="inductor",
        choices=COMPILE_BACKENDS,
        help="torch.compile backend of the compiled epoch ways (aot_eager: dynamo's graphs run op "
        "by op, no code generation; a quick check that the ways run, not a timing)",
    )
    p.add_argument(
        "--epoch-max-atoms",
        type=int,
        default=500,
        help="the largest structure of the epochs' data set (atoms)",
    )
    p.add_argument("--no-epoch", action="store_true", help="skip the mace_run_train epoch timings")
    p.add_argument("--no-steps", action="store_true", help="skip the step table (only the epochs)")
    p.add_argument(
        "--epoch-ways",
        nargs="+",
        default=["stock", "cueq", "fused"],
        choices=EPOCH_WAYS,
        help="ways of the epoch table: stock, stock+binpack (binpack's batches, stock kernels), "
        "cueq, cueq+binpack, fused (binpack + the fused kernels), fused-only (the kernels with "
        "mace's batches), fused+static (binpack + fused + static, compile=default, over "
        "--static-epochs epochs), fused+capture (static with compile=reduce-overhead: CUDA graphs; "
        "compile=default on a CPU)",
    )
    p.add_argument(
        "--static-epochs",
        type=int,
        default=5,
        metavar="N",
        help="epochs of a fused+static run (its first compiles; the table says after how many "
        "the compile is repaid against fused+binpack); at least 2",
    )
    p.add_argument(
        "--epoch-timeout",
        type=float,
        nargs="+",
        default=None,
        help="seconds per epoch run: one value for every way, or one per --epoch-ways way; a run "
        "stopped after its second epoch still counts",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke run (hidden 8x0e+8x1o, 32 atoms)",
    )
    p.add_argument(
        "--work",
        default="/tmp/cfm_bench_gpu_mace",
        metavar="DIR",
        help="folder of the epoch runs: data set, logs (default /tmp/cfm_bench_gpu_mace)",
    )
    add_out_argument(p)
    args = p.parse_args(argv)
    command = command_line(argv)
    try:
        epoch_timeouts(
            args.epoch_timeout, args.epoch_ways, {}
        )  # the count, checked before anything runs
    except ValueError as exc:
        p.error(str(exc))
    if args.static_epochs < 2:
        p.error(f"--static-epochs {args.static_epochs}: at least 2 (the first compiles)")
    if args.quick:
        args.atoms, args.hidden, args.reps, args.warmup = [32], "8x0e+8x1o", 1, 1
        args.epoch_structures, args.epoch_max_atoms = 12, 64

    import mace  # noqa: F401
    import torch

    from cfm_plugins.static_shapes.forward import check_compile_mode

    for way in args.epoch_ways:  # the compiled ways' modes, checked before anything runs
        mode = compile_mode(way, torch.device(args.device).type)
        try:
            if mode:
                check_compile_mode(mode, args.device, args.compile_backend)
        except ValueError as exc:
            p.error(f"--epoch-ways {way} with --compile-backend {args.compile_backend}: {exc}")
    check_tiles(args.tiles_also)
    try:  # checked before any model is built
        check_kernel_options(args.fused_kernels, args.kernels_also)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda but torch sees no CUDA device: run this on a GPU machine or pass "
            "--device cpu"
        )
    description = (
        f"ScaleShiftMACE {args.hidden}, l<=3, correlation 3, 89 elements, radial MLP [64,64,64], "
        f"r_max 6, 2 layers; rattled CuNi fcc cells of {', '.join(map(str, args.atoms))} atoms "
        f"(30 % Ni), {', '.join(args.dtypes)}; median of {args.reps} steps after {args.warmup} "
        "warm-ups. inference: energy + forces; train: energy + forces, a loss on both, "
        "backward() (force training's double backward)"
    )
    print(
        "\n".join(
            [
                "## MACE on the GPU end to end (benchmarks/gpu_mace.py)",
                "",
                f"Command: `{command}`",
                "",
                f"Device: {device_name(device)}",
                "",
                f"Workload: {description}.",
                "",
            ]
        ),
        flush=True,
    )
    quick = "_quick" if args.quick else ""
    if not args.no_steps:
        steps = step_table(args, device)
        print("\n".join(["", *steps, ""]), flush=True)
        write_record(
            "gpu_mace_step" + quick,
            f"MACE train and inference step on {device_name(device)}",
            [markdown_table("step", steps, STEP_CAPTION)],
            description=description,
            headline=step_headline(steps),
            out=args.out,
            device=device,
            command=command,
        )
    if not args.no_epoch:
        epoch_description = (
            f"mace_run_train on {args.epoch_structures} example CuNi structures "
            f"(4..{args.epoch_max_atoms} atoms, "
            f"EMT), MACE {args.hidden}, max_L 1, correlation 3, r_max 6, float32, batch 8, one "
            "process; the second of 2 epochs (train + validation) from the timestamps of mace's "
            "own log"
        )
        print(f"\n{epoch_description}:\n", flush=True)
        epochs, compiles = epoch_table(args, device)
        print("\n".join(["", *epochs, "", *compiles, ""]), flush=True)
        tables = [
            markdown_table(
                "epoch",
                epochs,
                "seconds of the second epoch (train + validation) per way, and the ratios to "
                "stock's, to cuEquivariance's and to cuEquivariance's with binpack's batches in "
                "the same run",
            )
        ]
        if compiles:
            tables.append(
                markdown_table(
                    "compile",
                    compiles,
                    "binpack + fused + static with compile=default: the first epoch (which "
                    "compiles), the later ones, and after how many epochs its total is below "
                    "fused+binpack's",
                )
            )
        write_record(
            "gpu_mace_epoch" + quick,
            f"MACE training epoch (mace_run_train) on {device_name(device)}",
            tables,
            description=epoch_description,
            headline=epoch_headline(epochs),
            out=args.out,
            device=device,
            command=command,
        )
    return 0


STEP_CAPTION = (
    "per dtype, size and way: inference and train step (ms, median), the train step against "
    "stock's, the train step's peak GPU memory, the largest force difference from stock, and "
    "inference and train against cuEquivariance's in the same run"
)


def step_headline(steps: list[str]) -> dict:
    """The train step of each fused row of the largest size against cuEquivariance's, per dtype
    (where cuEquivariance ran)."""
    rows = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in steps[2:]]
    if not rows:
        return {}
    largest = max(int(r[1]) for r in rows)
    return {
        f"train step vs cueq, {r[0]}, {r[1]} atoms, {r[3]}": r[10]
        for r in rows
        if int(r[1]) == largest and r[3].startswith("fused") and r[10].endswith("x")
    }


def epoch_headline(epochs: list[str]) -> dict:
    """Each fused way's epoch against stock's, cuEquivariance's and cuEquivariance's with binpack
    (where they ran)."""
    out = {}
    for line in epochs[2:]:
        way, _, *ratios = (c.strip() for c in line.strip()[1:-1].split("|"))
        if way.startswith("fused"):
            out |= {
                f"epoch vs {k}, {way}": v for k, v in zip(("stock", "cueq", "cueq+binpack"), ratios)
            }
    return {k: v for k, v in out.items() if v.endswith("x")}


if __name__ == "__main__":
    sys.exit(main())
