"""HydraGNN's own node-budget batching (``NeuralNetwork.Training.Batching``, mode
``node_budget``) with binpack enabled too: binpack's batches replace HydraGNN's, packed to the
config's ``max_nodes``, said once on rank 0; a 2-rank run of ``examples/hydragnn/mace/train.py``
(HydraGNN from source), and a cost whose capacity is not in atoms refused."""

from __future__ import annotations

import json
import random
import re

import pytest

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

import torch  # noqa: E402

from cfm_plugins.steplog import read_step_logs  # noqa: E402
from tests.helpers import BIN, run_mpi  # noqa: E402
from tests.helpers.hydragnn_source import EXAMPLE, example_config  # noqa: E402

EPOCHS = 2
BUDGET = 60  # max_nodes: atoms per batch
SAID = (
    "HydraGNN's NeuralNetwork.Training.Batching (mode node_budget, max_nodes 60) is replaced by "
    "binpack's batches: capacity 60 atoms, its max_nodes (binpack's max_tokens is not set)"
)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """16 EMT graphs of 3..24 atoms, each tagged with its index; the example's config at hidden 4,
    one layer, batch 4, with HydraGNN's node-budget batching."""
    from cfm_plugins.datasets.clusters import make_dataset

    folder = tmp_path_factory.mktemp("hydragnn_node_budget")
    graphs = make_dataset(16, seed=1, max_atoms=24, forces=True)
    for i, g in enumerate(graphs):
        g.idx = torch.tensor([i])
    config = example_config(hidden_dim=4, num_conv_layers=1, max_ell=1, correlation=2)
    config["NeuralNetwork"]["Architecture"]["output_heads"]["node"]["dim_headlayers"] = [4, 4]
    (folder / config["Dataset"]["path"]["total"]).parent.mkdir(parents=True)
    torch.save(graphs, folder / config["Dataset"]["path"]["total"])
    config["NeuralNetwork"]["Training"].update(
        num_epoch=EPOCHS, batch_size=4, Batching={"mode": "node_budget", "max_nodes": BUDGET}
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def run(work, label: str, *options: str):
    return run_mpi(
        [
            str(BIN / "cfm-run"),
            "--enable",
            "hydragnn,binpack",
            *[x for o in options for x in ("-o", o)],
            "--",
            "python",
            str(EXAMPLE / "train.py"),
            str(work / "config.json"),
            "--log",
            label,
        ],
        timeout=570,
        cwd=work,
    )


def test_binpack_replaces_hydragnns_node_budget_batches_at_its_budget(work):
    from hydragnn.preprocess.load_data import split_dataset

    out = run(work, "budget", f"step_log={work / 'steps'}")
    assert out.returncode == 0, out.stdout[-6000:]
    assert out.stdout.count(SAID) == 1, out.stdout[-6000:]  # rank 0, once
    assert len(
        re.findall(r"binpack train: \d+ steps? on each of 2 ranks, capacity 60 ", out.stdout)
    )
    graphs = torch.load(work / "dataset" / "clusters_forces.pt", weights_only=False)
    random.seed(0)  # the split train.py makes (--seed 0)
    expected = sorted(int(g.idx) for g in split_dataset(graphs, 0.8, False)[0])
    ranks = read_step_logs(str(work / "steps"))
    assert len(ranks) == 2 and len(ranks[0]) == len(ranks[1]) > 0
    assert all(rec["atoms"] <= BUDGET for r in ranks for rec in r)
    steps = len(ranks[0]) // EPOCHS
    assert steps * EPOCHS == len(ranks[0])
    for e in range(EPOCHS):
        ids = [i for r in ranks for rec in r[e * steps : (e + 1) * steps] for i in rec["ids"]]
        assert sorted(ids) == expected, f"epoch {e}: not every training graph exactly once"


def test_a_cost_not_in_atoms_without_max_tokens_is_refused_naming_the_key(work):
    out = run(work, "edges", "cost=edges")
    assert out.returncode == 2, out.stdout[-6000:]
    error = re.findall(r"cfm-run: error: binpack cost=edges .*", out.stdout)
    assert len(error) == 1, out.stdout[-6000:]
    assert "NeuralNetwork.Training.Batching.max_nodes (60 nodes)" in error[0]
    assert "max_tokens=N" in error[0] and "Traceback" not in out.stdout
