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
            timeout=600,
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
        timeout=600,
        cwd=data,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    ref = read_step_logs(str(data / "steps_ref"))[0][0]["loss"]
    assert abs(first - ref) <= 1e-8 * abs(ref), (first, ref)


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
