"""Run under `mpirun -np 2 cfm-run -- python tests/scripts/allreduce_ranks.py`: checks the process
group."""

import os
import sys

import torch
import torch.distributed as dist

assert dist.is_initialized(), "cfm-run did not create a process group"
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
# one write per line: ranks that share a stdout (torchrun's) must not split each other's lines
sys.stdout.write(
    f"RESULT rank={rank} world={world} sum={t.item():g} backend={dist.get_backend()} "
    f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} argv={sys.argv[1:]}\n"
)
sys.stdout.flush()
if "--fail-on-rank-1" in sys.argv and rank == 1:
    raise RuntimeError("deliberate failure on rank 1")
if "--fail-on-rank-1" in sys.argv:
    dist.barrier()  # rank 0 would wait here forever if rank 1's failure did not end the job
