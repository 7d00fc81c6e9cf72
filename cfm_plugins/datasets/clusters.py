"""A size-diverse set of molecules and metal clusters (3 to 300 atoms) with EMT labels, as PyG
graphs.

:func:`make_dataset` makes, with ASE alone (no download), the list of
``torch_geometric.data.Data`` graphs HydraGNN's examples train on: small H/C/N/O molecules of
the G2 set and Cu, Ni, Ag, Au, Pd, Pt or binary clusters of 13 to ``max_atoms`` atoms, sizes
log-uniform (the spread the HydraGNN paper blames for its load imbalance)
(:func:`make_structures`), rattled and labelled with ASE's EMT calculator (:func:`to_graph`:
targets, node features, edges). Deterministic for a seed. Needs ASE, torch and torch_geometric
(the ``[hydragnn]`` extra). The command line, which writes the list with ``torch.save`` and
prints a size summary, is ``examples/hydragnn/make_dataset.py``::

    python examples/hydragnn/make_dataset.py --out examples/hydragnn/dataset/clusters.pt -n 400
"""

from __future__ import annotations

import math

import numpy as np

MOLECULE_ELEMENTS = {"H", "C", "N", "O"}
METALS = ("Cu", "Ni", "Ag", "Au", "Pd", "Pt")
FCC_A = {"Cu": 3.61, "Ni": 3.52, "Ag": 4.09, "Au": 4.08, "Pd": 3.89, "Pt": 3.92}


def _molecule_names(min_atoms: int) -> list[str]:
    from ase.build import molecule
    from ase.collections import g2

    names = []
    for name in g2.names:
        at = molecule(name)
        if len(at) >= min_atoms and set(at.get_chemical_symbols()) <= MOLECULE_ELEMENTS:
            names.append(name)
    return sorted(names)


