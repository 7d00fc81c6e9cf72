"""The plugins inside a real, unmodified nequip-train (nequip 0.19 from PyPI), under real mpirun.

nequip needs e3nn 0.6 and mace-torch pins 0.4.4, so these run in .venv-nequip (`make test-nequip`,
part of `make test`); in the main .venv they skip, saying so.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

from tests.helpers import BIN, clean_env, run_mpi, synthetic_step_env  # noqa: E402
from tests.helpers.nequip_models import rel, tiny_batch  # noqa: E402

CFM_RUN = str(BIN / "cfm-run")


def test_adapter_serves_nequip_train_only():
    from cfm_plugins_adapters.nequip import serves

    assert serves(["nequip-train", "-cn", "x"]) and serves(["/venv/bin/nequip-train"])
    assert serves(["python", "-m", "nequip.scripts.train"])
    assert not serves(["mace_run_train"]) and not serves([])


# ------------------------------------------------------------------------------------ nequip-train
def energies(path) -> list[float]:
    from ase.io import read

    return sorted(float(a.info["REF_energy"]) for a in read(path, index=":"))


def step_losses(run: Path) -> list[float]:
    with open(run / "csv" / "version_0" / "metrics.csv") as fh:
        return [
            float(r["train_loss_step/weighted_sum"])
            for r in csv.DictReader(fh)
            if r.get("train_loss_step/weighted_sum")
        ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real 2-rank nequip-train runs on the same data: (A) the flag form with binpack and the
    fused kernel, (B) the config-key form (`cfm_plugins:` in the Hydra YAML) with binpack only,
    (C) as (A) with the radial fusion named."""
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config

    tmp = tmp_path_factory.mktemp("nequip")
    files = make_dataset(tmp / "data", n_train=10, n_valid=4, n_test=1, seed=3, max_atoms=40)
    common = dict(
        train=files["train"],
        valid=files["valid"],
        epochs=2,
        features=8,
        l_max=1,
        layers=2,
        batch_size=4,
    )
    write_config(tmp / "cfg" / "a.yaml", **common)
    write_config(
        tmp / "cfg" / "b.yaml",
        **common,
        cfm_plugins={"enable": ["nequip", "binpack"], "step_log": str(tmp / "b_steps")},
    )
    out = {"files": files, "tmp": tmp}

    def flag_run(name, *options):
        return run_mpi(
            [CFM_RUN, "--enable", "nequip,binpack,fused", *options, "--"]
            + ["nequip-train", "-cp", str(tmp / "cfg"), "-cn", "a"]
            + [f"hydra.run.dir={tmp / name}"],
            timeout=570,
        )

    a = flag_run("a", "-o", f"step_log={tmp / 'a_steps'}")
    b = run_mpi(
        [
            CFM_RUN,
            "--",
            "nequip-train",
            "-cp",
            str(tmp / "cfg"),
            "-cn",
            "b",
            f"hydra.run.dir={tmp / 'b'}",
        ],
        timeout=570,
    )
    # (C) as (A) with the radial fusion named: the per-edge weights made inside the fused TP
    c = flag_run("c", "-o", "fused_kernels=conv_tp,conv_tp_radial")
    out.update(a=a, b=b, c=c)
    return out


def swapped_lines(run, rank: int) -> list[str]:
    prefix = f"[cfm rank {rank}] INFO fused kernels swapped in"
    return [line for line in run.stdout.splitlines() if line.startswith(prefix)]


def test_nequip_train_under_mpirun_with_both_plugins(runs):
    a, b = runs["a"], runs["b"]
    assert a.returncode == 0, a.stdout[-4000:]
    assert b.returncode == 0, b.stdout[-4000:]
    for rank in (0, 1):
        swapped = swapped_lines(a, rank)
        assert len(swapped) == 1 and "conv_tp: 2 (" in swapped[0], (
            swapped
        )  # once, at the first Trainer setup
        # the default fused_kernels (auto) asks for what the model has: NequIP has no symmetric
        # contraction, and no warning says so
        assert f"[cfm rank {rank}] WARNING fused" not in a.stdout
        assert f"[cfm rank {rank}] INFO binpack train:" in a.stdout
        assert (
            f"[cfm rank {rank}] INFO plugins enabled: nequip, binpack (from config-file)"
            in b.stdout
        )
    assert "fused kernels swapped in" not in b.stdout


