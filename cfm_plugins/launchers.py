"""Which launcher started this process, and what its variables say about the ranks.

cfm-run runs under ``mpirun``/``mpiexec``, ``srun`` and ``torchrun`` (and one process without any).
Each launcher tells its processes who they are through environment variables; several sets may be
present at once, so one rule picks the launcher (:func:`detect`: the innermost launcher, the one
that started this very process, wins), and cfm-run logs its choice once at start.

Every function here reads only the environment it is given (no MPI, no torch, no network), so the
rule is tested on plain dictionaries.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

#: what a launcher is called in messages
TORCHRUN, MPIRUN, SRUN, MPI, ENV, NONE = "torchrun", "mpirun", "srun", "mpi", "env", "none"

#: variables set by mpirun's own launcher for each rank (never by srun): (size, rank, local rank,
#: local size)
MPIRUN_VARIABLES = (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", None),
    ("MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_RANK", None),
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),  # Hydra: with MPI_LOCALNRANKS
)
#: what any MPI launcher (mpirun, or srun's MPI plugins) leaves in its processes
MPI_VARIABLES = (
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_SIZE",
)
#: Slurm's step ids at and above this are not steps started by srun (SLURM_MAX_NORMAL_STEP_ID:
#: above it come the batch script, the extern and the interactive steps, and pending steps)
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0
#: the names a step id may carry instead of a number (scontrol, sacct and some versions' variables)
SLURM_SPECIAL_STEPS = {"batch", "extern", "interactive", "pending"}
#: the port range a Slurm step's rendezvous port is derived in (below Linux's ephemeral ports)
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 15000


class LauncherError(ValueError):
    """A launcher's variables cannot be read (not a number, a rank outside the world); the message
    names the variables and their values."""


@dataclass(frozen=True)
class Launch:
    """What the launcher of this process says. ``None``: it does not say (MPI will)."""

    launcher: str
    #: the variables that decided, ``(name, value)``, for messages
    evidence: tuple[tuple[str, str], ...] = ()
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    #: srun: the step's hosts in node order (the first one hosts the rendezvous)
    nodes: tuple[str, ...] = ()
    #: srun: this task's node within the step (``SLURM_NODEID``)
    node_rank: int | None = None
    #: whether every rank runs on this node (None: the variables do not say)
    single_node: bool | None = None
    #: torchrun and env: where the launcher says the rendezvous is
    master_addr: str | None = None
    master_port: int | None = None
    #: torchrun: its agent hosts the rendezvous store (every worker is a client)
    agent_store: bool = False
    #: a name shared by every rank of this launch and by no other launch running beside it
    job: str = ""
    #: variables of other launchers that were seen and set aside, with why (for the log)
    ignored: tuple[str, ...] = field(default=())

    @property
    def uses_mpi(self) -> bool:
        return self.launcher in (MPIRUN, MPI)

    @property
    def uses_store(self) -> bool:
        """The ranks agree through the rendezvous store (no MPI): srun, torchrun, env."""
        return self.launcher in (SRUN, TORCHRUN, ENV) and (self.world_size or 1) > 1

    def describe(self) -> str:
        """``srun (SLURM_JOB_ID=77, SLURM_STEP_ID=0, ...)``: the line cfm-run logs at start."""
        said = ", ".join(f"{k}={v}" for k, v in self.evidence)
        text = f"{self.launcher} ({said})" if said else self.launcher
        if self.ignored:
            text += "; set aside: " + "; ".join(self.ignored)
        return text


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list in full: ``node[01-03,07],gpu5`` -> ``node01 node02 node03
    node07 gpu5`` (zero padding kept; several bracket groups in one name multiply out).

    Raises :class:`LauncherError` on a malformed list."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        if item:
            hosts.extend(_expand_one(item, text))
    return hosts


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise LauncherError(f"host list {whole!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out = []
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise LauncherError(f"host list {whole!r}: {part!r} is not a number or a range N-M")
        width = len(lo)
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise LauncherError(f"host list {whole!r}: the range {part!r} runs backwards")
        out.extend(f"{head}{n:0{width}d}" for n in range(first, last + 1))
    return [host for name in out for host in _expand_one(name + tail, whole)]


def int_variable(environ, name: str, minimum: int = 0) -> int | None:
    """The integer value of variable ``name`` (None when unset or empty)."""
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise LauncherError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise LauncherError(f"{name}={raw!r} must be >= {minimum}")
    return value


def slurm_step(environ=os.environ) -> str | None:
    """This process's Slurm step id when it is a task started by srun, else None (a batch script,
    an salloc shell, the extern or interactive step, no Slurm)."""
    raw = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    if raw is None or raw.strip().lower() in SLURM_SPECIAL_STEPS:
        return None
    try:
        step = int(raw)
    except ValueError:
        return None
    return str(step) if 0 <= step < SLURM_MAX_NORMAL_STEP_ID else None


def slurm_step_tasks(environ=os.environ) -> int | None:
    """The task count of the srun step this process belongs to (None: not an srun task)."""
    if slurm_step(environ) is None:
        return None
    return int_variable(environ, slurm_names(environ)[1], 1)


def slurm_names(environ=os.environ) -> tuple[str, str]:
    """The names of the variables that give this srun task's step id and its step's task count:
    ``SLURM_STEP_ID`` (else the older ``SLURM_STEPID``) and ``SLURM_STEP_NUM_TASKS`` (else
    ``SLURM_NTASKS``, which srun sets to the step's count too), so that messages name what was
    read."""
    step = "SLURM_STEP_ID" if "SLURM_STEP_ID" in environ else "SLURM_STEPID"
    tasks = (
        "SLURM_STEP_NUM_TASKS"
        if environ.get("SLURM_STEP_NUM_TASKS", "").strip()
        else "SLURM_NTASKS"
    )
    return step, tasks


def _mpirun_variables(environ) -> tuple[str, str, str | None, str | None] | None:
    for size, rank, local, local_size in MPIRUN_VARIABLES:
        if size in environ and (local_size is None or local_size in environ):
            return size, rank, local, local_size
    return None


def detect(environ=os.environ) -> Launch:
    """The launcher of this process and what it says.

    Raises :class:`LauncherError` when the chosen launcher's variables cannot be read.

    The innermost launcher, the one that started this very process, wins:

    1. **torchrun**: ``TORCHELASTIC_RUN_ID`` with ``RANK`` and ``WORLD_SIZE``. torchrun starts
       its workers itself, also where it runs inside a Slurm job (one torchrun per node, started
       by srun), so it wins over the Slurm variables its workers inherit.
    2. **mpirun** (mpiexec): the variables mpirun's own launcher gives each rank: Open MPI's
       ``OMPI_COMM_WORLD_SIZE``, MPICH and Intel MPI (Hydra) ``MPI_LOCALNRANKS``, MVAPICH's
       ``MV2_COMM_WORLD_SIZE``. Inside a Slurm allocation mpirun starts its daemons with srun
       (one task per node), so its ranks also carry that srun step's variables: they describe the
       daemons, and are ignored.
    3. **srun**: a task of a Slurm job step of more than one task (``SLURM_STEP_ID`` or
       ``SLURM_STEPID`` a step number, ``SLURM_STEP_NUM_TASKS`` or else ``SLURM_NTASKS`` > 1,
       rank ``SLURM_PROCID``, node-local rank ``SLURM_LOCALID``; the line cfm-run logs names the
       variables it read). srun's MPI plugins (``--mpi=pmix``, ``pmi2``, Cray's) add PMI/PMIx
       variables: srun still decides.
       A Slurm batch script (the batch step) and an ``salloc`` shell are no task of a step (no
       ``SLURM_STEP_ID``, or one of Slurm's special step ids): ``SLURM_NTASKS`` there is the
       allocation's, and a plain ``cfm-run`` runs one rank.
    4. **MPI** started by another PMI launcher (``PMIX_RANK`` or ``PMI_SIZE`` alone): MPI tells
       the ranks.
    5. ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` alone: torch's ``env://``
       convention (launchers other than torchrun).
    6. none of these: one process.
    """
    ignored: list[str] = []
    step, step_tasks = slurm_step(environ), slurm_step_tasks(environ)
    step_var, tasks_var = slurm_names(environ)
    torchrun = "TORCHELASTIC_RUN_ID" in environ and "RANK" in environ and "WORLD_SIZE" in environ
    mpirun = _mpirun_variables(environ)

    if torchrun:
        if step_tasks and step_tasks > 1:
            ignored.append(
                f"an srun step of {step_tasks} tasks ({step_var}={step}): the torchruns it started"
            )
        if mpirun:
            ignored.append(f"{mpirun[0]}={environ[mpirun[0]]} (the launcher of torchrun)")
        return _torch_env(environ, TORCHRUN, ignored)
    if mpirun:
        size_var, rank_var, local_var, local_size_var = mpirun
        if step_tasks:
            ignored.append(
                f"{step_var}={step} with {step_tasks} task(s): mpirun's daemons, started by srun"
            )
        world = int_variable(environ, size_var, 1)
        rank = int_variable(environ, rank_var)
        _check_rank(rank, world, rank_var, size_var)
        evidence = [(size_var, environ[size_var])] + (
            [(rank_var, environ[rank_var])] if rank_var in environ else []
        )
        return Launch(
            MPIRUN,
            tuple(evidence),
            rank=rank,
            world_size=world,
            local_rank=int_variable(environ, local_var) if local_var else None,
            local_size=int_variable(environ, local_size_var, 1) if local_size_var else None,
            job=environ.get("PMIX_NAMESPACE", ""),
            ignored=tuple(ignored),
        )
    if step_tasks and step_tasks > 1:
        return _srun(environ, step, step_tasks, ignored)
    if any(k in environ for k in MPI_VARIABLES):
        name = next(k for k in MPI_VARIABLES if k in environ)
        if step_tasks == 1:
            ignored.append(f"{step_var}={step} with 1 task")
        return Launch(MPI, ((name, environ[name]),), job=environ.get("PMIX_NAMESPACE", ""))
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return _torch_env(environ, ENV, ignored)
    if step_tasks == 1:
        return Launch(
            NONE,
            ((step_var, step), (tasks_var, "1")),
            rank=0,
            world_size=1,
        )
    if environ.get("SLURM_JOB_ID") and int_variable(environ, "SLURM_NTASKS", 1) not in (None, 1):
        ignored.append(
            f"SLURM_NTASKS={environ['SLURM_NTASKS']} of job {environ['SLURM_JOB_ID']} outside any "
            "srun step (a batch script or an salloc shell): one process; srun starts the ranks"
        )
    return Launch(NONE, rank=0, world_size=1, ignored=tuple(ignored))


def _check_rank(rank, world, rank_var: str, world_var: str) -> None:
    if rank is not None and world is not None and rank >= world:
        raise LauncherError(f"{rank_var}={rank} is not below {world_var}={world}")


def _torch_env(environ, launcher: str, ignored: list[str]) -> Launch:
    world = int_variable(environ, "WORLD_SIZE", 1)
    rank = int_variable(environ, "RANK")
    _check_rank(rank, world, "RANK", "WORLD_SIZE")
    local_rank = int_variable(environ, "LOCAL_RANK")
    local_size = int_variable(environ, "LOCAL_WORLD_SIZE", 1)
    port = int_variable(environ, "MASTER_PORT")
    if world > 1:
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
        if missing:
            raise LauncherError(
                f"RANK={rank} and WORLD_SIZE={world} are set but {' and '.join(missing)} "
                "not: the ranks cannot meet (torch's env:// convention needs all four)"
            )
    if port is not None and port > 65535:
        raise LauncherError(f"MASTER_PORT={port} is not a TCP port")
    evidence = [("RANK", str(rank)), ("WORLD_SIZE", str(world))]
    job = "env"
    if launcher == TORCHRUN:
        run_id = environ["TORCHELASTIC_RUN_ID"]
        restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        evidence.insert(0, ("TORCHELASTIC_RUN_ID", run_id))
        job = f"torchrun.{run_id}.{restart}"
    if local_size is not None:
        evidence.append(("LOCAL_WORLD_SIZE", str(local_size)))
    return Launch(
        launcher,
        tuple(evidence),
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_size=local_size,
        single_node=(local_size == world) if local_size is not None else None,
        master_addr=environ.get("MASTER_ADDR") or None,
        master_port=port,
        agent_store=launcher == TORCHRUN and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        job=job,
        ignored=tuple(ignored),
    )


def _srun(environ, step: str, tasks: int, ignored: list[str]) -> Launch:
    step_var, tasks_var = slurm_names(environ)
    rank = int_variable(environ, "SLURM_PROCID")
    if rank is None:
        raise LauncherError(
            f"{step_var}={step} and {tasks_var}={tasks} are set but SLURM_PROCID is "
            "not: this process cannot tell its rank"
        )
    _check_rank(rank, tasks, "SLURM_PROCID", tasks_var)
    node_var = "SLURM_STEP_NODELIST" if environ.get("SLURM_STEP_NODELIST") else "SLURM_JOB_NODELIST"
    nodes = tuple(expand_hostlist(environ.get(node_var, "")))
    # the step's node count: SLURM_STEP_NUM_NODES, else the hosts of the node list read
    nodes_said = ("SLURM_STEP_NUM_NODES", environ.get("SLURM_STEP_NUM_NODES", ""))
    num_nodes = int_variable(environ, "SLURM_STEP_NUM_NODES", 1)
    if num_nodes is None:
        num_nodes = len(nodes) if nodes else None
        nodes_said = (node_var, environ.get(node_var, ""))
    node_rank = int_variable(environ, "SLURM_NODEID")
    if nodes and node_rank is not None and node_rank >= len(nodes):
        raise LauncherError(
            f"SLURM_NODEID={node_rank} but {node_var}={environ[node_var]!r} names {len(nodes)} "
            "host(s)"
        )
    if num_nodes not in (None, 1) and not nodes:
        raise LauncherError(
            f"the Slurm step spans {num_nodes} nodes but neither SLURM_STEP_NODELIST nor "
            "SLURM_JOB_NODELIST names them: the ranks cannot find the first node"
        )
    for name in MPI_VARIABLES:
        if name in environ:
            ignored.append(f"{name} (srun's MPI plugin)")
            break
    job_id = environ.get("SLURM_JOB_ID", "")
    evidence = [
        ("SLURM_JOB_ID", job_id),
        (step_var, step),
        (tasks_var, str(tasks)),
        ("SLURM_PROCID", str(rank)),
    ]
    if num_nodes is not None:
        evidence.append(nodes_said)
    return Launch(
        SRUN,
        tuple(evidence),
        rank=rank,
        world_size=tasks,
        local_rank=int_variable(environ, "SLURM_LOCALID") or 0,
        nodes=nodes,
        node_rank=node_rank,
        single_node=(num_nodes == 1) if num_nodes is not None else None,
        job=f"slurm.{job_id}.{step}",
        ignored=tuple(ignored),
    )


def slurm_port(environ=os.environ) -> int:
    """The rendezvous port of an srun step: the first of the step's reserved ports
    (``SLURM_STEP_RESV_PORTS``, ``srun --resv-ports``) where Slurm reserved some, else one derived
    from the job and step ids, the same on every task (15000-29999, below Linux's ephemeral
    ports; two steps running beside each other on a node get different ports)."""
    reserved = environ.get("SLURM_STEP_RESV_PORTS", "").strip()
    if reserved:
        first = re.match(r"\d+", reserved)
        if first:
            return int(first.group())
    job = int_variable(environ, "SLURM_JOB_ID") or 0
    step = int(slurm_step(environ) or 0)
    return SLURM_PORT_BASE + (job * 64 + step) % SLURM_PORT_SPAN


def rank_hint(environ=os.environ) -> str:
    """This process's rank as its launcher's variables say it, before the ranks are set up (for
    the prefix of cfm-run's log lines); ``0`` when they do not say."""
    try:
        launch = detect(environ)
    except LauncherError:
        launch = None
    if launch is not None and launch.rank is not None:
        return str(launch.rank)
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if environ.get(name, "").strip().isdigit():
            return environ[name].strip()
    return "0"


def lone_process_error(launch: Launch, world_size: int, environ=os.environ) -> str | None:
    """Why this process must not run as the only rank, or None.

    After the ranks are set up, a process that is alone (``world_size`` 1) but whose environment
    says it is one of several tasks would train by itself while its siblings do the same over
    the same files: every launcher whose variables say so is named. mpirun's ranks ignore the
    srun step of its daemons, and a Slurm batch script is no srun task.
    """
    if world_size > 1:
        return None
    claims = []
    if launch.launcher != TORCHRUN and int_variable(environ, "WORLD_SIZE", 0) not in (None, 0, 1):
        claims.append(f"WORLD_SIZE={environ['WORLD_SIZE']}")
    if launch.launcher != MPIRUN:
        tasks = slurm_step_tasks(environ)
        if tasks and tasks > 1:
            task = environ.get("SLURM_PROCID", "?")
            claims.append(
                f"{slurm_names(environ)[1]}={tasks} (task {task} of srun "
                f"step {environ.get('SLURM_JOB_ID', '?')}.{slurm_step(environ)})"
            )
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 1:
            claims.append(f"{name}={value}")
    if not claims:
        return None
    said = f"{launch.launcher} ({', '.join(f'{k}={v}' for k, v in launch.evidence)})"
    if launch.uses_mpi:
        hint = (
            "mpi4py's MPI is not the MPI of the launcher that started this process: run the "
            "mpirun of mpi4py's MPI (`python -m mpi4py --mpi-library` names it), or start the "
            "ranks with srun or torchrun"
        )
    elif launch.launcher == TORCHRUN:
        hint = (
            "Several torchruns must meet in one rendezvous (`torchrun --nnodes=NODES "
            "--rdzv-backend=c10d --rdzv-endpoint=FIRST_NODE:29500 ...`, one torchrun per node), "
            "or let srun or mpirun start the ranks without torchrun"
        )
    else:
        hint = (
            "Start every rank with one launcher: `srun -n N cfm-run ...`, `torchrun "
            "--nproc_per_node N $(which cfm-run) ...` or `mpirun -np N cfm-run ...`"
        )
    return (
        f"this process would run alone (1 rank, from {said}) but {', '.join(claims)} "
        f"say{'s' if len(claims) == 1 else ''} it is one of several tasks: each would train by "
        f"itself over the same files. {hint}"
    )
