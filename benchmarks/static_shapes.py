"""Padding overhead of static shapes: pad atoms and edges when every batch is padded to one budget.

    python -m benchmarks.static_shapes [--batch-size 4] [--capacity C] [--world 2 8] [--epochs 3]
        [--out DIR]

For the example sets (CuNi, :func:`cuni_sizes`; the molecular clusters, :func:`cluster_sizes`)
and the MACE paper's Table-3 mix (:func:`table3_sizes`, its edges an estimate), the budget is made
as the ``static`` plugin makes it, and the padding of every batch of the first ``--epochs``
epochs' plans is reported (:func:`overhead_row`): for the bins the plugin packs (even in atoms and
edges together), for bins even in one size only, by atoms and by edges, and for Algorithm 1's
full bins. Prints the table and writes the record ``static_shapes`` to ``--out`` (default
``out/benchmarks/``). The training epoch eager-fused vs compiled + static is timed by ``python -m
benchmarks.static_train``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.record import add_out_argument, command_line, markdown_table, write_record
from cfm_plugins.sampler.even_dims import pack_even_dims
from cfm_plugins.sampler.packing import pack, pack_even
from cfm_plugins.static_shapes.budget import DEFAULT_HEADROOM, budget_of_plans, padding_overhead


def cuni_sizes(n: int, seed: int = 0, r_max: float = 5.0):
    """(atoms, edges) of ``n`` CuNi structures of ``cfm_plugins.datasets.cuni``, the edges from
    ASE's neighbour list at ``r_max`` (A)."""
    from ase.neighborlist import neighbor_list

    from cfm_plugins.datasets.cuni import make_structure

    rng = np.random.default_rng(seed)
    frames = [make_structure(rng, 500) for _ in range(n)]
    return (
        np.array([len(a) for a in frames], np.int64),
        np.array([len(neighbor_list("i", a, r_max)) for a in frames], np.int64),
    )


def cluster_sizes(n: int, seed: int = 0):
    """(atoms, edges) of ``n`` molecular clusters of ``cfm_plugins.datasets.clusters`` (their own
    edges)."""
    from cfm_plugins.datasets.clusters import make_dataset

    graphs = make_dataset(n, seed)
    return (
        np.array([int(g.num_nodes) for g in graphs], np.int64),
        np.array([int(g.edge_index.shape[1]) for g in graphs], np.int64),
    )


def table3_sizes(n: int, seed: int = 0):
    """(atoms, edges) of ``n`` graphs of the MACE paper's Table-3 mix
    (``benchmarks.workload.paper_mix``). It has atom counts only, so the edges are modelled as
    atoms x a per-graph neighbour count drawn uniformly from 10-60, seeded: the atom figure is
    exact, the edge figure an estimate."""
    from benchmarks.workload import paper_mix

    atoms = paper_mix(n, seed=seed)
    nbrs = np.random.default_rng(seed + 1).integers(10, 61, len(atoms))
    return atoms, atoms * nbrs


def overhead_row(name, atoms, edges, cost, batch_size, capacity, world, epochs, even):
    """One table row: the budget the ``static`` plugin makes for plans packed by ``cost`` (atoms or
    edges; ``even``: ``"joint"`` in atoms and edges, ``True`` in the cost, ``False`` full bins) and
    the padding of every batch of the first ``epochs`` plans.

    The budget is :func:`cfm_plugins.static_shapes.budget.budget_of_plans` over those plans with
    the default headroom, at binpack's default capacity (``batch_size`` x the mean cost, at least
    the largest structure) or ``capacity``. The bins: the plugin's, even in atoms and edges
    together (``pack_even_dims``); even in one size only (``pack_even``), by atoms (binpack's
    default cost) or by edges (``cost=edges``); and, for comparison, Algorithm 1's full bins
    (``pack``) padded to the capacity."""
    from cfm_plugins.plugins.binpack import default_capacity

    costs = atoms if cost == "atoms" else edges
    capacity = capacity or default_capacity(costs.mean(), costs.max(), batch_size)
    dims = np.column_stack([atoms, edges]) if even == "joint" else None
    plans = [
        pack_even_dims(costs, dims, capacity, world, seed=e)
        if even == "joint"
        else (pack_even if even else pack)(costs, capacity, world, seed=e)
        for e in range(epochs)
    ]
    budget = budget_of_plans(
        plans, costs, atoms, edges, capacity, DEFAULT_HEADROOM
    )  # as the static plugin
    joint = all(p.limits is not None for p in plans)
    kind = (
        "even in atoms and edges"
        if joint
        else {"joint": "even (joint fell back)", True: "even", False: "full (Algorithm 1)"}[even]
    )
    o = padding_overhead(plans, atoms, edges, budget)
    return (
        f"| {name} | {len(atoms)} | {world} | {cost} | {capacity:g} | {kind} | "
        f"{budget} | {o.batches} | {100 * o.atoms:.2f}% | {100 * o.edges:.2f}% |"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--batch-size",
        type=int,
        default=4,
        help="the trainer's batch size: binpack's default capacity "
        "is this x the mean atom count (the MACE demo's is 4)",
    )
    ap.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="bin capacity (max_tokens, in the cost's units) instead of the default",
    )
    ap.add_argument(
        "--world", type=int, nargs="+", default=[2, 8], help="ranks the plans are dealt to"
    )
    ap.add_argument(
        "--epochs", type=int, default=3, help="epochs whose plans the budget covers (budget_epochs)"
    )
    ap.add_argument("--cuni", type=int, default=400, help="CuNi structures")
    ap.add_argument("--clusters", type=int, default=2000, help="cluster graphs")
    ap.add_argument("--table3", type=int, default=200_000, help="graphs of the Table-3 mix")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    command = command_line(argv)
    t0 = time.perf_counter()
    capacity = args.capacity or f"binpack default ({args.batch_size} x the mean cost)"
    description = (
        f"static shapes padding overhead: capacity {capacity}, ranks {args.world}, budget over "
        f"{args.epochs} epoch plans, headroom {DEFAULT_HEADROOM:g}; {args.cuni} CuNi structures "
        f"(edges at r_max 5 A), {args.clusters} cluster graphs, {args.table3} graphs of the MACE "
        "paper's Table-3 mix (edges modelled: atoms x a neighbour count drawn from 10-60)"
    )
    print(description)
    table = [
        "| set | graphs | ranks | cost | capacity | bins | budget | batches | pad atoms | pad "
        "edges |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(table))
    for name, sizes in (
        ("CuNi (example)", lambda: cuni_sizes(args.cuni)),
        ("clusters (example)", lambda: cluster_sizes(args.clusters)),
        ("Table-3 mix (edges modelled)", lambda: table3_sizes(args.table3)),
    ):
        atoms, edges = sizes()
        for world in args.world:
            for cost, even in (
                ("atoms", "joint"),
                ("atoms", True),
                ("atoms", False),
                ("edges", True),
            ):
                table.append(
                    overhead_row(
                        name,
                        atoms,
                        edges,
                        cost,
                        args.batch_size,
                        args.capacity,
                        world,
                        args.epochs,
                        even,
                    )
                )
                print(table[-1], flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    write_record(
        "static_shapes",
        "Padding of static shapes: every bin-packed batch padded to one budget",
        [
            markdown_table(
                "padding",
                table,
                "per data set, ranks, binpack cost and kind of bins: the budget the static plugin "
                "makes and the share of pad atoms and pad edges over every batch of the epochs",
            )
        ],
        description=description,
        out=args.out,
        command=command,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