def test_every_structure_once_per_epoch_on_every_rank_set(runs):
    from cfm_plugins.steplog import read_step_logs

    train, valid = energies(runs["files"]["train"]), energies(runs["files"]["valid"])
    for name in ("a_steps", "b_steps"):
        ranks = read_step_logs(str(runs["tmp"] / name))
        assert len(ranks) == 2
        for stage, expected in (("train", train), ("val", valid)):
            for epoch in (0, 1):
                recs = [
                    [r for r in rank if r["stage"] == stage and r["epoch"] == epoch]
                    for rank in ranks
                ]
                assert len(recs[0]) == len(recs[1]) > 0, (
                    name,
                    stage,
                    epoch,
                )  # same steps on both ranks
                seen = sorted(e for rank in recs for r in rank for e in r["energies"])
                np.testing.assert_allclose(
                    seen, expected, rtol=0, atol=1e-9, err_msg=f"{name} {stage} {epoch}"
                )
        # re-packed each epoch (Lightning's set_epoch reaches the sampler): the batches differ
        batches = [
            [
                tuple(r["energies"])
                for rank in ranks
                for r in rank
                if r["stage"] == "train" and r["epoch"] == e
            ]
            for e in (0, 1)
        ]
        assert batches[0] != batches[1], name


def test_fused_losses_equal_stock_over_the_epochs(runs):
    la, lb = step_losses(runs["tmp"] / "a"), step_losses(runs["tmp"] / "b")
    assert len(la) == len(lb) > 2
    np.testing.assert_allclose(la, lb, rtol=1e-8, atol=0)


def test_radial_fusion_trains_as_stock(runs, nequip_global_state):
    c = runs["c"]
    assert c.returncode == 0, c.stdout[-4000:]
    for rank in (0, 1):
        swapped = swapped_lines(c, rank)
        assert len(swapped) == 1 and "conv_tp_radial: 2 (" in swapped[0], swapped
    lc, lb = step_losses(runs["tmp"] / "c"), step_losses(runs["tmp"] / "b")
    assert len(lc) == len(lb) > 2
    np.testing.assert_allclose(lc, lb, rtol=1e-8, atol=0)
    # its checkpoint holds the stock model's state_dict: it loads without the plugin
    from nequip.model.saved_models.load_utils import load_saved_model

    model = load_saved_model(str(runs["tmp"] / "c" / "last.ckpt"))
    kinds = {type(m).__name__ for m in model.modules()}
    assert "ScalarMLPFunction" in kinds and not any("CFM" in k for k in kinds), kinds


LOAD_STOCK = """
import sys, types, torch
# cfm-plugins absent: its nequip extension is an empty module and the package cannot be imported
sys.modules['cfm_plugins_adapters.nequip.extension'] = types.ModuleType('stub')
sys.modules['cfm_plugins'] = None
from nequip.utils.global_state import set_global_state
set_global_state()
from nequip.model.saved_models.load_utils import load_saved_model
from nequip.nn._tp_scatter_base import TensorProductScatter
assert not hasattr(TensorProductScatter, 'enable_CFMFused')
m = load_saved_model(sys.argv[1])
kinds = {type(x).__name__ for x in m.modules()}
assert 'TensorProductScatter' in kinds and not any('CFM' in k for k in kinds), kinds
print('LOADED', type(m).__name__)
"""


