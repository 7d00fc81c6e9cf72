"""cfm_plugins.datasets.clusters: molecules and metal clusters as PyG graphs, sizes spread, EMT
labels."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)

import torch  # noqa: E402

from cfm_plugins.datasets.clusters import make_dataset  # noqa: E402


@pytest.fixture(scope="module")
def graphs():
    """The set the HydraGNN adapter tests train on: 60 structures of 3..120 atoms."""
    return make_dataset(60, seed=1, max_atoms=120)


def test_example_set_is_size_diverse_with_emt_labels(graphs):
    from ase import Atoms
    from ase.calculators.emt import EMT

    atoms = np.array([g.num_nodes for g in graphs])
    assert atoms.min() <= 5 and atoms.max() >= 60, (atoms.min(), atoms.max())
    for g in (graphs[int(np.argmin(atoms))], graphs[int(np.argmax(atoms))]):
        at = Atoms(numbers=g.x.view(-1).long().numpy(), positions=g.pos.double().numpy())
        at.calc = EMT()
        assert abs(at.get_potential_energy() / len(at) - float(g.y)) < 1e-5
        src, dst = g.edge_index
        assert (g.pos[src] - g.pos[dst]).norm(dim=1).max() <= 5.0 + 1e-5  # radius graph
        assert torch.bincount(dst, minlength=g.num_nodes).max() <= 20  # max_neighbours
