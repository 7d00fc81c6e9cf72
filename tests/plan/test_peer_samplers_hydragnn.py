"""HydraGNN's own ``DistributedCostAwareBatchSampler`` (HydraGNN from source, ``.venv-hydragnn``:
``make test-hydragnn-src``) against its model in ``cfm_plugins.plan.peer_samplers``: the same
batches for the same seed, epoch and sizes, on one process over many cases, and on 2 MPI ranks
through HydraGNN's ``create_dataloaders`` with the ``Batching: {mode: node_budget}`` of a config."""

from __future__ import annotations

import json
import socket
import sys
import textwrap

import numpy as np
import pytest

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

from cfm_plugins.plan.peer_samplers import hydragnn_cost_aware  # noqa: E402
from tests.helpers import run_mpi  # noqa: E402


def per_rank(p, w):
    return [[p[s * w + r].tolist() for s in range(p.num_steps(w))] for r in range(w)]


class Sizes:
    """A data set HydraGNN's sampler reads the node counts of without loading a sample."""

    def __init__(self, n):
        self.n = np.asarray(n)

    def __len__(self):
        return len(self.n)

    def get_node_counts(self):
        return self.n.tolist()


def test_the_model_gives_hydragnns_batches():
    from hydragnn.preprocess.batch_sampler import DistributedCostAwareBatchSampler

    rng = np.random.default_rng(3)
    for case in range(30):
        n = int(rng.integers(1, 300))
        c = rng.integers(1, 60, n)
        w, cap = int(rng.integers(1, 9)), int(rng.integers(60, 400))
        seed, epoch = int(rng.integers(0, 5)), int(rng.integers(0, 3))
        opts = {
            "max_graphs": (None, 3)[case % 2],
            "pad_batches": case % 3 != 0,
            "oversized_sample": ("error", "single", "skip")[case % 3],
            "shuffle": case % 5 != 0,
        }
        if opts["oversized_sample"] != "error":
            c[int(rng.integers(n))] = cap + 5
        want = []
        for r in range(w):
            s = DistributedCostAwareBatchSampler(
                Sizes(c), cap, num_replicas=w, rank=r, seed=seed, **opts
            )
            s.set_epoch(epoch)
            want.append(list(s))
            assert len(s) == len(want[-1])
        p = hydragnn_cost_aware(c, cap, w, seed=seed, epoch=epoch, **opts)
        assert per_rank(p, w) == want, (case, opts)


SCRIPT = """
import json, os, sys
import numpy as np, torch
import torch.distributed as dist
from mpi4py import MPI
from torch_geometric.data import Data

comm = MPI.COMM_WORLD
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[2]
dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
from hydragnn.preprocess.load_data import create_dataloaders

atoms = np.random.default_rng(0).integers(3, 60, 150)
graphs = [Data(x=torch.zeros(int(n), 1), idx=torch.tensor([i])) for i, n in enumerate(atoms)]
batching = {"mode": "node_budget", "max_nodes": 200, "seed": 3}
train, _, _ = create_dataloaders(graphs, graphs[:20], graphs[:20], 8, batching=batching)
out = {"sampler": type(train.batch_sampler).__name__, "atoms": atoms.tolist(), "epochs": []}
for epoch in (0, 1):
    train.batch_sampler.set_epoch(epoch)  # as HydraGNN's train_validate_test does
    out["epochs"].append([b.idx.tolist() for b in train])
with open(os.path.join(sys.argv[1], f"rank{comm.rank}.json"), "w") as fh:
    json.dump(out, fh)
dist.destroy_process_group()
"""


@pytest.mark.mpi
def test_hydragnns_node_budget_loaders_on_two_ranks_yield_the_models_batches(tmp_path):
    script = tmp_path / "batching.py"
    script.write_text(textwrap.dedent(SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = run_mpi([sys.executable, str(script), str(tmp_path), str(port)], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert {r["sampler"] for r in ranks} == {"DistributedCostAwareBatchSampler"}
    atoms = np.array(ranks[0]["atoms"])
    for epoch in (0, 1):
        p = hydragnn_cost_aware(atoms, 200, 2, seed=3, epoch=epoch)
        assert [r["epochs"][epoch] for r in ranks] == per_rank(p, 2)