def _cluster(rng: np.random.Generator, target: int, max_atoms: int):
    """A metal cluster of about ``target`` atoms (never more than ``max_atoms``)."""
    from ase.build import bulk
    from ase.cluster import Icosahedron, Octahedron

    metal = str(rng.choice(METALS))
    kind = rng.choice(["ico", "octa", "cut"], p=[0.3, 0.2, 0.5])
    a = FCC_A[metal]
    at = None
    if kind == "ico":  # 13, 55, 147, 309 atoms: the largest shell count that fits
        shells = max(
            s for s in (2, 3, 4, 5) if 10 * s**3 / 3 - 5 * s**2 + 11 * s / 3 - 1 <= max(target, 13)
        )
        at = Icosahedron(metal, shells, latticeconstant=a)
    elif kind == "octa":
        for length in (5, 4, 3, 2):
            cand = Octahedron(metal, length, cutoff=length // 3, latticeconstant=a)
            if len(cand) <= max(target, 6):
                at = cand
                break
    if at is None or len(at) > max_atoms:  # a spherical cut of bulk with exactly `target` atoms
        n = int(min(max(target, 3), max_atoms))
        reps = int(math.ceil((n / 4) ** (1 / 3))) + 2
        blk = bulk(metal, "fcc", a=a, cubic=True).repeat((reps, reps, reps))
        centre = blk.get_cell().sum(axis=0) / 2 + rng.normal(0, 0.3, 3)
        order = np.argsort(np.linalg.norm(blk.positions - centre, axis=1))[:n]
        at = blk[order]
    at = at.copy()
    at.pbc = False
    at.cell = None
    if rng.random() < 0.4:  # binary alloy: a random second metal on a random share of the sites
        other = str(rng.choice([m for m in METALS if m != metal]))
        sym = np.array(at.get_chemical_symbols())
        sym[rng.random(len(at)) < rng.uniform(0.1, 0.5)] = other
        at.set_chemical_symbols(sym)
    return at


def _edges(atoms, radius: float, max_neighbours: int) -> np.ndarray:
    """Directed edges (2, E) to every neighbour within ``radius``, the nearest
    ``max_neighbours``."""
    from ase.neighborlist import neighbor_list

    i, j, d = neighbor_list("ijd", atoms, radius)
    keep = np.zeros(len(i), dtype=bool)
    for atom in np.unique(i):
        rows = np.flatnonzero(i == atom)
        keep[rows[np.argsort(d[rows], kind="stable")[:max_neighbours]]] = True
    # HydraGNN's convention: edge_index[0] = source (neighbour j), edge_index[1] = target (i)
    return np.stack([j[keep], i[keep]]).astype(np.int64)


def to_graph(atoms, radius: float, max_neighbours: int, forces: bool = False):
    """One PyG graph with the EMT energy per atom as its target (graph head, eV/atom), or
    (``forces``: an interatomic potential, HydraGNN's ``enable_interatomic_potential``) with the
    total energy and the forces, the fields HydraGNN's interatomic-potential loss reads
    (``energy``, eV, ``forces``, eV/A; ``y`` is the total energy too).

    Node features: the atomic number (``x``), positions ``pos``. Edges (``edge_index``): every
    neighbour within ``radius`` (ASE's neighbour list), at most ``max_neighbours`` nearest per
    atom, as HydraGNN's ``RadiusGraph`` does; computed here because PyG's ``radius_graph`` needs
    torch-cluster, which has no wheels for every torch. EMT has parameters for H, C, N, O and
    the metals used."""
    import torch
    from ase.calculators.emt import EMT
    from torch_geometric.data import Data

    atoms = atoms.copy()
    atoms.calc = EMT()
    energy = float(atoms.get_potential_energy())
    z = torch.tensor(atoms.get_atomic_numbers(), dtype=torch.float32).view(-1, 1)
    graph = Data(
        x=z,
        pos=torch.tensor(atoms.positions, dtype=torch.float32),
        edge_index=torch.from_numpy(_edges(atoms, radius, max_neighbours)),
        y=torch.tensor([energy / len(atoms)], dtype=torch.float32),
        num_nodes=len(atoms),
    )
    if forces:
        graph.y = torch.tensor([energy], dtype=torch.float32)
        graph.energy = torch.tensor([energy], dtype=torch.float32)
        graph.forces = torch.tensor(atoms.get_forces(), dtype=torch.float32)
    return graph


def make_structures(
    n: int, seed: int = 0, min_atoms: int = 3, max_atoms: int = 300, molecule_share: float = 0.3
) -> list:
    """``n`` rattled structures: about ``molecule_share`` molecules, the rest metal clusters.

    Molecules: the G2 set's made only of H, C, N, O (3 to ~20 atoms, ``ase.build.molecule``).
    Clusters of Cu, Ni, Ag, Au, Pd, Pt or a random binary mix: icosahedra, octahedra and random
    spherical cuts of fcc bulk, 13 to ``max_atoms`` atoms, sizes drawn log-uniformly so that
    small and large graphs are both common."""
    from ase.build import molecule

    rng = np.random.default_rng(seed)
    names = _molecule_names(min_atoms)
    out = []
    for _ in range(n):
        if rng.random() < molecule_share:
            at = molecule(str(rng.choice(names)))
        else:
            lo = max(min_atoms, 13)
            target = int(round(math.exp(rng.uniform(math.log(lo), math.log(max_atoms)))))
            at = _cluster(rng, target, max_atoms)
        at.positions += rng.normal(0.0, 0.05, size=at.positions.shape)
        out.append(at)
    order = rng.permutation(len(out))  # not sorted by kind: a random split sees every size
    return [out[i] for i in order]


def make_dataset(
    n: int,
    seed: int = 0,
    min_atoms: int = 3,
    max_atoms: int = 300,
    radius: float = 5.0,
    max_neighbours: int = 20,
    forces: bool = False,
) -> list:
    """``n`` labelled PyG graphs (:func:`make_structures`, then :func:`to_graph`); the same list for
    the same arguments."""
    return [
        to_graph(a, radius, max_neighbours, forces)
        for a in make_structures(n, seed, min_atoms, max_atoms)
    ]
