"""Write a size-diverse set of molecules and metal clusters (3 to 300 atoms) with EMT labels, as PyG
graphs.

    python examples/hydragnn/make_dataset.py --out examples/hydragnn/dataset/clusters.pt -n 400

Writes the list of ``torch_geometric.data.Data`` graphs (what HydraGNN trains on) with
``torch.save`` and prints a size summary. Deterministic for a seed. The structures, labels and
edges are :mod:`cfm_plugins.datasets.clusters`'s (``make_dataset`` from Python).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from cfm_plugins.datasets.clusters import make_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output file (torch.save of a list of PyG Data)")
    p.add_argument("-n", "--num", type=int, default=400, help="number of structures")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-atoms", type=int, default=3)
    p.add_argument("--max-atoms", type=int, default=300)
    p.add_argument(
        "--radius",
        type=float,
        default=5.0,
        help="edge cutoff (A), as HydraGNN's Architecture.radius",
    )
    p.add_argument("--max-neighbours", type=int, default=20)
    args = p.parse_args(argv)
    import torch

    graphs = make_dataset(
        args.num, args.seed, args.min_atoms, args.max_atoms, args.radius, args.max_neighbours
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(graphs, out)
    atoms = np.array([g.num_nodes for g in graphs])
    edges = np.array([g.edge_index.shape[1] for g in graphs])
    print(
        f"{len(graphs)} graphs -> {out}: atoms {atoms.min()}..{atoms.max()} (mean "
        f"{atoms.mean():.1f}), edges {edges.min()}..{edges.max()} (mean {edges.mean():.1f}), "
        f"energy/atom {min(float(g.y) for g in graphs):.3f}..{max(float(g.y) for g in graphs):.3f} "
        "eV"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
