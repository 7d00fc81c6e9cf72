"""Short runs of a real mace_run_train with the smallest model, under real mpirun where they need
ranks: a validation set smaller than the ranks, ``--restart_latest`` resuming the packed epoch,
the adapter serving the command with nothing enabled, and ``cost=auto`` fitted and resumed. (Kept
apart from test_adapter.py so that the two test workers can share the longest mace files.)"""

from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

from tests.helpers import clean_env, run_mpi, synthetic_step_env
from tests.helpers.mace_runs import CFM_RUN, make_tiny_set, tiny_args


def test_mpirun_validation_set_smaller_than_the_ranks_completes(tmp_path):
    """1 validation structure, 2 ranks: stock mace completes (reporting nan), so must binpack;
    both ranks evaluate the structure (no rank may be empty under DDP), which leaves mace's
    averaged metrics as if it were counted once."""
    make_tiny_set(tmp_path, n_train=8, n_valid=1)
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack",
            "--",
            "mace_run_train",
            *tiny_args(tmp_path, "small", 1),
        ],
        timeout=570,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert out.stdout.count("binpack valid: 1 step on each of 2 ranks") == 2, out.stdout[-4000:]
    assert "every rank evaluates all of them" in out.stdout
    # the balance counts the epoch trained, not mace's other passes over the training loader (its
    # statistics, its final evaluation on the training set): issue 83
    assert "binpack balance of the training batches (1 epoch): planned LIF" in out.stdout, (
        out.stdout[-3000:]
    )
    for label in ("Initial", "Epoch 0"):
        loss = re.search(rf"{label}: head: Default, loss=\s*([0-9.eE+-]+|nan)", out.stdout)
        assert loss and np.isfinite(float(loss.group(1))), out.stdout[-3000:]
    assert (tmp_path / "small.model").exists()


def test_restart_latest_continues_at_the_epoch_mace_resumes(tmp_path):
    """mace --restart_latest restarts at the epoch of its latest checkpoint, from that epoch's
    first batch (checkpoints are written only at epoch ends); the resumed run must pack that
    epoch's batches."""
    make_tiny_set(tmp_path, n_train=24, n_valid=2)
    from cfm_plugins.steplog import read_step_logs

    def train(epochs, log, *extra):
        out = subprocess.run(
            [
                CFM_RUN,
                "--enable",
                "mace,binpack",
                "--",
                "mace_run_train",
                *tiny_args(tmp_path, "resume", epochs),
                "--save_all_checkpoints",
                f"--cfm-step-log={tmp_path / log}",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(),
            timeout=570,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stdout[-4000:]
        return out.stdout, [
            (r["graphs"], r["atoms"]) for r in read_step_logs(str(tmp_path / log))[0]
        ]

    _, first = train(2, "first")  # epochs 0 and 1; a checkpoint after each
    per_epoch = len(first) // 2
    epoch0, epoch1 = first[:per_epoch], first[per_epoch:]
    assert len(first) == 2 * per_epoch and epoch0 != epoch1  # each epoch has its own plan
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("resume*_epoch-*.pt"))
    assert checkpoints and checkpoints[-1].endswith("_epoch-1.pt"), checkpoints

    log, resumed = train(2, "resumed", "--restart_latest")  # mace restarts at epoch 1
    assert re.search(r"Loading checkpoint: .*_epoch-1\.pt", log), log[-3000:]
    assert resumed == epoch1


def test_the_adapter_serving_the_command_is_enabled_so_ranks_train_one_model(tmp_path):
    """`CFM_PLUGINS=',,,'` enables nothing; the mace adapter still serves mace_run_train, so the two
    ranks train one model together (mace's --distributed) instead of two into one directory."""
    make_tiny_set(tmp_path, n_train=6, n_valid=2)
    out = run_mpi(
        [CFM_RUN, "--", "mace_run_train", *tiny_args(tmp_path, "served", 1)],
        timeout=570,
        env=clean_env(CFM_PLUGINS=",,,"),
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert out.stdout.count("turning on mace's --distributed") == 2, out.stdout[-4000:]
    assert out.stdout.count("the mace adapter serves `mace_run_train") == 2  # every rank
    assert "the environment (CFM_PLUGINS) is ',,,': it names no plugin" in out.stdout
    assert (tmp_path / "served.model").is_file()


def test_cost_auto_fits_after_epoch_0_and_restart_latest_plans_the_same_batches(tmp_path):
    """cost=auto on 2 ranks: epoch 0 is planned by atoms and timed, epoch 1 with the fit (one log
    line, the same fit in both ranks' step logs, kept beside mace's checkpoints); a --restart_latest
    run resumes at epoch 1 with the saved fit and packs epoch 1's batches as the first run did."""
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.steplog import read_step_events, read_step_logs

    # bulk cells, slabs and clusters of 4..60 atoms (edges per atom differ): about 20 steps per rank
    make_dataset(tmp_path, n_train=80, n_valid=2, seed=1, max_atoms=60)

    def train(log, *extra):
        out = run_mpi(
            [
                CFM_RUN,
                "--enable",
                "mace,binpack",
                "-o",
                "cost=auto",
                "--",
                "mace_run_train",
                *tiny_args(tmp_path, "auto", 2, batch_size=2),
                "--save_all_checkpoints",
                f"--cfm-step-log={tmp_path / log}",
                *extra,
            ],
            timeout=570,
            cwd=tmp_path,
            env=synthetic_step_env(),  # the fit's verdict must not depend on the machine's load
        )
        assert out.returncode == 0, out.stdout[-4000:]
        return out.stdout, read_step_logs(str(tmp_path / log))

    log, first = train("first")
    fits = re.findall(r"binpack cost=auto from epoch 1: step time = .*", log)
    assert len(fits) == 1, log[-4000:]
    assert len(first[0]) == len(first[1])  # every rank the same steps
    assert {r["cost"] for r in first[0] if r["epoch"] == 0} == {"initial"}
    assert {r["cost"] for r in first[0] if r["epoch"] == 1} == {"auto-1"}
    events = read_step_events(str(tmp_path / "first"))
    assert len(events[0]) == 1 and events[0] == events[1]
    fit = events[0][0]["fit"]  # the synthetic step times' own formula, found exactly
    assert fit["c0"] == pytest.approx(2e-3, rel=1e-6)
    assert (fit["a"], fit["b"], fit["g"]) == pytest.approx((4e-5, 2e-6, 0.0), rel=1e-6, abs=1e-12)
    saved = json.loads((tmp_path / "checkpoints" / "auto_run-7.cfm-binpack.json").read_text())
    assert saved["calibrations"][0]["fit"] == events[0][0]["fit"]

    log, resumed = train("resumed", "--restart_latest")  # mace restarts at epoch 1
    assert re.search(r"Loading checkpoint: .*_epoch-1\.pt", log), log[-3000:]
    assert "cost=auto: resuming with the saved fit from epoch 1" in log
    assert "binpack cost=auto from epoch" not in log
    for rank in (0, 1):
        epoch1 = [(r["graphs"], r["atoms"]) for r in first[rank] if r["epoch"] == 1]
        assert [(r["graphs"], r["atoms"]) for r in resumed[rank]] == epoch1
