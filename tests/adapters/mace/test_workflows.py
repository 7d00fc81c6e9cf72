"""mace_run_train workflows whose loaders or loss binpack must read from mace itself (issue 83):
a validation set of HDF5 shards (a ConcatDataset, as the training set is), multihead fine-tuning
(mace switches the loss to ``universal`` after parsing its arguments), and a validation loss that
does not depend on binpack's batches, the number of ranks or the loss weighting.

Real runs of an unmodified mace_run_train on a tiny CuNi set (10 training, 5 validation
structures, made with EMT at test time, written to HDF5 by mace's own ``mace_prepare_data
--num_process 2``), the smallest model, one epoch, float64. The runs share one seed and mace's
statistics file (``--scaling=no_scaling``), so they start from the same model and every
``Initial:`` evaluation is of that model. Runs are made once per module and read by several tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import BIN, run_mpi, run_process
from tests.helpers.mace_runs import CFM_RUN, make_tiny_set

N_VALID = 5
TINY = [
    "--model=MACE",
    "--hidden_irreps=8x0e",
    "--max_L=0",
    "--correlation=2",
    "--num_interactions=1",
    "--r_max=4.0",
    "--max_num_epochs=1",
    "--batch_size=4",
    "--valid_batch_size=4",
    "--device=cpu",
    "--default_dtype=float64",
    "--seed=7",
    "--eval_interval=1",
    "--num_workers=0",
    "--save_cpu",
    "--lr=0.01",
    "--energy_key=REF_energy",
    "--forces_key=REF_forces",
    "--stress_key=REF_stress",
]


def _run(folder: Path, name: str, ranks: int, options=(), extra=(), plugins=True):
    """``[mpirun -np 2] cfm-run --enable mace,binpack OPTIONS -- mace_run_train`` (or a plain
    mace_run_train with ``plugins=False``) on the HDF5 set, in ``folder/name``: the finished
    process (output in ``.stdout``)."""
    h5 = folder / "h5"
    mace = [
        f"--name={name}",
        f"--train_file={h5 / 'train'}",
        f"--valid_file={h5 / 'val'}",
        f"--statistics_file={h5 / 'statistics.json'}",
        "--scaling=no_scaling",
        *TINY,
        f"--work_dir={folder / name}",
        f"--model_dir={folder / name}",
        *extra,
    ]
    if not plugins:
        command = [str(BIN / "mace_run_train"), *mace]
    else:
        command = [CFM_RUN, "--enable", "mace,binpack", *options, "--", "mace_run_train", *mace]
    return _launch(command, ranks, folder)


def _launch(command: list[str], ranks: int, folder: Path) -> subprocess.CompletedProcess:
    """``command`` on ``ranks`` MPI ranks (one: a plain process) in ``folder``."""
    if ranks > 1:
        return run_mpi(command, np=ranks, timeout=570, cwd=folder)
    return run_process(command, timeout=570, cwd=folder)


def initial_eval(folder: Path, name: str) -> dict:
    """The ``Initial:`` evaluation of run ``name`` as mace wrote it to its results file (full
    precision; mode ``eval``, no epoch)."""
    path = folder / name / "results" / f"{name}_run-7_train.txt"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (first, *_) = [r for r in rows if r["mode"] == "eval" and r["epoch"] is None]
    return first


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The HDF5 set (mace_prepare_data, 2 processes: 2 training and 2 validation shards) and the
    runs: ``per_sample`` and ``stock`` on 2 ranks with different capacities (the first also with
    a test folder), ``per_sample`` on 1 rank, and stock mace on 1 rank with the whole validation
    set in one batch. ``{name: (exit code, output)}`` and the folder."""
    folder = tmp_path_factory.mktemp("mace_workflows")
    make_tiny_set(folder, n_train=10, n_valid=N_VALID)
    prep = run_process(
        [
            str(BIN / "mace_prepare_data"),
            f"--train_file={folder / 'train.xyz'}",
            f"--valid_file={folder / 'valid.xyz'}",
            f"--test_file={folder / 'valid.xyz'}",
            f"--h5_prefix={folder}/h5/",
            "--r_max=4.0",
            "--num_process=2",
            "--energy_key=REF_energy",
            "--forces_key=REF_forces",
            "--stress_key=REF_stress",
            "--compute_statistics",
            "--E0s=isolated",
            "--seed=1",
        ],
        timeout=300,
        cwd=folder,
    )
    assert prep.returncode == 0, prep.stdout[-3000:]
    assert sorted(p.name for p in (folder / "h5" / "val").iterdir()) == ["val_0.h5", "val_1.h5"]
    tests = folder / "tests"  # mace's --test_dir reads the files named *_test.h5
    tests.mkdir()
    for k, shard in enumerate(sorted((folder / "h5" / "test").iterdir())):
        shutil.copy(shard, tests / f"part{k}_test.h5")
    out = {
        "per_sample": _run(
            folder, "per_sample", 2, ["-o", "max_tokens=60"], [f"--test_dir={tests}"]
        ),
        "stock": _run(folder, "stock", 2, ["-o", "max_tokens=48", "-o", "loss_weighting=stock"]),
        "one_rank": _run(folder, "one_rank", 1, ["-o", "max_tokens=100"]),
        "mace": _run(folder, "mace", 1, extra=[f"--valid_batch_size={N_VALID}"], plugins=False),
    }
    for name, res in out.items():
        assert res.returncode == 0, f"{name}:\n{res.stdout[-4000:]}"
    return folder, {k: v.stdout for k, v in out.items()}


