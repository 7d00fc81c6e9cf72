"""Graph sizes as adapters hand them to the sampler."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GraphSizes:
    """Atom and edge counts of some samples of a dataset.

    ``indices`` are the global dataset indices these counts belong to (one rank's shard under
    MPI; the sampler gathers the shards); ``None`` means all samples, in order. ``edges`` may be
    ``None`` when only atoms were read (edges cost a neighbour list on some datasets).
    """

    atoms: np.ndarray
    edges: np.ndarray | None = None
    indices: np.ndarray | None = None

    def __post_init__(self):
        self.atoms = np.asarray(self.atoms, dtype=np.int64)
        if self.edges is not None:
            self.edges = np.asarray(self.edges, dtype=np.int64)
            if self.edges.shape != self.atoms.shape:
                raise ValueError(f"GraphSizes: {self.atoms.shape[0]} atom counts but {self.edges.shape[0]} edge counts")
        if self.indices is not None:
            self.indices = np.asarray(self.indices, dtype=np.int64)
            if self.indices.shape != self.atoms.shape:
                raise ValueError(f"GraphSizes: {self.atoms.shape[0]} counts but {self.indices.shape[0]} indices")

    def __len__(self) -> int:
        return int(self.atoms.shape[0])