def test_checkpoint_of_a_fused_run_loads_without_and_with_the_plugin(runs, nequip_global_state):
    ckpt = runs["tmp"] / "a" / "last.ckpt"
    assert ckpt.is_file()
    res = subprocess.run(
        [sys.executable, "-c", LOAD_STOCK, str(ckpt)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode == 0 and "LOADED" in res.stdout, res.stdout[-3000:]

    from nequip.model import modify
    from nequip.model.saved_models.load_utils import load_saved_model

    stock = load_saved_model(str(ckpt))
    fused = modify(load_saved_model(str(ckpt)), [{"modifier": "enable_CFMFused"}])
    batch = tiny_batch(1)
    e0, f0 = (stock(dict(batch))[k].detach() for k in ("total_energy", "forces"))
    e1, f1 = (fused(dict(batch))[k].detach() for k in ("total_energy", "forces"))
    assert rel(e1, e0) < 1e-10 and rel(f1, f0) < 1e-10


COMPARE_COMPILED = """
import sys, numpy as np
from ase.build import bulk
from nequip.integrations.ase import NequIPCalculator  # loads our operators through nequip.extension
ckpt, pt2 = sys.argv[1], sys.argv[2]
assert 'cfm_plugins.ops.conv_tp' not in sys.modules  # the compiled model needs the operators only
stock = NequIPCalculator._from_saved_model(ckpt, device='cpu', chemical_species_to_atom_type_map=True)
compiled = NequIPCalculator.from_compiled_model(pt2, device='cpu', chemical_species_to_atom_type_map=True)
rng = np.random.default_rng(0)
for n in (1, 2):  # two sizes: one package, dynamic shapes
    a = bulk('Cu', 'fcc', a=3.6, cubic=True).repeat((n + 1, n + 1, 2))
    a.symbols[rng.choice(len(a), len(a) // 3, replace=False)] = 'Ni'
    a.rattle(0.05, seed=n)
    b = a.copy()
    a.calc, b.calc = stock, compiled
    e0, f0, e1, f1 = a.get_potential_energy(), a.get_forces(), b.get_potential_energy(), b.get_forces()
    print('REL', len(a), abs(e1 - e0) / abs(e0), np.abs(f1 - f0).max() / np.abs(f0).max())
"""  # noqa: E501


@pytest.mark.slow
def test_nequip_compile_aotinductor_with_the_fused_modifier(runs):
    """`nequip-compile --mode aotinductor --modifiers enable_CFMFused` on a checkpoint of ours: the
    package calls our operators and matches the stock (eager) model at two sizes to f64
    round-off."""
    import zipfile

    ckpt, pt2 = runs["tmp"] / "a" / "last.ckpt", runs["tmp"] / "fused.nequip.pt2"
    out = subprocess.run(
        [
            str(BIN / "nequip-compile"),
            str(ckpt),
            str(pt2),
            "--mode",
            "aotinductor",
            "--device",
            "cpu",
            "--target",
            "ase",
            "--modifiers",
            "enable_CFMFused",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        timeout=570,
        cwd=runs["tmp"],
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "enable_CFMFused: 2 TensorProductScatter module(s) fused" in out.stdout
    with zipfile.ZipFile(pt2) as z:
        calls = " ".join(
            z.read(n).decode(errors="ignore") for n in z.namelist() if n.endswith(".json")
        )
    assert "cfm::conv_tp_fwd" in calls and "cfm::conv_tp_bwd" in calls
    res = subprocess.run(
        [sys.executable, "-c", COMPARE_COMPILED, str(ckpt), str(pt2)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.startswith("REL ")]
    assert len(rows) == 2 and rows[0][1] != rows[1][1]
    for _, _, e_rel, f_rel in rows:
        assert float(e_rel) < 1e-10 and float(f_rel) < 1e-10, rows


# ------------------------------------------------------------------------------------- cost=auto
@pytest.fixture(scope="module")
def auto_runs(tmp_path_factory):
    """cost=auto on 2 ranks for 2 epochs (epoch 0 calibrates), then a restart from its last.ckpt
    (nequip's ckpt_path) that trains epoch 2. The ranks hand their samplers synthetic step times
    (:func:`~tests.helpers.synthetic_step_env`), so that the fit does not depend on the machine's
    load; 144 structures in batches of 4 give the 20 timed steps a fit needs."""
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config

    tmp = tmp_path_factory.mktemp("nequip_auto")
    files = make_dataset(tmp / "data", n_train=144, n_valid=2, n_test=1, seed=4, max_atoms=40)
    write_config(
        tmp / "cfg" / "auto.yaml",
        train=files["train"],
        valid=files["valid"],
        epochs=2,
        features=8,
        l_max=1,
        layers=2,
        batch_size=4,
    )
    runs = {"files": files, "tmp": tmp}
    for name, extra in (
        ("first", []),
        ("restarted", [f"++ckpt_path={tmp / 'first' / 'last.ckpt'}", "trainer.max_epochs=3"]),
    ):
        runs[name] = run_mpi(
            [
                CFM_RUN,
                "--enable",
                "nequip,binpack",
                "-o",
                "cost=auto",
                "-o",
                f"step_log={tmp / (name + '_steps')}",
                "--",
                "nequip-train",
                "-cp",
                str(tmp / "cfg"),
                "-cn",
                "auto",
                f"hydra.run.dir={tmp / name}",
                *extra,
            ],
            timeout=570,
            env=synthetic_step_env(),
        )
        assert runs[name].returncode == 0, runs[name].stdout[-4000:]
    return runs


def test_cost_auto_fits_after_epoch_0_and_every_structure_is_seen_each_epoch(auto_runs):
    from cfm_plugins.steplog import read_step_events, read_step_logs

    log = auto_runs["first"].stdout
    assert len(re.findall(r"binpack cost=auto from epoch 1: step time = ", log)) == 1, log[-4000:]
    ranks = read_step_logs(str(auto_runs["tmp"] / "first_steps"))
    train = energies(auto_runs["files"]["train"])
    for epoch, label in ((0, "initial"), (1, "auto-1")):
        recs = [
            [r for r in rank if r["stage"] == "train" and r["epoch"] == epoch] for rank in ranks
        ]
        assert len(recs[0]) == len(recs[1]) > 0 and {r["cost"] for rank in recs for r in rank} == {
            label
        }
        seen = sorted(
            e for rank in recs for r in rank for e in r["energies"]
        )  # Lightning ran the whole plan
        np.testing.assert_allclose(seen, train, rtol=0, atol=1e-9, err_msg=f"epoch {epoch}")
    events = read_step_events(str(auto_runs["tmp"] / "first_steps"))
    assert len(events[0]) == 1 and events[0] == events[1]


def test_cost_auto_restart_from_the_checkpoint_plans_with_the_saved_fit(auto_runs):
    """Lightning keeps the fit in the checkpoint (callback state); the restart plans epoch 2 with
    it."""
    from cfm_plugins.steplog import read_step_events, read_step_logs

    log = auto_runs["restarted"].stdout
    assert "Continuing training with checkpoint file" in log
    assert "cost=auto: resuming with the saved fit from epoch 1" in log
    assert "binpack cost=auto from epoch" not in log  # nothing calibrated again
    ranks = read_step_logs(str(auto_runs["tmp"] / "restarted_steps"))
    recs = [[r for r in rank if r["stage"] == "train"] for rank in ranks]
    assert {r["epoch"] for rank in recs for r in rank} == {2} and len(recs[0]) == len(recs[1]) > 0
    assert {r["cost"] for rank in recs for r in rank} == {"auto-1"}
    seen = sorted(e for rank in recs for r in rank for e in r["energies"])
    np.testing.assert_allclose(seen, energies(auto_runs["files"]["train"]), rtol=0, atol=1e-9)
    first = read_step_events(str(auto_runs["tmp"] / "first_steps"))[0]
    assert read_step_events(str(auto_runs["tmp"] / "restarted_steps"))[0] == first  # the same fit
