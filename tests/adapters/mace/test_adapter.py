"""The plugins inside a real, unmodified mace_run_train (mace-torch from PyPI), under real
mpirun."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import clean_env, run_mpi
from tests.helpers.mace_runs import (
    CFM_RUN,
    MACE_RUN_TRAIN,
    binpack_fused_run,
    epoch_losses,
    mace_args,
    make_tiny_set,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mace_data")
    make_tiny_set(folder)
    return folder


LOAD_STOCK = """
import sys, torch
sys.modules['cfm_plugins'] = None          # cfm-plugins cannot be imported here
sys.modules['cfm_plugins_adapters'] = None
import mace.modules
m = torch.load(sys.argv[1], weights_only=False, map_location='cpu')
names = {type(x).__module__ for x in m.modules()}
assert not any('cfm' in n for n in names), names
assert isinstance(m, mace.modules.MACE), type(m)
print('LOADED', type(m).__name__)
"""


@pytest.fixture(scope="module")
def binpack_fused(tmp_path_factory):
    """The 2-rank binpack+fused run of the small model (shared with test_static.py)."""
    return binpack_fused_run(tmp_path_factory)


def test_mpirun_binpack_fused_trains_and_saves_a_stock_model(binpack_fused):
    data, returncode, stdout = binpack_fused
    assert returncode == 0, stdout[-4000:]
    losses = epoch_losses(stdout)
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    assert "fused kernels swapped in" in stdout
    assert "binpack train:" in stdout

    from cfm_plugins.steplog import read_step_logs

    ranks = read_step_logs(str(data / "steps_both"))
    assert (
        len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) > 0
    )  # same number of steps on every rank
    atoms_per_epoch = sum(r["atoms"] for rank in ranks for r in rank) / 2
    n_atoms_train = sum(
        len(a)
        for a in __import__("ase.io").io.read(data / "train.xyz", ":")
        if a.info.get("config_type") != "IsolatedAtom"
    )
    assert (
        atoms_per_epoch >= n_atoms_train
    )  # nothing dropped (isolated atoms may be in the set too)

    model = data / "both.model"
    res = subprocess.run(
        [sys.executable, "-c", LOAD_STOCK, str(model)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert res.returncode == 0 and "LOADED" in res.stdout, res.stderr[-3000:]


def test_fused_first_step_loss_equals_stock(data):
    """Same seed, float64: the fused kernels give the stock first-step loss (and epoch losses)."""
    logs = {}
    for label, enable in (("stock", None), ("fused", "mace,fused")):
        cmd = (
            [MACE_RUN_TRAIN]
            if enable is None
            else [CFM_RUN, "--enable", enable, "--", "mace_run_train"]
        )
        extra = [] if enable is None else [f"--cfm-step-log={data / ('steps_' + label)}"]
        out = subprocess.run(
            cmd + mace_args(data, label, epochs=1) + extra,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(),
            timeout=570,
            cwd=data,
        )
        assert out.returncode == 0, out.stdout[-4000:]
        logs[label] = out.stdout
    from cfm_plugins.steplog import read_step_logs

    first = read_step_logs(str(data / "steps_fused"))[0][0]["loss"]
    stock_losses, fused_losses = epoch_losses(logs["stock"]), epoch_losses(logs["fused"])
    assert stock_losses and fused_losses
    np.testing.assert_allclose(fused_losses, stock_losses, rtol=1e-7)

    # the first step of a stock-kernel run with the same seed, recorded the same way
    out = subprocess.run(
        [
            CFM_RUN,
            "--enable",
            "mace",
            "--",
            "mace_run_train",
            *mace_args(data, "ref", epochs=1),
            f"--cfm-step-log={data / 'steps_ref'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        timeout=570,
        cwd=data,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    ref = read_step_logs(str(data / "steps_ref"))[0][0]["loss"]
    assert abs(first - ref) <= 1e-8 * abs(ref), (first, ref)


def test_mpirun_binpack_fused_run_logs_the_planned_and_measured_balance(binpack_fused):
    """The balance was reported only for cost=auto. Every run of several ranks ends with one line:
    the LIF of the plans in the cost's units and the LIF of the timed steps, which the step logs
    give too (the first 3 steps of each rank left out as warm-up)."""
    from cfm_plugins.sampler import load_imbalance_factor
    from cfm_plugins.steplog import read_step_logs

    data, returncode, stdout = binpack_fused
    assert returncode == 0, stdout[-4000:]
    lines = re.findall(
        r"\[cfm rank (\d)\] INFO binpack balance of the training batches \(2 epochs\): planned "
        r"LIF ([0-9.]+) in atoms[^;]*; measured LIF ([0-9.]+) from the compute times of (\d+) "
        r"steps x 2 ranks \((thread CPU|wall-clock) time;",
        stdout,
    )
    assert len(lines) == 1 and lines[0][0] == "0", stdout[-4000:]
    _, planned, measured, steps, clock = lines[0]
    ranks = read_step_logs(str(data / "steps_both"))
    atoms = np.array([[r["atoms"] for r in rank] for rank in ranks]).T
    assert float(planned) == pytest.approx(load_imbalance_factor(atoms), abs=6e-4)
    field = "compute_cpu_s" if clock == "thread CPU" else "compute_s"
    times = np.array([[r[field] for r in rank] for rank in ranks]).T[3:]
    assert int(steps) == len(times)
    assert float(measured) == pytest.approx(load_imbalance_factor(times), abs=6e-4)


def test_mpirun_a_loss_weighting_the_loss_cannot_take_stops_before_the_data_said_once(data):
    """`loss_weighting=per_sample` with `--loss=huber` was refused after the data was read, as a
    traceback on every rank with "(the capacity is --cfm-max-tokens)" appended."""
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack",
            "-o",
            "loss_weighting=per_sample",
            "--",
            "mace_run_train",
            *mace_args(data, "huber", epochs=1),
            "--loss=huber",
        ],
        timeout=300,
    )
    assert out.returncode == 2, out.stdout[-4000:]
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, out.stdout[-4000:]
    assert "mace_run_train --loss huber cannot be reweighted per sample" in errors[0]
    assert "capacity" not in errors[0] and "Traceback" not in out.stdout
    assert "binpack train:" not in out.stdout  # before any loader was made


def test_fused_with_maces_own_kernel_swap_is_a_usage_error_said_once(data):
    """`--enable mace,fused` with mace's `--enable_cueq True` was refused with a traceback."""
    out = subprocess.run(
        [
            CFM_RUN,
            "--enable",
            "mace,fused",
            "--",
            "mace_run_train",
            *mace_args(data, "cueq", epochs=1),
            "--enable_cueq=True",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
    )
    said = out.stdout + out.stderr
    assert out.returncode == 2, said[-4000:]
    errors = [l for l in said.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, said[-4000:]
    said_once = errors[0]
    assert (
        "the fused kernels and mace's enable_cueq/enable_oeq replace the same modules" in said_once
    )
    assert "Traceback" not in said


def test_structure_larger_than_the_token_budget_is_a_clear_error_on_every_rank(data):
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack",
            "--",
            "mace_run_train",
            *mace_args(data, "big", epochs=1),
            "--cfm-max-tokens=10",
        ],
        timeout=300,
    )
    assert out.returncode != 0
    assert re.search(r"sample \d+", out.stdout) and "10" in out.stdout, out.stdout[-3000:]
    assert "ending all 2 ranks" in out.stdout
