"""The hydragnn adapter with HydraGNN's own MACE stack (HydraGNN from source): the example
``examples/hydragnn/mace/train.py`` (energies and forces, float64) trained under real
``mpirun -np 2 cfm-run --enable hydragnn,binpack,fused``, against the same training with stock
kernels, and its checkpoint loaded in HydraGNN alone (``examples/hydragnn/mace/evaluate.py``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

import torch  # noqa: E402

from cfm_plugins.steplog import read_step_logs  # noqa: E402
from tests.helpers import BIN, clean_env, run_mpi  # noqa: E402
from tests.helpers.hydragnn_source import EXAMPLE, example_config  # noqa: E402

EPOCHS = 2
SEED = 0  # train.py --seed: the split


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """24 EMT graphs of 3..40 atoms with energies and forces, each tagged with its index; the
    example's config at hidden 8, batch 4, 2 epochs."""
    from cfm_plugins.datasets.clusters import make_dataset

    folder = tmp_path_factory.mktemp("hydragnn_mace")
    graphs = make_dataset(24, seed=1, max_atoms=40, forces=True)
    for i, g in enumerate(graphs):
        g.idx = torch.tensor([i])
    config = example_config(hidden_dim=8)
    (folder / config["Dataset"]["path"]["total"]).parent.mkdir(parents=True)
    torch.save(graphs, folder / config["Dataset"]["path"]["total"])
    config["NeuralNetwork"]["Training"].update(num_epoch=EPOCHS, batch_size=4)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def train(work, enable: str, label: str):
    out = run_mpi(
        [
            str(BIN / "cfm-run"),
            "--enable",
            enable,
            "-o",
            f"step_log={work / 'steps' / label}",
            "--",
            "python",
            str(EXAMPLE / "train.py"),
            str(work / "config.json"),
            "--log",
            label,
            "--seed",
            str(SEED),
        ],
        timeout=570,
        cwd=work,
    )
    assert out.returncode == 0, out.stdout[-6000:]
    return out.stdout


@pytest.fixture(scope="module")
def fused_run(work):
    return train(work, "hydragnn,binpack,fused", "fused")


@pytest.fixture(scope="module")
def stock_run(work):
    """The same training (same batches: binpack's plan) with HydraGNN's own e3nn modules."""
    return train(work, "hydragnn,binpack", "stock")


def task_losses(log: str) -> list[list[float]]:
    """HydraGNN's per-epoch training losses of the three tasks (energy, energy per atom, forces)."""
    return [json.loads(m) for m in re.findall(r"Tasks Train Loss: (\[[^\]]*\])", log)]


def test_fused_training_names_the_swapped_modules_and_uses_every_graph_once_per_epoch(
    work, fused_run
):
    import random

    from hydragnn.preprocess.load_data import split_dataset

    swapped = re.findall(
        r"fused kernels swapped in EnhancedModelWrapper: symmetric_contraction: 2 \((.*)\); "
        r"conv_tp: 2 \((.*)\)",
        fused_run,
    )
    assert len(swapped) == 2, fused_run[-4000:]  # one line per rank, naming the modules
    for sc, tp in swapped:
        assert sc.split(", ") == [
            f"model.graph_convs.{i}.module_2.symmetric_contractions" for i in (0, 1)
        ]
        assert tp.split(", ") == [
            f"model.graph_convs.{i}.module_1" for i in (0, 1)
        ]  # the blocks, whole
    assert len(re.findall(r"binpack train: \d+ steps? on each of 2 ranks", fused_run)) == 2
    losses = task_losses(fused_run)
    assert len(losses) == EPOCHS and all(np.isfinite(losses[-1])), losses

    graphs = torch.load(work / "dataset" / "clusters_forces.pt", weights_only=False)
    random.seed(SEED)  # the split train.py made
    trainset = split_dataset(graphs, 0.8, False)[0]
    expected = sorted(int(g.idx) for g in trainset)
    ranks = read_step_logs(str(work / "steps" / "fused"))
    assert (
        len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) > 0
    )  # the same number of steps on every rank
    steps = len(ranks[0]) // EPOCHS
    assert steps * EPOCHS == len(ranks[0])
    for e in range(EPOCHS):
        ids = [i for r in ranks for rec in r[e * steps : (e + 1) * steps] for i in rec["ids"]]
        assert sorted(ids) == expected, f"epoch {e}: not every training graph exactly once"


def test_fused_training_equals_stock_training_in_float64(work, fused_run, stock_run):
    """The same batches, the same initial model: the losses of every epoch agree to 1e-10 and so do
    the trained weights, each tensor to 1e-10 of its largest entry (AdamW's normalised steps
    magnify round-off in the few entries whose gradients nearly cancel: after these 6 steps a
    single entry can differ by 2e-10 of itself, 1e-11 of the tensor's scale)."""
    assert "fused kernels swapped" not in stock_run
    fused, stock = task_losses(fused_run), task_losses(stock_run)
    assert len(fused) == len(stock) == EPOCHS
    np.testing.assert_allclose(fused, stock, rtol=1e-10, atol=0)
    assert fused[0] != fused[1]  # it trained
    a = torch.load(work / "logs" / "fused" / "fused.pk", weights_only=True)["model_state_dict"]
    b = torch.load(work / "logs" / "stock" / "stock.pk", weights_only=True)["model_state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        if a[key].is_floating_point():
            assert a[key].dtype == torch.float64, key
            scale = float(b[key].abs().max()) if b[key].numel() else 0.0
            torch.testing.assert_close(
                a[key], b[key], rtol=0, atol=1e-10 * max(scale, 1e-3), msg=key
            )


def test_checkpoint_loads_in_hydragnn_alone_and_fused_equals_it(work, fused_run):
    out = subprocess.run(
        [sys.executable, str(EXAMPLE / "evaluate.py"), "fused", "--out", "ef.npz", "--fused"],
        cwd=work,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=570,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "fused: loaded in HydraGNN alone; 24 graphs" in out.stdout
    assert "symmetric_contraction: 2" in out.stdout
    # the interaction blocks whole, as under cfm-run with fused (the adapter's form)
    assert re.search(
        r"conv_tp: 2 \((\S*)graph_convs\.0\.module_1, \1graph_convs\.1\.module_1\)", out.stdout
    ), out.stdout[-4000:]
    ef = np.load(work / "ef.npz")
    assert (
        ef["energy"].shape == (24,)
        and ef["forces"].shape[1] == 3
        and np.abs(ef["forces"]).max() > 0
    )
    np.testing.assert_allclose(ef["energy_fused"], ef["energy"], rtol=1e-10, atol=0)
    np.testing.assert_allclose(
        ef["forces_fused"], ef["forces"], rtol=0, atol=1e-10 * np.abs(ef["forces"]).max()
    )
