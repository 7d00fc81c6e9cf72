"""Sizes of HydraGNN's PyG graphs through the adapter's hooks into the binpack sampler (issue 24):
a graph without neighbours is packed under cost=edges, a graph without edge_index is an error
that names it, the cost kind and what to do."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)

import torch  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import DataLoader  # noqa: E402

from cfm_plugins.config import Config  # noqa: E402
from cfm_plugins.distributed import DistInfo  # noqa: E402
from cfm_plugins.manager import create_manager  # noqa: E402
from cfm_plugins.options import TrainerSettings  # noqa: E402


def graph(n: int, edges: bool = True) -> Data:
    """``n`` atoms on a line 1 apart, with every pair closer than 1.5 as an edge (none for one
    atom)."""
    pos = torch.arange(n, dtype=torch.float64)[:, None] * torch.tensor([1.0, 0.0, 0.0])
    d = torch.cdist(pos, pos)
    ei = ((d < 1.5) & (d > 0)).nonzero().T
    g = Data(x=torch.ones(n, 1), pos=pos, y=torch.tensor([float(n)]))
    if edges:
        g.edge_index = ei
    return g


def sampler(dataset, cost: str):
    config = Config(enabled=["hydragnn", "binpack"], options={"cost": cost, "max_tokens": "12"})
    pm = create_manager(config)
    dist = DistInfo()
    wants = pm.hook.cfm_needs_edges(config=config)  # as the adapter's loader asks
    need_edges = True if True in wants else ("wanted" if any(wants) else False)
    sizes = pm.hook.cfm_graph_sizes(dataset=dataset, indices=None, need_edges=need_edges)
    return pm.hook.cfm_batch_sampler(
        dataset=dataset,
        sizes=sizes,
        config=config,
        dist=dist,
        role="train",
        trainer=TrainerSettings(batch_size=2),
    )


def test_a_single_atom_graph_is_packed_under_cost_edges():
    dataset = [graph(4), graph(1), graph(6), graph(3)]
    assert dataset[1].edge_index.shape == (2, 0)  # a legal graph: no neighbours
    batch_sampler = sampler(dataset, "edges")
    batches = list(batch_sampler)
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    assert batch_sampler.costs[1] == 1.0  # one edge's cost
    seen = [int(n) for b in DataLoader(dataset, batch_sampler=batch_sampler) for n in b.y.tolist()]
    assert sorted(seen) == [1, 3, 4, 6]  # PyG batches it with the others


def test_a_graph_without_edge_index_is_an_error_naming_it_and_what_to_do():
    dataset = [graph(4), graph(5), graph(3, edges=False), graph(2)]
    with pytest.raises(
        ValueError,
        match=r"graph 2 of the dataset has no edge_index, and the binpack cost needs edge "
        r"counts \(cost=edges.*use cost=atoms",
    ):
        sampler(dataset, "edges")
    assert sorted(i for b in sampler(dataset, "atoms") for i in b) == [
        0,
        1,
        2,
        3,
    ]  # atoms need no edges
