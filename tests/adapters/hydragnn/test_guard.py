"""A training step whose loss is not finite, in real HydraGNN 3.0 runs (examples/hydragnn/train.py
under mpirun): one graph of the training set has a NaN label. HydraGNN alone trains on it and
saves a NaN model with exit status 0."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.helpers import BIN, ROOT, run_mpi
from tests.helpers.hydragnn_source import skip_if_source

skip_if_source()  # examples/hydragnn/train.py is written for 3.0's API
pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)

import torch  # noqa: E402

CFM_RUN = str(BIN / "cfm-run")
EXAMPLE = ROOT / "examples" / "hydragnn"
BAD = 5  # the graph of the training set (by position) whose label is NaN


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """40 graphs of 3..60 atoms; HydraGNN's split keeps the first 80 % for training, in order, so
    graph BAD is the training set's graph BAD."""
    import hydragnn

    from cfm_plugins.datasets.clusters import make_dataset

    folder = tmp_path_factory.mktemp("hydragnn_nonfinite")
    graphs = make_dataset(40, seed=3, max_atoms=60)
    graphs[BAD].y = torch.full_like(graphs[BAD].y, float("nan"))
    (folder / "dataset").mkdir()
    torch.save(graphs, folder / "dataset" / "clusters.pt")
    train = hydragnn.preprocess.split_dataset(graphs, 0.8, False)[0]
    assert torch.isnan(train[BAD].y).all() and sum(bool(torch.isnan(g.y).any()) for g in train) == 1
    config = json.loads((EXAMPLE / "config.json").read_text())
    arch = config["NeuralNetwork"]["Architecture"]
    arch.update(hidden_dim=8, num_conv_layers=2)
    arch["output_heads"]["graph"].update(dim_sharedlayers=8, dim_headlayers=[8, 8])
    config["NeuralNetwork"]["Training"].update(num_epoch=2, batch_size=4)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def train(work, name, *cfm_args):
    run = work / name
    run.mkdir()
    (run / "dataset").symlink_to(work / "dataset")
    return run, run_mpi(
        [CFM_RUN, *cfm_args, "--", "python", str(EXAMPLE / "train.py"), str(work / "config.json")],
        timeout=300,
        cwd=run,
    )


def errors(text: str) -> list[str]:
    return re.findall(r"^cfm_plugins\.nonfinite\.NonFiniteLossError: (.*)$", text, re.M)


def checkpoints(run) -> list:
    return sorted((run / "logs").rglob("*.pk")) if (run / "logs").exists() else []


def test_hydragnn_binpack_stops_naming_the_graph_before_a_checkpoint(work):
    """The rank whose batch holds the graph stops in epoch 0 and names it by its place in the
    training set; no checkpoint is written; the run ends with an error."""
    run, out = train(work, "error", "--enable", "hydragnn,binpack")
    assert out.returncode != 0, out.stdout[-4000:]
    said = errors(out.stdout)
    assert len(said) == 1, out.stdout[-4000:]
    assert "the training loss of HydraGNN is nan at epoch 0, step" in said[0], said[0]
    assert re.search(
        rf"HydraGNN's training set \(the trainset given to create_dataloaders\): "
        rf"structures? ([0-9, ]+, )?{BAD}\b[0-9, ]*\(counted from 0, in the order of that list\)",
        said[0],
    ), said[0]
    assert checkpoints(run) == [], checkpoints(run)


def test_hydragnn_without_binpack_stops_and_says_how_to_have_the_graphs_named(work):
    run, out = train(work, "stock", "--enable", "hydragnn")
    assert out.returncode != 0, out.stdout[-4000:]
    said = errors(out.stdout)
    assert said and "with binpack's batches they are named" in said[0], out.stdout[-4000:]
    assert checkpoints(run) == []


def test_hydragnn_skip_trains_on_names_the_step_and_keeps_finite_weights(work):
    """nonfinite=skip: the step with the graph is skipped on both ranks in each epoch (the other
    rank's batch counted as another rank's), named at the end; the losses logged and the saved
    weights are finite."""
    run, out = train(work, "skip", "--enable", "hydragnn,binpack", "-o", "nonfinite=skip")
    assert out.returncode == 0, out.stdout[-4000:]
    summaries = re.findall(
        r"nonfinite=skip: (\d+) training step\(s\) of HydraGNN skipped on rank "
        r"(\d) \(no optimizer step\); (\d+) for a non-finite loss of this "
        r"rank's batch(.*)",
        out.stdout,
    )
    assert len(summaries) == 2, out.stdout[-4000:]
    total = {int(s[0]) for s in summaries}
    assert total == {2}, summaries  # one step in each of the 2 epochs, skipped on both ranks
    # the graph's rank names it, in each epoch (binpack may place it on either rank)
    assert sum(int(s[2]) for s in summaries) == 2, summaries
    own = [s for s in summaries if int(s[2]) > 0]
    assert all(re.search(rf"structures? ([0-9, ]+, )?{BAD}\b", s[3]) for s in own), summaries
    losses = [
        float(x) for x in re.findall(r"Epoch: \d+, Train Loss: ([0-9.eE+-]+|nan)", out.stdout)
    ]
    assert len(losses) == 2 and all(np.isfinite(losses)), losses
    saved = checkpoints(run)
    assert saved, "HydraGNN wrote no model"
    state = torch.load(saved[-1], map_location="cpu", weights_only=False)
    weights = state.get("model_state_dict", state)
    assert all(torch.isfinite(v).all() for v in weights.values() if torch.is_tensor(v))
