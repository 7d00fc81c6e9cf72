"""The hydragnn adapter's loaders: HydraGNN's own set_epoch calls reach the bin-packing batch
sampler."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)


def test_epoch_forwarder_reaches_the_batch_sampler():
    from cfm_plugins.sampler import BinPackBatchSampler
    from cfm_plugins_adapters.hydragnn.loader import EpochForwarder

    costs = np.arange(1, 41, dtype=float)
    bs = BinPackBatchSampler(costs, 60, rank=0, world_size=1, seed=3)
    fwd = EpochForwarder(bs, len(costs))
    first = list(bs)
    fwd.set_epoch(1)
    assert bs.epoch == 1 and list(bs) != first
    assert list(fwd) == list(range(40)) and len(fwd) == 40


def test_a_loader_read_on_one_rank_only_calls_no_collective():
    """Issue 83: HydraGNN's update_config reads the train, val and test loaders until the first
    batch whose node count differs, so the ranks stop in different loaders: reading a loader (a
    batch, or all of it) calls no collective; HydraGNN's set_epoch through the EpochForwarder at
    ``loader.sampler`` (every rank, every epoch) is where the plan is checked."""
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader

    from cfm_plugins.sampler import BinPackBatchSampler
    from cfm_plugins_adapters.hydragnn.loader import EpochForwarder
    from tests.sampler.comms import LoopbackComm

    atoms = np.random.default_rng(4).integers(3, 60, 40)
    graphs = [Data(x=torch.zeros(int(n), 1), idx=torch.tensor([i])) for i, n in enumerate(atoms)]
    loaders = []
    comm = LoopbackComm()
    for role in ("train", "valid"):
        bs = BinPackBatchSampler(
            atoms.astype(float),
            120,
            rank=0,
            world_size=2,
            seed=3,
            comm=comm,
            shuffle=role == "train",
            evaluation=role != "train",
            repeat=role == "train",
        )  # as binpack builds them
        loader = DataLoader(graphs, batch_sampler=bs)
        object.__setattr__(loader, "sampler", EpochForwarder(bs, len(graphs)))
        loaders.append(loader)
    built = comm.calls
    with comm.forbid("update_config's reading of the loaders"):
        for loader in loaders:
            next(iter(loader))
        list(loaders[1])  # one rank goes on to the end of the validation loader
    for epoch in (0, 1):
        for loader in loaders:
            loader.sampler.set_epoch(epoch)  # HydraGNN's train_validate_test, every rank
        with comm.forbid("an epoch"):
            ids = [i for batch in loaders[0] for i in batch.idx.tolist()]
        mine = [i for b in loaders[0].batch_sampler.plan().rank_bins(0, 2) for i in b.tolist()]
        assert sorted(ids) == sorted(mine)
    assert comm.calls == built + 4  # one plan check per loader and epoch


def test_loader_seam_serves_the_source_keywords_and_names_what_it_cannot():
    """HydraGNN's source adds keyword arguments to create_dataloaders: the shuffle flags and its own
    batching are served by binpack's plan; a process group, oversampling or an unknown argument
    send the call back to HydraGNN's own loaders, named in the warning."""
    from cfm_plugins_adapters.hydragnn.loader import unserved_arguments

    assert unserved_arguments((), {}) == []
    assert (
        unserved_arguments(
            (), {"train_sampler_shuffle": False, "batching": {"mode": "node_budget"}}
        )
        == []
    )
    assert unserved_arguments((True, True, True, None, False), {}) == []
    assert unserved_arguments((), {"oversampling": True, "group": "g"}) == [
        "oversampling=True",
        "group='g'",
    ]
    assert unserved_arguments((True, True, True, None, False, None, None, 8), {"later": 1}) == [
        "8",
        "later=1",
    ]


def test_hydragnns_node_budget_sets_binpacks_capacity_unless_given_and_is_said_once(caplog):
    """HydraGNN's Training.Batching under binpack: its max_nodes becomes max_tokens and its
    oversized_sample binpack's oversize where the user set neither; max_tokens given wins; a cost
    not counted in atoms without max_tokens is refused, naming the key and what to set."""
    import logging

    from cfm_plugins.config import Config
    from cfm_plugins.manager import create_manager
    from cfm_plugins.options import UsageError
    from cfm_plugins_adapters.hydragnn.loader import take_over_batching

    def config(**options):
        c = Config(enabled=["hydragnn", "binpack"], options=options)
        create_manager(c)
        return c

    caplog.set_level(logging.INFO, logger="cfm_plugins.hydragnn")
    batching = {"mode": "node_budget", "max_nodes": 300, "oversized_sample": "single"}
    c = config()
    for rank in (1, 0, 0):
        take_over_batching({**batching, "max_graphs": 10}, c, rank)
    assert c.get("max_tokens") == 300.0 and c.get("oversize") == "solo"
    assert c.option_sources["max_tokens"] == "NeuralNetwork.Training.Batching.max_nodes"
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "HydraGNN's NeuralNetwork.Training.Batching (mode node_budget, max_nodes 300) is replaced "
        "by binpack's batches: capacity 300 atoms, its max_nodes (binpack's max_tokens is not "
        "set); max_graphs 10 is not applied (bins hold any graph count)"
    ]  # rank 0, once

    c = config(max_tokens=500, oversize="skip", cost="edges")
    take_over_batching(batching, c, 0)
    assert c.get("max_tokens") == 500.0 and c.get("oversize") == "skip"
    assert (
        caplog.records[-1]
        .getMessage()
        .endswith("capacity max_tokens=500 (binpack's; max_nodes unused)")
    )
    take_over_batching(batching, c := config(cost="auto"), 0)  # planned in atoms at first
    assert c.get("max_tokens") == 300.0
    for options in ({"cost": "edges"}, {"cost": "linear", "cost_b": 0.5}):
        with pytest.raises(UsageError, match=r"Batching\.max_nodes \(300 nodes\): set binpack's"):
            take_over_batching(batching, config(**options), 0)
