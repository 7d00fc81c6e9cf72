"""Under `mpirun -np 2 python -m tests.scripts.sampler_shards MODE` (from the repository root): each
rank gives only its shard of the costs; the ranks must agree on one plan.

Modes (argv[1]):
  agree    - shards interleaved; every rank prints its batches; rank 0 checks the union and prints
  OK. diverge  - rank 1 uses another seed: every rank must raise the checksum RuntimeError (no
  hang). overlap  - both ranks claim sample 0: every rank must raise ValueError naming the overlap.
  edges    - as agree, each rank also giving its shard of the edges as step_sizes.
  edges_diverge - global costs, rank 1 giving other step_sizes: every rank must raise the
  RuntimeError naming step_sizes.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from benchmarks.workload import paper_mix
from cfm_plugins.sampler import BinPackBatchSampler

mode = sys.argv[1]
comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
atoms = paper_mix(20_000, seed=7)  # the "dataset"; each rank reads only its shard's sizes
local = np.arange(rank, len(atoms), world)  # interleaved shards
if mode == "overlap":
    local = np.r_[0, local] if rank == 1 else local
seed = 3 + (rank if mode == "diverge" else 0)
# edges per structure: a density of 10-60 neighbours per atom, the same on every rank
edges = atoms * np.random.default_rng(7).uniform(10, 60, len(atoms))

try:
    if mode == "edges_diverge":
        s = BinPackBatchSampler(
            atoms,
            3072,
            rank=rank,
            world_size=world,
            seed=seed,
            comm=comm,
            step_sizes=edges * (1 + rank),
        )
    else:
        s = BinPackBatchSampler(
            atoms[local],
            3072,
            rank=rank,
            world_size=world,
            seed=seed,
            comm=comm,
            local_indices=local,
            step_sizes=edges[local] if mode == "edges" else None,
        )
    epochs = {}
    for epoch in (0, 1):
        s.set_epoch(epoch)
        epochs[epoch] = list(s)
        assert len(epochs[epoch]) == len(s)
except (RuntimeError, ValueError) as exc:
    print(f"RAISED rank={rank} {type(exc).__name__}: {exc}", flush=True)
    sys.exit(0)

gathered = comm.gather(
    {"rank": rank, "len": len(s), "epochs": epochs, "checksum": s.plan().checksum()}, root=0
)
if rank == 0:
    lens = {g["len"] for g in gathered}
    assert len({g["checksum"] for g in gathered}) == 1, "plans differ"
    for epoch in (0, 1):
        steps = {len(g["epochs"][epoch]) for g in gathered}
        assert len(steps) == 1, f"ranks have different step counts {steps}"
        seen = np.sort(
            np.concatenate(
                [np.concatenate([np.asarray(b) for b in g["epochs"][epoch]]) for g in gathered]
            )
        )
        assert np.array_equal(seen, np.arange(len(atoms))), (
            "union over ranks is not every sample exactly once"
        )
        n_steps = steps.pop()
        per_step = np.array(
            [[atoms[g["epochs"][epoch][k]].sum() for g in gathered] for k in range(n_steps)]
        )
        assert per_step.max() <= 3072
        step_edges = np.array(
            [[edges[g["epochs"][epoch][k]].sum() for g in gathered] for k in range(n_steps)]
        )
    print(
        "OK "
        + json.dumps(
            {
                "steps": sorted(lens),
                "samples": len(atoms),
                "imbalance": float(np.mean(per_step.max(1) / per_step.mean(1))),
                "edge_imbalance": float(np.mean(step_edges.max(1) / step_edges.mean(1))),
            }
        ),
        flush=True,
    )
