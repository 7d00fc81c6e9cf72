"""Padding overhead of static shapes: pad atoms and pad edges when every bin-packed batch is padded to one budget.

For the example sets (CuNi of ``cfm_plugins.datasets.cuni``, edges from ASE's neighbour list at
r_max 5 A; the molecular clusters of ``cfm_plugins.datasets.clusters``) and for the MACE paper's
Table-3 mix (``benchmarks.workload.paper_mix``; it has atom counts only, so edges are modelled as
atoms x a per-graph neighbour count drawn uniformly from 10-60, seeded: the atom figure is exact,
the edge figure is an estimate), the budget is made as the ``static`` plugin makes it
(:func:`cfm_plugins.static.budget.budget_from_plan` over the first ``--epochs`` epochs' plans,
capacity = ``--capacity`` atoms, default headroom) and the padding of every batch of those epochs
is reported.

    python -m benchmarks.static_shapes [--capacity 3072] [--world 8] [--epochs 3]

Not measured here (see docs/benchmarks.md): the CPU training epoch eager-fused vs compiled + static.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from cfm_plugins.sampler.packing import pack
from cfm_plugins.static.budget import DEFAULT_HEADROOM, budget_from_plan, padding_overhead


def cuni_sizes(n: int, seed: int = 0, r_max: float = 5.0):
    from ase.neighborlist import neighbor_list

    from cfm_plugins.datasets.cuni import make_structure

    rng = np.random.default_rng(seed)
    frames = [make_structure(rng, 500) for _ in range(n)]
    return (np.array([len(a) for a in frames], np.int64),
            np.array([len(neighbor_list("i", a, r_max)) for a in frames], np.int64))


def cluster_sizes(n: int, seed: int = 0):
    from cfm_plugins.datasets.clusters import make_dataset

    graphs = make_dataset(n, seed)
    return (np.array([int(g.num_nodes) for g in graphs], np.int64),
            np.array([int(g.edge_index.shape[1]) for g in graphs], np.int64))


def table3_sizes(n: int, seed: int = 0):
    from benchmarks.workload import paper_mix

    atoms = paper_mix(n, seed=seed)
    nbrs = np.random.default_rng(seed + 1).integers(10, 61, len(atoms))
    return atoms, atoms * nbrs


def overhead_row(name, atoms, edges, capacity, world, epochs):
    plans = [pack(atoms, capacity, world, seed=e) for e in range(epochs)]
    budget = budget_from_plan(plans, atoms, edges, capacity, DEFAULT_HEADROOM)
    o = padding_overhead(plans, atoms, edges, budget)
    return (f"| {name} | {len(atoms)} | {capacity} | {budget} | {o.batches} | {100 * o.atoms:.2f}% | "
            f"{100 * o.edges:.2f}% |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=3072, help="bin capacity in atoms (max_tokens)")
    ap.add_argument("--world", type=int, default=8, help="ranks the plan is dealt to")
    ap.add_argument("--epochs", type=int, default=3, help="epochs whose plans the budget covers (budget_epochs)")
    ap.add_argument("--cuni", type=int, default=400, help="CuNi structures")
    ap.add_argument("--clusters", type=int, default=2000, help="cluster graphs")
    ap.add_argument("--table3", type=int, default=200_000, help="graphs of the Table-3 mix")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(f"static shapes padding overhead: capacity {args.capacity} atoms, {args.world} ranks, budget over "
          f"{args.epochs} epoch plans, headroom {DEFAULT_HEADROOM:g}")
    print("| set | graphs | capacity | budget | batches | pad atoms | pad edges |")
    print("|---|---|---|---|---|---|---|")
    for name, sizes in (("CuNi (example)", lambda: cuni_sizes(args.cuni)),
                        ("clusters (example)", lambda: cluster_sizes(args.clusters)),
                        ("Table-3 mix (edges modelled)", lambda: table3_sizes(args.table3))):
        atoms, edges = sizes()
        print(overhead_row(name, atoms, edges, args.capacity, args.world, args.epochs), flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