def test_mpirun_sharded_hdf5_validation_is_evaluated_as_validation(runs):
    """A validation folder of 2 HDF5 shards (a ConcatDataset in mace) gets a validation loader:
    one fixed plan, not reweighted, not counted as training, every structure once; per_sample and
    stock training report the same validation loss for the same model."""
    folder, logs = runs
    log = logs["per_sample"]
    assert re.search(r"binpack valid: 1 step on each of 2 ranks", log), log[-3000:]
    assert re.search(r"binpack test: \d+ steps? on each of 2 ranks", log), log[-3000:]
    assert not re.search(r"binpack (valid|test): .* repeated", log)
    # the training loader alone is counted, by the epochs trained; the evaluations are not
    assert "binpack balance of the training batches (1 epoch)" in log
    per_sample, stock = initial_eval(folder, "per_sample"), initial_eval(folder, "stock")
    for key in ("loss", "rmse_e_per_atom", "rmse_f", "mae_f"):
        assert _rel(per_sample[key], stock[key]) < 1e-10, (key, per_sample[key], stock[key])


def test_mpirun_validation_loss_is_the_same_on_1_and_2_ranks_any_capacity_and_weighting(runs):
    """The same model's validation loss under binpack does not move with the ranks, max_tokens or
    loss_weighting; it is mace's loss on the whole set as one batch, which stock mace logs divided
    by the number of structures when it evaluates the set in one batch on one rank."""
    folder, _ = runs
    evals = {name: initial_eval(folder, name) for name in ("per_sample", "stock", "one_rank")}
    ref = evals["one_rank"]["loss"]
    for name, row in evals.items():
        assert _rel(row["loss"], ref) < 1e-10, (name, row["loss"], ref)
        assert _rel(row["rmse_f"], evals["one_rank"]["rmse_f"]) < 1e-10
    mace = initial_eval(folder, "mace")
    assert _rel(mace["rmse_f"], evals["one_rank"]["rmse_f"]) < 1e-10  # the same model
    assert _rel(ref, N_VALID * mace["loss"]) < 1e-10, (ref, mace["loss"])


# ---------------------------------------------------------------- fine-tuning a foundation model


@pytest.fixture(scope="module")
def finetuning(runs):
    """Fine-tuning runs (``--dry_run``: mace builds loaders, model and loss, then stops) from the
    stock model trained above, on the xyz set: multihead (mace's default with
    ``--pt_train_file``) with the default weighting on 2 ranks and with an explicit per_sample on
    2 ranks, naive (``--multiheads_finetuning False``) on 1 rank."""
    folder, _ = runs

    def finetune(name, ranks, options=(), extra=()):
        mace = [
            f"--name={name}",
            f"--train_file={folder / 'train.xyz'}",
            f"--valid_file={folder / 'valid.xyz'}",
            "--E0s=isolated",
            f"--foundation_model={folder / 'mace' / 'mace.model'}",
            f"--pt_train_file={folder / 'train.xyz'}",
            *TINY,
            f"--work_dir={folder / name}",
            f"--model_dir={folder / name}",
            "--dry_run",
            *extra,
        ]
        command = [CFM_RUN, "--enable", "mace,binpack", *options, "--", "mace_run_train", *mace]
        return _launch(command, ranks, folder)

    return {
        "multihead": finetune("multihead", 2),
        "explicit": finetune("explicit", 2, ["-o", "loss_weighting=per_sample"]),
        "naive": finetune("naive", 1, extra=["--multiheads_finetuning=False"]),
    }


def test_mpirun_multihead_finetuning_weighs_the_universal_loss_as_documented(finetuning):
    """mace trains multihead fine-tuning with its universal loss: the default per_sample falls back
    to stock (one log line naming the loss), an explicit per_sample is refused (exit 2); naive
    fine-tuning keeps --loss weighted, so per_sample."""
    multihead = finetuning["multihead"]
    assert multihead.returncode == 0, multihead.stdout[-4000:]
    assert "UniversalLoss(" in multihead.stdout
    fallback = re.findall(
        r"binpack loss_weighting=per_sample: mace_run_train's universal loss .*"
        r"--multiheads_finetuning.*: using loss_weighting=stock",
        multihead.stdout,
    )
    assert fallback, multihead.stdout[-4000:]
    assert "binpack loss_weighting=stock: over an epoch" in multihead.stdout
    assert "binpack loss_weighting=per_sample: every graph" not in multihead.stdout

    explicit = finetuning["explicit"]
    assert explicit.returncode == 2, explicit.stdout[-4000:]
    assert re.search(
        r"cfm-run: error: binpack loss_weighting=per_sample: mace_run_train's universal loss "
        r".*set loss_weighting=stock .*\(loss_weighting from cfm-run -o\)",
        explicit.stdout,
    ), explicit.stdout[-4000:]

    naive = finetuning["naive"]
    assert naive.returncode == 0, naive.stdout[-4000:]
    assert "WeightedEnergyForcesLoss(" in naive.stdout
    assert "binpack loss_weighting=per_sample: every graph" in naive.stdout
