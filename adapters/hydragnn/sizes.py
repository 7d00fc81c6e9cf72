"""Per-graph sizes (atoms, edges) of the PyG datasets HydraGNN trains on.

HydraGNN's data sets are lists (or torch ``Dataset`` objects, e.g. its serialized and ADIOS
datasets) of ``torch_geometric.data.Data`` graphs; a split made by
``hydragnn.preprocess.split_dataset`` is a slice of such a list. The sizes are read off each
graph (``num_nodes`` and ``edge_index.shape[1]``), one rank's shard at a time.
"""

from __future__ import annotations

import numpy as np


def _first(dataset):
    try:
        return dataset[0] if len(dataset) else None
    except (TypeError, IndexError, KeyError):
        return None


def is_pyg_dataset(dataset) -> bool:
    """A (possibly empty) sequence of PyG graphs."""
    try:
        from torch_geometric.data import Data
    except ImportError:
        return False
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        return False
    if len(dataset) == 0:
        return isinstance(dataset, list)
    return isinstance(_first(dataset), Data)


def graph_size(data, index: int, need_edges: bool = True) -> tuple[int, int]:
    """(atoms, edges) of one graph; edges ``-1`` when the graph has no ``edge_index`` and none are
    needed (``need_edges`` not ``True``: ``"wanted"`` uses them where present). A graph without
    ``edge_index`` where an edge-based cost needs it is an error naming it: counting its edges as
    0 would hide a data set built without its neighbour lists."""
    if data is None:
        raise ValueError(
            f"graph {index} of the dataset could not be read (the dataset returned None)"
        )
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        if need_edges is True:
            raise ValueError(
                f"graph {index} of the dataset has no edge_index, and the binpack cost needs edge "
                "counts (cost=edges, or linear with cost_b > 0): use cost=atoms (or linear with "
                "cost_b=0), or build the graphs' edges (e.g. "
                "torch_geometric.transforms.RadiusGraph) before training"
            )
        return int(data.num_nodes), -1
    return int(data.num_nodes), int(edge_index.shape[1])


def local_sizes(dataset, indices=None, need_edges: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(atoms, edges) of the graphs ``indices`` (all when None) as two int64 arrays (see
    :func:`graph_size`)."""
    idx = range(len(dataset)) if indices is None else (int(i) for i in indices)
    pairs = [graph_size(dataset[i], i, need_edges) for i in idx]
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0].copy(), arr[:, 1].copy()
