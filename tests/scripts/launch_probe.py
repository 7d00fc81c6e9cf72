"""Run under cfm-run (any launcher, or none): prints what cfm-run set up for this process.

RANKS rank=R world=W local=L backend=B
"""

import os
import sys

import torch.distributed as dist

if dist.is_initialized():
    rank, world, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
else:
    rank, world, backend = 0, 1, None
# one write per line: ranks that share a stdout must not split each other's lines
sys.stdout.write(
    f"RANKS rank={rank} world={world} local={os.environ.get('LOCAL_RANK', '0')} backend={backend}\n"
)
sys.stdout.flush()
