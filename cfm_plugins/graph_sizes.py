"""Graph sizes as adapters hand them to the sampler."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GraphSizes:
    """Atom and edge counts of some samples of a dataset.

    ``indices`` are the global dataset indices these counts belong to (one rank's shard under
    MPI; the sampler gathers the shards); ``None`` means all samples, in order. ``edges`` may be
    ``None`` when only atoms were read (edges cost a neighbour list on some datasets); counts that
    readers mark as not read (negative) make it ``None`` too.
    """

    atoms: np.ndarray
    edges: np.ndarray | None = None
    indices: np.ndarray | None = None

    def __post_init__(self):
        self.atoms = np.asarray(self.atoms, dtype=np.int64)
        if self.edges is not None:
            self.edges = np.asarray(self.edges, dtype=np.int64)
            if (self.edges < 0).any():
                self.edges = None
        if self.edges is not None:
            if self.edges.shape != self.atoms.shape:
                raise ValueError(
                    f"GraphSizes: {self.atoms.shape[0]} atom counts but {self.edges.shape[0]} edge "
                    "counts"
                )
        if self.indices is not None:
            self.indices = np.asarray(self.indices, dtype=np.int64)
            if self.indices.shape != self.atoms.shape:
                raise ValueError(
                    f"GraphSizes: {self.atoms.shape[0]} counts but {self.indices.shape[0]} indices"
                )

    def __len__(self) -> int:
        return int(self.atoms.shape[0])


def shard_indices(n: int, dist) -> np.ndarray:
    """The samples this rank reads the sizes of: every ``world_size``-th of ``n`` from its rank
    (all of them on one rank). The sampler gathers the shards, so no rank reads every sample."""
    if dist.world_size == 1 or dist.comm is None:
        return np.arange(n, dtype=np.int64)
    return np.arange(dist.rank, n, dist.world_size, dtype=np.int64)
