"""Per-sample graph sizes (atoms, edges) of the datasets mace_run_train builds.

- xyz input: a list of ``AtomicData`` (sizes read off each graph);
- HDF5 input: ``mace.data.HDF5Dataset`` (atoms read from the file without building the graph;
  edges need the graph, built only when the cost uses edges);
- LMDB input: ``mace.data.LMDBDataset`` (each sample built once);
- ``torch.utils.data.ConcatDataset`` of any of these (what mace makes of several files/heads).

``local_sizes`` gives the sizes of one rank's shard only (``indices``), so under MPI each rank
reads ``1/world_size`` of the data and the sampler gathers the rest.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import ConcatDataset


def _graph_size(data) -> tuple[int, int]:
    return int(data.num_nodes), int(data.edge_index.shape[1])


def _hdf5_atoms(dataset, index: int) -> int:
    batch_index, config_index = divmod(index, dataset.batch_size)
    grp = dataset.file["config_batch_" + str(batch_index)]
    return int(grp["config_" + str(config_index)]["atomic_numbers"].shape[0])


def sample_size(dataset, index: int, need_edges: bool = True) -> tuple[int, int]:
    """(atoms, edges) of sample ``index``; edges is -1 when not needed and costly to get."""
    if isinstance(dataset, ConcatDataset):
        import bisect

        d = bisect.bisect_right(dataset.cumulative_sizes, index)
        start = dataset.cumulative_sizes[d - 1] if d > 0 else 0
        return sample_size(dataset.datasets[d], index - start, need_edges)
    if not need_edges and hasattr(dataset, "file") and hasattr(dataset, "batch_size"):
        return _hdf5_atoms(dataset, index), -1
    item = dataset[index]
    if item is None:
        raise ValueError(
            f"sample {index} of {type(dataset).__name__} could not be read (the dataset returned "
            "None)"
        )
    return _graph_size(item)


def local_sizes(dataset, indices, need_edges: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Sizes of the samples ``indices`` of ``dataset`` as two int64 arrays."""
    if isinstance(dataset, list):  # fast path: in-memory AtomicData
        pairs = [_graph_size(dataset[i]) for i in indices]
    else:
        pairs = [sample_size(dataset, int(i), need_edges) for i in indices]
    arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0].copy(), arr[:, 1].copy()


def is_mace_dataset(dataset) -> bool:
    if isinstance(dataset, ConcatDataset):
        return all(is_mace_dataset(d) for d in dataset.datasets)
    if isinstance(dataset, list):
        return len(dataset) == 0 or hasattr(dataset[0], "edge_index")
    return type(dataset).__module__.startswith("mace.")
