"""Under `mpirun -np 2 python -m tests.scripts.autocost_ranks` (from the repository root): cost=auto
across real ranks. Each rank holds its shard of the sizes, times its batches of epoch 0 with a known
step-time model (plus noise of its own: a fit on one rank's records alone would differ between
ranks), and at set_epoch(1) the ranks gather, rank 0 fits, and both plan with rank 0's fit.
Rank 0 prints ``OK {json}`` with what the test checks.
"""

import json
import logging
import sys

import numpy as np
from mpi4py import MPI

from cfm_plugins.sampler import AutoCostBatchSampler, CostCalibration

C0, A, B = 2e-3, 1e-5, 2e-6  # seconds per step, per atom, per edge

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
rng = np.random.default_rng(11)
n = 600
atoms = rng.integers(3, 300, n)
edges = atoms * rng.choice([4, 12, 24], n)  # molecules, metals, dense cells: edges per atom differ
local = np.arange(rank, n, world)
noise = np.random.default_rng(100 + rank)


def true_lif(plan):
    """The LIF of a plan under the step-time model the ranks timed with (no noise)."""
    from cfm_plugins.sampler import load_imbalance_factor

    t = C0 + A * plan.bin_costs(atoms) + B * plan.bin_costs(edges)
    return load_imbalance_factor(t.reshape(-1, world))


s = AutoCostBatchSampler(
    atoms[local],
    edges[local],
    atoms[local].astype(float),
    2000,
    rank=rank,
    world_size=world,
    seed=5,
    comm=comm,
    local_indices=local,
    calibration=CostCalibration(warmup_steps=1),
)
try:
    seen, lif = {}, {}
    for epoch in (0, 1, 2):
        s.set_epoch(epoch)
        seen[epoch] = [b for batch in s for b in batch]
        lif[epoch] = true_lif(s.plan())
        if epoch == 0:
            for batch in s.plan().rank_bins(rank, world):
                a, e = int(atoms[batch].sum()), int(edges[batch].sum())
                t = (C0 + A * a + B * e) * (1 + 0.02 * noise.standard_normal())
                s.record_step(atoms=a, edges=e, graphs=len(batch), cpu_s=t, wall_s=None)
except (RuntimeError, ValueError) as exc:
    print(f"RAISED rank={rank} {type(exc).__name__}: {exc}", flush=True)
    sys.exit(1)

fit = s.calibrations[0].to_dict() if s.calibrations else None
out = comm.gather(
    {
        "fit": fit,
        "checksum": s.plan().checksum(),
        "label": s.cost_label,
        "seen": seen,
        "local_records": len(s.calibration.records),
    },
    root=0,
)
if rank == 0:
    assert all(o["fit"] is not None for o in out), "a rank has no fit"
    assert all(o["fit"] == out[0]["fit"] for o in out), "the ranks hold different fits"
    assert len({o["checksum"] for o in out}) == 1, "the ranks plan differently after the fit"
    for epoch in (0, 1, 2):
        union = np.sort(np.concatenate([o["seen"][epoch] for o in out]))
        assert np.array_equal(union, np.arange(n)), f"epoch {epoch}: not every sample exactly once"
    cal = out[0]["fit"]
    print(
        "OK "
        + json.dumps(
            {
                "labels": [o["label"] for o in out],
                "fit": cal["fit"],
                "lif_measured": cal["lif_measured"],
                "lif_predicted": cal["lif_predicted"],
                "from_epoch": cal["from_epoch"],
                "true_lif": lif,
            }
        ),
        flush=True,
    )
