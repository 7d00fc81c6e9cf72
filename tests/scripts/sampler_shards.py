"""Under `mpirun -np 2 python -m tests.scripts.sampler_shards MODE` (from the repository root): each
rank gives only its shard of the costs; the ranks must agree on one plan.

Modes (argv[1]):
  agree    - shards interleaved; every rank prints its batches; rank 0 checks the union and prints
  OK. diverge  - rank 1 uses another seed: every rank must raise the checksum RuntimeError (no
  hang). overlap  - both ranks claim sample 0: every rank must raise ValueError naming the overlap.
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

try:
    s = BinPackBatchSampler(
        atoms[local], 3072, rank=rank, world_size=world, seed=seed, comm=comm, local_indices=local
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
        per_step = np.array(
            [[atoms[g["epochs"][epoch][k]].sum() for g in gathered] for k in range(steps.pop())]
        )
        assert per_step.max() <= 3072
    print(
        "OK "
        + json.dumps(
            {
                "steps": sorted(lens),
                "samples": len(atoms),
                "imbalance": float(np.mean(per_step.max(1) / per_step.mean(1))),
            }
        ),
        flush=True,
    )
