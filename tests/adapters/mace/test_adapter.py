"""The plugins inside a real, unmodified mace_run_train (mace-torch from PyPI), under real mpirun."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import BIN, clean_env, run_mpi

CFM_RUN = str(BIN / "cfm-run")
MACE_RUN_TRAIN = str(BIN / "mace_run_train")


def make_tiny_set(folder: Path, n_train: int = 24, n_valid: int = 6, seed: int = 0) -> None:
    """CuNi cells of 1 to 72 atoms with EMT energies, forces and stress (plus isolated atoms)."""
    from ase import Atoms
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.io import write

    rng = np.random.default_rng(seed)
    frames = []
    for s in ("Cu", "Ni"):
        at = Atoms(s, cell=[20, 20, 20], pbc=False)
        at.calc = EMT()
        at.info.update(REF_energy=at.get_potential_energy(), config_type="IsolatedAtom")
        at.calc = None
        frames.append(at)
    for i in range(n_train + n_valid):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((int(rng.integers(1, 4)), int(rng.integers(1, 3)), 1 + i % 2))
        sym = np.array(a.get_chemical_symbols())
        sym[rng.random(len(a)) < 0.3] = "Ni"
        a.set_chemical_symbols(sym)
        a.rattle(0.05, seed=i)
        a.calc = EMT()
        a.info.update(REF_energy=a.get_potential_energy(), REF_stress=a.get_stress())
        a.arrays["REF_forces"] = a.get_forces()
        a.calc = None
        frames.append(a)
    write(folder / "train.xyz", frames[: 2 + n_train])
    write(folder / "valid.xyz", frames[2 + n_train:])


def mace_args(folder: Path, name: str, epochs: int = 2, dtype: str = "float64", batch_size: int = 4) -> list[str]:
    return [
        f"--name={name}", f"--train_file={folder / 'train.xyz'}", f"--valid_file={folder / 'valid.xyz'}",
        "--E0s=isolated", "--model=MACE", "--hidden_irreps=8x0e+8x1o", "--r_max=4.0", "--max_L=1",
        "--correlation=3", "--num_interactions=2", f"--max_num_epochs={epochs}", f"--batch_size={batch_size}",
        f"--valid_batch_size={batch_size}", "--device=cpu", f"--default_dtype={dtype}",
        "--energy_key=REF_energy", "--forces_key=REF_forces", "--stress_key=REF_stress", "--seed=7",
        "--eval_interval=1", "--num_workers=0", "--save_cpu", "--lr=0.01",
        f"--work_dir={folder}", f"--model_dir={folder}",
    ]


def epoch_losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"Epoch \d+: head: Default, loss=([0-9.eE+-]+)", log)]


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


@pytest.mark.mpi
@pytest.mark.slow
def test_mpirun_binpack_fused_trains_and_saves_a_stock_model(data):
    out = run_mpi([CFM_RUN, "--enable", "mace,binpack,fused", "--", "mace_run_train",
                   *mace_args(data, "both"), f"--cfm-step-log={data / 'steps_both'}"], timeout=600)
    assert out.returncode == 0, out.stdout[-4000:]
    losses = epoch_losses(out.stdout)
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    assert "fused kernels swapped in" in out.stdout
    assert "binpack train:" in out.stdout

    from cfm_plugins.steplog import read_step_logs

    ranks = read_step_logs(str(data / "steps_both"))
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) > 0  # same number of steps on every rank
    atoms_per_epoch = sum(r["atoms"] for rank in ranks for r in rank) / 2
    n_atoms_train = sum(len(a) for a in __import__("ase.io").io.read(data / "train.xyz", ":")
                        if a.info.get("config_type") != "IsolatedAtom")
    assert atoms_per_epoch >= n_atoms_train  # nothing dropped (isolated atoms may be in the set too)

    model = data / "both.model"
    res = subprocess.run([sys.executable, "-c", LOAD_STOCK, str(model)], capture_output=True, text=True,
                         env=clean_env(), timeout=120)
    assert res.returncode == 0 and "LOADED" in res.stdout, res.stderr[-3000:]


@pytest.mark.slow
def test_fused_first_step_loss_equals_stock(data):
    """Same seed, float64: the fused kernels give the stock first-step loss (and epoch losses)."""
    logs = {}
    for label, enable in (("stock", None), ("fused", "mace,fused")):
        cmd = ([MACE_RUN_TRAIN] if enable is None else [CFM_RUN, "--enable", enable, "--", "mace_run_train"])
        extra = [] if enable is None else [f"--cfm-step-log={data / ('steps_' + label)}"]
        out = subprocess.run(cmd + mace_args(data, label, epochs=1) + extra, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=clean_env(), timeout=600, cwd=data)
        assert out.returncode == 0, out.stdout[-4000:]
        logs[label] = out.stdout
    from cfm_plugins.steplog import read_step_logs

    first = read_step_logs(str(data / "steps_fused"))[0][0]["loss"]
    stock_losses, fused_losses = epoch_losses(logs["stock"]), epoch_losses(logs["fused"])
    assert stock_losses and fused_losses
    np.testing.assert_allclose(fused_losses, stock_losses, rtol=1e-7)

    # the first step of a stock-kernel run with the same seed, recorded the same way
    out = subprocess.run([CFM_RUN, "--enable", "mace", "--", "mace_run_train", *mace_args(data, "ref", epochs=1),
                          f"--cfm-step-log={data / 'steps_ref'}"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=clean_env(), timeout=600, cwd=data)
    assert out.returncode == 0, out.stdout[-4000:]
    ref = read_step_logs(str(data / "steps_ref"))[0][0]["loss"]
    assert abs(first - ref) <= 1e-8 * abs(ref), (first, ref)


@pytest.mark.mpi
def test_structure_larger_than_the_token_budget_is_a_clear_error_on_every_rank(data):
    out = run_mpi([CFM_RUN, "--enable", "mace,binpack", "--", "mace_run_train", *mace_args(data, "big", epochs=1),
                   "--cfm-max-tokens=10"], timeout=300)
    assert out.returncode != 0
    assert re.search(r"sample \d+", out.stdout) and "10" in out.stdout, out.stdout[-3000:]
    assert "ending all 2 ranks" in out.stdout


TINY_MODEL = ["--hidden_irreps=8x0e", "--max_L=0", "--correlation=2", "--num_interactions=1"]


def tiny_args(folder: Path, name: str, epochs: int, batch_size: int = 4) -> list[str]:
    """mace_args with the smallest model (these tests check loaders and resuming, not accuracy)."""
    drop = ("--hidden_irreps", "--max_L", "--correlation", "--num_interactions")
    return [a for a in mace_args(folder, name, epochs=epochs, batch_size=batch_size) if not a.startswith(drop)] + TINY_MODEL


@pytest.mark.mpi
def test_mpirun_validation_set_smaller_than_the_ranks_completes(tmp_path):
    """1 validation structure, 2 ranks: stock mace completes (reporting nan), so must binpack; both ranks
    evaluate the structure (no rank may be empty under DDP), which leaves mace's averaged metrics as if
    it were counted once."""
    make_tiny_set(tmp_path, n_train=8, n_valid=1)
    out = run_mpi([CFM_RUN, "--enable", "mace,binpack", "--", "mace_run_train", *tiny_args(tmp_path, "small", 1)],
                  timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-4000:]
    assert out.stdout.count("binpack valid: 1 steps on each of 2 ranks") == 2, out.stdout[-4000:]
    assert "every rank evaluates all of them" in out.stdout
    for label in ("Initial", "Epoch 0"):
        loss = re.search(rf"{label}: head: Default, loss=\s*([0-9.eE+-]+|nan)", out.stdout)
        assert loss and np.isfinite(float(loss.group(1))), out.stdout[-3000:]
    assert (tmp_path / "small.model").exists()


@pytest.mark.slow
def test_restart_latest_continues_at_the_epoch_mace_resumes(tmp_path):
    """mace --restart_latest restarts at the epoch of its latest checkpoint, from that epoch's first batch
    (checkpoints are written only at epoch ends); the resumed run must pack that epoch's batches."""
    make_tiny_set(tmp_path, n_train=24, n_valid=2)
    from cfm_plugins.steplog import read_step_logs

    def train(epochs, log, *extra):
        out = subprocess.run([CFM_RUN, "--enable", "mace,binpack", "--", "mace_run_train",
                              *tiny_args(tmp_path, "resume", epochs), "--save_all_checkpoints",
                              f"--cfm-step-log={tmp_path / log}", *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env(),
                             timeout=600, cwd=tmp_path)
        assert out.returncode == 0, out.stdout[-4000:]
        return out.stdout, [(r["graphs"], r["atoms"]) for r in read_step_logs(str(tmp_path / log))[0]]

    _, first = train(2, "first")  # epochs 0 and 1; a checkpoint after each
    per_epoch = len(first) // 2
    epoch0, epoch1 = first[:per_epoch], first[per_epoch:]
    assert len(first) == 2 * per_epoch and epoch0 != epoch1  # each epoch has its own plan
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").glob("resume*_epoch-*.pt"))
    assert checkpoints and checkpoints[-1].endswith("_epoch-1.pt"), checkpoints

    log, resumed = train(2, "resumed", "--restart_latest")  # mace restarts at epoch 1
    assert re.search(r"Loading checkpoint: .*_epoch-1\.pt", log), log[-3000:]
    assert resumed == epoch1


@pytest.mark.mpi
def test_the_adapter_serving_the_command_is_enabled_so_ranks_train_one_model(tmp_path):
    """`CFM_PLUGINS=',,,'` enables nothing; the mace adapter still serves mace_run_train, so the two
    ranks train one model together (mace's --distributed) instead of two into one directory."""
    make_tiny_set(tmp_path, n_train=6, n_valid=2)
    out = run_mpi([CFM_RUN, "--", "mace_run_train", *mace_args(tmp_path, "served", epochs=1)], timeout=600,
                  env=clean_env(CFM_PLUGINS=",,,"))
    assert out.returncode == 0, out.stdout[-4000:]
    assert out.stdout.count("turning on mace's --distributed") == 2, out.stdout[-4000:]
    assert out.stdout.count("the mace adapter serves `mace_run_train") == 2  # every rank
    assert "the environment (CFM_PLUGINS) is ',,,': it names no plugin" in out.stdout
    assert (tmp_path / "served.model").is_file()


@pytest.mark.mpi
@pytest.mark.slow
def test_cost_auto_fits_after_epoch_0_and_restart_latest_plans_the_same_batches(tmp_path):
    """cost=auto on 2 ranks: epoch 0 is planned by atoms and timed, epoch 1 with the fit (one log
    line, the same fit in both ranks' step logs, kept beside mace's checkpoints); a --restart_latest
    run resumes at epoch 1 with the saved fit and packs epoch 1's batches as the first run did."""
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.steplog import read_step_events, read_step_logs

    # bulk cells, slabs and clusters of 4..60 atoms (edges per atom differ): about 20 steps per rank
    make_dataset(tmp_path, n_train=80, n_valid=2, seed=1, max_atoms=60)

    def train(log, *extra):
        out = run_mpi([CFM_RUN, "--enable", "mace,binpack", "-o", "cost=auto", "--", "mace_run_train",
                       *tiny_args(tmp_path, "auto", 2, batch_size=2),
                       "--save_all_checkpoints", f"--cfm-step-log={tmp_path / log}", *extra], timeout=600, cwd=tmp_path)
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
    saved = json.loads((tmp_path / "checkpoints" / "auto_run-7.cfm-binpack.json").read_text())
    assert saved["calibrations"][0]["fit"] == events[0][0]["fit"]

    log, resumed = train("resumed", "--restart_latest")  # mace restarts at epoch 1
    assert re.search(r"Loading checkpoint: .*_epoch-1\.pt", log), log[-3000:]
    assert "cost=auto: resuming with the saved fit from epoch 1" in log
    assert "binpack cost=auto from epoch" not in log
    for rank in (0, 1):
        epoch1 = [(r["graphs"], r["atoms"]) for r in first[rank] if r["epoch"] == 1]
        assert [(r["graphs"], r["atoms"]) for r in resumed[rank]] == epoch1
