"""Run under cfm-run (any launcher, or none): prints what cfm-run set up for this process.

RANKS rank=R world=W local=L backend=B
"""

import os

import torch.distributed as dist

if dist.is_initialized():
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
else:
    rank, world, backend = 0, 1, None
print(
    f"RANKS rank={rank} world={world} local={os.environ.get('LOCAL_RANK', '0')} backend={backend}",
    flush=True,
)
