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


def graph_size(data, index: int) -> tuple[int, int]:
    if data is None:
        raise ValueError(f"graph {index} of the dataset could not be read (the dataset returned None)")
    edges = data.edge_index.shape[1] if getattr(data, "edge_index", None) is not None else 0
    return int(data.num_nodes), int(edges)


def local_sizes(dataset, indices=None) -> tuple[np.ndarray, np.ndarray]:
    """(atoms, edges) of the graphs ``indices`` (all when None) as two int64 arrays."""
    idx = range(len(dataset)) if indices is None else (int(i) for i in indices)
    pairs = [graph_size(dataset[i], i) for i in idx]
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0].copy(), arr[:, 1].copy()
