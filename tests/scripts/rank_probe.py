"""Run under `mpirun -np 2 cfm-run -- python tests/scripts/rank_probe.py FLAGS`: probes of the
ranks.

--listeners   print every TCP socket this process listens on (from /proc), after the process group
exists,
              and the Open MPI transports it was started with (OMPI_MCA_btl)
--stall-rank-1  rank 1 sleeps instead of joining the all_reduce (a stalled rank)
--fail-on-rank-1  rank 1 raises
--kill-rank-1  rank 1 kills itself with SIGKILL (nothing of it can clean up); rank 0 waits in a
barrier --device      print the CUDA device each rank uses
"""

import os
import signal
import socket
import struct
import sys
import time

import torch
import torch.distributed as dist


def listening_sockets() -> list[str]:
    """``addr:port`` of every socket of this process in LISTEN state (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(table):
            continue
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            if family == socket.AF_INET:
                addr = socket.inet_ntop(family, raw[::-1])
            else:
                addr = socket.inet_ntop(
                    family, b"".join(struct.pack("<I", w) for w in struct.unpack(">4I", raw))
                )
            found.append(f"{addr}:{int(hexport, 16)}")
    return found


assert dist.is_initialized(), "cfm-run did not create a process group"
rank = dist.get_rank()
print(f"ARGS rank={rank} {' '.join(sys.argv[1:])}", flush=True)
if "--stall-rank-1" in sys.argv and rank == 1:
    time.sleep(120)
if "--fail-on-rank-1" in sys.argv and rank == 1:
    raise RuntimeError("deliberate failure on rank 1")
if "--kill-rank-1" in sys.argv and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
t = torch.tensor([rank + 1.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
dist.all_reduce(t)
if "--listeners" in sys.argv:
    print(f"LISTEN rank={rank} {' '.join(listening_sockets())}", flush=True)
    print(f"BTL rank={rank} {os.environ.get('OMPI_MCA_btl')}", flush=True)
if "--device" in sys.argv:
    print(
        f"DEVICE rank={rank} cuda:{torch.cuda.current_device()} backend={dist.get_backend()} "
        f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}",
        flush=True,
    )
dist.barrier()
print(f"DONE rank={rank} sum={t.item():g}", flush=True)
