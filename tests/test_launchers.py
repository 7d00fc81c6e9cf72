"""Which launcher started a process (mpirun, srun, torchrun) and what cfm-run makes of it.

Unit tests of the variables (host lists, the precedence rule, a Slurm batch script, the lone
process), the store-based collectives that replace mpi4py without MPI, then real launches: ranks
started by torchrun and as srun's tasks (processes with srun's variables: no Slurm here) meet in one
process group, a missing rank is named, a failure ends the other rank, and a tiny 2-rank MACE
training under each launcher equals the mpirun run bit for bit.

Before this module's launchers, ``torchrun --nproc_per_node 2 cfm-run ...`` and two processes with
srun's variables ran two independent trainings ("rank 0 of 1" each) over the same files.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
import re
import socket
import subprocess
import threading

import pytest

from cfm_plugins import launchers
from cfm_plugins.launchers import LauncherError, detect, expand_hostlist, lone_process_error
from cfm_plugins.testing import run_as_srun_tasks, srun_env, torchrun_command
from tests.helpers import BIN, ROOT, clean_env

CFM_RUN = str(BIN / "cfm-run")
PROBE = "tests/scripts/launch_probe.py"
RANK_PROBE = "tests/scripts/rank_probe.py"
ALLREDUCE = "tests/scripts/allreduce_ranks.py"

# what srun gives task 1 of a 2-task step on two nodes (Slurm's names and meanings)
SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "gpu[07-08]",
    "SLURM_JOB_NODELIST": "gpu[07-08,11]",
}
# what a Slurm batch script carries (the batch step: one process, the allocation's task count)
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NTASKS": "8",
    "SLURM_NPROCS": "8",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}
TORCHRUN_WORKER = {
    "TORCHELASTIC_RUN_ID": "job7",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "3",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "gpu07",
    "MASTER_PORT": "29500",
}


# ------------------------------------------------------------------------------ the variables


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("login1", ["login1"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),
        ("gpu[007,010-011].ib", ["gpu007.ib", "gpu010.ib", "gpu011.ib"]),
    ],
)
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n[3-1]", "n[a-b]", "n]1["])
def test_a_malformed_host_list_is_named(text):
    with pytest.raises(LauncherError, match=re.escape(repr(text))):
        expand_hostlist(text)


def test_an_srun_task_gets_its_rank_world_and_first_node():
    launch = detect(SRUN_TASK)
    assert (launch.launcher, launch.rank, launch.world_size, launch.local_rank) == ("srun", 1, 2, 0)
    assert launch.nodes == ("gpu07", "gpu08")  # the step's nodes, not the job's
    assert launch.single_node is False and launch.node_rank == 1
    assert launch.job == "slurm.4242.0" and launch.uses_store
    assert launch.describe().startswith(
        "srun (SLURM_JOB_ID=4242, SLURM_STEP_ID=0, SLURM_STEP_NUM_TASKS=2, SLURM_PROCID=1"
    )
    one_node = dict(
        SRUN_TASK, SLURM_STEP_NUM_NODES="1", SLURM_STEP_NODELIST="gpu07", SLURM_NODEID="0"
    )
    assert detect(one_node).single_node is True


def test_the_srun_line_names_the_variables_it_read():
    """Where srun's task carries Slurm's older names only (``SLURM_STEPID``, ``SLURM_NTASKS``, no
    ``SLURM_STEP_NUM_*``), the line cfm-run logs, its errors and the lone-process message name
    those, never a variable that is not set."""
    older = {
        k: v
        for k, v in SRUN_TASK.items()
        if k not in ("SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES")
    }
    older["SLURM_STEPID"] = older.pop("SLURM_STEP_ID")
    launch = detect(older)
    assert (launch.launcher, launch.rank, launch.world_size, launch.node_rank) == ("srun", 1, 2, 1)
    assert launch.describe() == (
        "srun (SLURM_JOB_ID=4242, SLURM_STEPID=0, SLURM_NTASKS=2, SLURM_PROCID=1, "
        "SLURM_STEP_NODELIST=gpu[07-08])"
    )
    assert "SLURM_STEP_NUM" not in launch.describe() and "SLURM_STEP_ID" not in launch.describe()
    with pytest.raises(LauncherError, match=r"SLURM_PROCID=2 is not below SLURM_NTASKS=2"):
        detect(dict(older, SLURM_PROCID="2"))
    no_rank = {k: v for k, v in older.items() if k != "SLURM_PROCID"}
    with pytest.raises(LauncherError, match=r"SLURM_STEPID=0 and SLURM_NTASKS=2 are set"):
        detect(no_rank)
    alone = dict(older, **dict(TORCHRUN_WORKER, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1"))
    assert "SLURM_NTASKS=2 (task 1 of srun step 4242.0)" in lone_process_error(
        detect(alone), 1, alone
    )
    # the job's node list when the step's is not set either
    job_nodes = {k: v for k, v in older.items() if k != "SLURM_STEP_NODELIST"}
    assert detect(job_nodes).describe().endswith("SLURM_JOB_NODELIST=gpu[07-08,11])")
    # srun's own names, as srun_env sets them, where they are set
    assert detect(SRUN_TASK).describe() == (
        "srun (SLURM_JOB_ID=4242, SLURM_STEP_ID=0, SLURM_STEP_NUM_TASKS=2, SLURM_PROCID=1, "
        "SLURM_STEP_NUM_NODES=2)"
    )
    one_task = dict(older, SLURM_NTASKS="1", SLURM_PROCID="0")
    assert detect(one_task).describe() == "none (SLURM_STEPID=0, SLURM_NTASKS=1)"


def test_a_torchrun_worker_gets_its_rank_world_and_torchruns_store():
    launch = detect(TORCHRUN_WORKER)
    assert (launch.launcher, launch.rank, launch.world_size) == ("torchrun", 3, 8)
    assert (launch.local_rank, launch.local_size, launch.single_node) == (3, 4, False)
    assert (launch.master_addr, launch.master_port, launch.agent_store) == ("gpu07", 29500, True)
    assert launch.job == "torchrun.job7.0"


@pytest.mark.parametrize(
    "environ, launcher, world, aside",
    [
        ({}, "none", 1, None),
        ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}, "mpirun", 4, None),
        # mpirun inside a Slurm allocation: its daemons' srun step (one task per node) is not ours
        (
            dict(
                SRUN_TASK,
                SLURM_STEP_ID="1",
                OMPI_COMM_WORLD_SIZE="8",
                OMPI_COMM_WORLD_RANK="5",
                PMIX_RANK="5",
            ),
            "mpirun",
            8,
            "mpirun's daemons",
        ),
        # srun with an MPI plugin (--mpi=pmix): srun decides
        (dict(SRUN_TASK, PMIX_RANK="1", PMI_SIZE="2"), "srun", 2, "srun's MPI plugin"),
        # one torchrun per node started by srun: torchrun decides
        (dict(SRUN_TASK, **TORCHRUN_WORKER), "torchrun", 8, "the torchruns it started"),
        # MPICH/Intel MPI's Hydra mpiexec
        ({"PMI_SIZE": "3", "PMI_RANK": "0", "MPI_LOCALNRANKS": "3"}, "mpirun", 3, None),
        # another PMI launcher: MPI tells
        ({"PMIX_RANK": "0"}, "mpi", None, None),
        # torch's env:// convention without torchrun
        (
            {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
            "env",
            2,
            None,
        ),
        # an srun step of one task (srun -n 1, an interactive srun --pty bash): one process
        (dict(SRUN_TASK, SLURM_STEP_NUM_TASKS="1", SLURM_PROCID="0"), "none", 1, None),
    ],
)
def test_the_innermost_launcher_wins(environ, launcher, world, aside):
    launch = detect(environ)
    assert launch.launcher == launcher and launch.world_size == world, launch
    if aside:
        assert aside in launch.describe(), launch.describe()


@pytest.mark.parametrize("step", [None, "batch", "4294967291", "4294967290", "extern"])
def test_a_slurm_batch_script_is_one_process_whatever_slurm_ntasks_says(step):
    """The batch step carries the allocation's SLURM_NTASKS but is one process: no srun task
    (Slurm sets no SLURM_STEP_ID there; 4294967291 and 4294967290 are its batch and interactive
    step ids, should a version export them)."""
    environ = dict(BATCH_SCRIPT, **({"SLURM_STEP_ID": step} if step else {}))
    launch = detect(environ)
    assert (launch.launcher, launch.rank, launch.world_size) == ("none", 0, 1)
    assert not launch.uses_store
    assert "SLURM_NTASKS=8 of job 4242 outside any srun step" in launch.describe()
    assert lone_process_error(launch, 1, environ) is None  # runs as one rank


@pytest.mark.parametrize(
    "environ, says",
    [
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "x"}, "SLURM_PROCID"),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "SLURM_PROCID is not"),
        ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "2"}, "not below"),
        (dict(TORCHRUN_WORKER, RANK="8"), "RANK=8 is not below WORLD_SIZE=8"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "MASTER_ADDR not"),
        (dict(SRUN_TASK, SLURM_NODEID="5"), "SLURM_NODEID=5"),
    ],
)
def test_unreadable_launcher_variables_are_named(environ, says):
    with pytest.raises(LauncherError, match=re.escape(says)):
        detect(environ)


def test_a_lone_process_among_several_tasks_is_refused():
    """torchrun of one worker in each of two srun tasks (no rendezvous between the torchruns), or
    an mpi4py whose MPI is not the launcher's: each process alone, while the variables say
    several."""
    lone_torchrun = dict(
        SRUN_TASK, **dict(TORCHRUN_WORKER, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    )
    message = lone_process_error(detect(lone_torchrun), 1, lone_torchrun)
    assert "SLURM_STEP_NUM_TASKS=2 (task 1 of srun step 4242.0)" in message
    assert "each would train by itself over the same files" in message
    assert "--rdzv-endpoint" in message
    singleton = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}
    message = lone_process_error(detect(singleton), 1, singleton)
    assert "OMPI_COMM_WORLD_SIZE=2" in message and "mpi4py --mpi-library" in message
    # mpirun -np 1 across an allocation of two nodes: the daemons' srun step is not the ranks'
    one_rank = dict(SRUN_TASK, OMPI_COMM_WORLD_SIZE="1", OMPI_COMM_WORLD_RANK="0")
    assert lone_process_error(detect(one_rank), 1, one_rank) is None
    assert lone_process_error(detect(SRUN_TASK), 2, SRUN_TASK) is None  # not alone


def test_an_srun_steps_port_is_shared_by_its_tasks_and_differs_between_steps():
    ports = {launchers.slurm_port(dict(SRUN_TASK, SLURM_PROCID=str(r))) for r in range(2)}
    assert len(ports) == 1
    port = ports.pop()
    assert launchers.SLURM_PORT_BASE <= port < 30000
    assert launchers.slurm_port(dict(SRUN_TASK, SLURM_STEP_ID="1")) != port
    assert launchers.slurm_port(dict(SRUN_TASK, SLURM_JOB_ID="4243")) != port
    assert launchers.slurm_port(dict(SRUN_TASK, SLURM_STEP_RESV_PORTS="12000-12003")) == 12000


def test_the_log_prefix_rank_comes_from_any_launcher():
    assert launchers.rank_hint(SRUN_TASK) == "1"
    assert launchers.rank_hint(TORCHRUN_WORKER) == "3"
    assert launchers.rank_hint({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}) == "1"
    assert launchers.rank_hint(BATCH_SCRIPT) == "0" and launchers.rank_hint({}) == "0"


def test_gpus_shared_by_ranks_are_found_by_identity_not_index():
    from cfm_plugins.distributed import shared_gpus

    # one GPU per task (CUDA_VISIBLE_DEVICES set per task): every rank's cuda:0 is another GPU
    own = [(r, "n1", f"GPU-{r}", "cuda:0") for r in range(4)]
    assert shared_gpus(own) == []
    shared = [(0, "n1", "GPU-a", "cuda:0"), (1, "n1", "GPU-a", "cuda:0"), (2, "n2", "GPU-a", "x")]
    assert shared_gpus(shared) == [("n1", "cuda:0", [0, 1])]


# ---------------------------------------------------------------- collectives without MPI


def _store_comms(world: int, timeout_s: float = 30.0):
    import torch.distributed as tdist

    from cfm_plugins.distributed import StoreComm

    timeout = datetime.timedelta(seconds=timeout_s)
    server = tdist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
    stores = [server] + [
        tdist.TCPStore("127.0.0.1", server.port, world, False, timeout) for _ in range(world - 1)
    ]
    return [
        StoreComm(tdist.PrefixStore("t/", s), r, world, timeout_s, hosting=r == 0)
        for r, s in enumerate(stores)
    ]


def _on_every_rank(comms, fn):
    results, errors = [None] * len(comms), []

    def run(r):
        try:
            results[r] = fn(comms[r])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((r, exc))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, errors


def test_store_collectives_behave_as_mpi4pys():
    import numpy as np

    from cfm_plugins.distributed import StoreComm, reduce_op
    from cfm_plugins.sampler.autocost import StepRecord

    comms = _store_comms(3)

    def work(comm):
        r = comm.Get_rank()
        record = StepRecord(epoch=1, atoms=r, edges=2 * r, graphs=1, wall_s=0.5, cpu_s=0.25)
        return (
            comm.allgather((np.arange(r + 1), {"rank": r})),
            comm.allreduce(r + 1),
            comm.allreduce(float(r), op=reduce_op(comm, "MAX")),
            comm.allreduce(r > 0, op=StoreComm.LAND),
            comm.bcast(f"from {r}", root=2),
            comm.allgather(record),
            comm.Barrier(),
        )

    results, errors = _on_every_rank(comms, work)
    assert not errors, errors
    for gathered, total, peak, every, root, records, _ in results:
        assert [list(a) for a, _ in gathered] == [[0], [0, 1], [0, 1, 2]]
        assert [d["rank"] for _, d in gathered] == [0, 1, 2]
        assert (total, peak, every, root) == (6, 2.0, False, "from 2")
        assert [rec.edges for rec in records] == [0, 2, 4]


def test_a_store_collective_names_the_rank_that_never_reached_it():
    comms = _store_comms(3, timeout_s=1.0)
    results, errors = _on_every_rank(comms[:2], lambda c: c.allgather(c.Get_rank()))
    assert len(errors) == 2
    for _, exc in errors:
        assert isinstance(exc, TimeoutError)
        assert "a collective (allgather #0) timed out after 1s: rank(s) 2 never reached it" in str(
            exc
        )


def test_values_from_the_store_cannot_run_code():
    from cfm_plugins.distributed import _loads

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="names builtins.print"):
        _loads(pickle.dumps(Evil()))


# --------------------------------------------------------------------- real launches, one process


def _cfm_run(*args, env, timeout=120, launcher=()):
    """``cfm-run --device cpu ARGS`` (after ``launcher``'s command, e.g. torchrun's), its output."""
    return subprocess.run(
        [*launcher, CFM_RUN, "--device", "cpu", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_a_plain_cfm_run_in_a_batch_script_runs_one_rank():
    out = _cfm_run("--", "python", PROBE, env=clean_env(**BATCH_SCRIPT))
    assert out.returncode == 0, out.stdout[-3000:]
    assert "RANKS rank=0 world=1 local=0 backend=None" in out.stdout
    assert (
        "launcher: none; set aside: SLURM_NTASKS=8 of job 4242 outside any srun step" in out.stdout
    )


def test_a_lone_task_of_several_stops_naming_the_variables():
    """One torchrun worker per srun task, the torchruns not joined: before, each trained alone."""
    environ = dict(
        SRUN_TASK,
        SLURM_STEP_NODELIST=socket.gethostname(),
        SLURM_STEP_NUM_NODES="1",
        SLURM_NODEID="0",
        **dict(TORCHRUN_WORKER, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1"),
    )
    out = _cfm_run("--", "python", PROBE, env=clean_env(**environ))
    assert out.returncode == 2, out.stdout[-3000:]
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1 and "SLURM_STEP_NUM_TASKS=2" in errors[0], out.stdout[-3000:]
    assert "RANKS" not in out.stdout and "Traceback" not in out.stdout


def test_an_mpi4py_that_does_not_see_its_launchers_ranks_stops():
    """PMI_SIZE=2 (a Hydra/PMI launcher) but mpi4py's Open MPI starts alone (a singleton)."""
    out = _cfm_run("--", "python", PROBE, env=clean_env(PMI_SIZE="2", PMI_RANK="0"))
    assert out.returncode == 2, out.stdout[-3000:]
    assert "PMI_SIZE=2 says it is one of several tasks" in out.stdout
    assert "RANKS" not in out.stdout


# ------------------------------------------------------------------- real launches, two ranks


_JOBS = itertools.count(1)


def _job_id() -> int:
    """A Slurm job id no other test running beside this one uses (the port derives from it)."""
    return os.getpid() * 16 + next(_JOBS)


def test_srun_tasks_meet_on_loopback_without_mpi():
    tasks = run_as_srun_tasks(
        [CFM_RUN, "--device", "cpu", "--", "python", RANK_PROBE, "--listeners"], job_id=_job_id()
    )
    out = "".join(text for _, text in tasks)
    assert [code for code, _ in tasks] == [0, 0], out[-3000:]
    assert out.count("launcher: srun (SLURM_JOB_ID=") == 1, out  # logged once, by rank 0
    assert "DONE rank=0 sum=3" in out and "DONE rank=1 sum=3" in out
    port = re.search(r"process group gloo at 127\.0\.0\.1:(\d+) \(lo\)", out).group(1)
    listeners = [a for l in out.splitlines() if l.startswith("LISTEN") for a in l.split()[2:]]
    assert f"127.0.0.1:{port}" in listeners and all(a.startswith("127.0.0.1:") for a in listeners)
    assert "mpi4py" not in out and "BTL rank=0 None" in out  # MPI was never started


def test_srun_tasks_on_two_nodes_meet_at_the_first():
    """A step on two nodes (both named localhost here, one task each): the first node's task
    hosts the rendezvous at the first node's address (not the loopback default of one node), and
    names the interface for gloo."""
    tasks = run_as_srun_tasks(
        [CFM_RUN, "--device", "cpu", "--", "python", ALLREDUCE],
        job_id=_job_id(),
        nodes=["localhost", "localhost"],
        timeout=120,
    )
    out = "".join(text for _, text in tasks)
    assert [code for code, _ in tasks] == [0, 0], out[-3000:]
    assert "SLURM_STEP_NUM_NODES=2" in out
    assert out.count("process group gloo at localhost:") == 2 and "(lo) on cpu" in out, out
    assert out.count("world=2 sum=3 backend=gloo") == 2


def test_torchrun_workers_meet_in_one_process_group():
    out = _cfm_run(
        "--", "python", ALLREDUCE, "--flag", env=clean_env(), launcher=torchrun_command(2)
    )
    assert out.returncode == 0, out.stdout[-3000:]
    results = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    assert len(results) == 2 and all("world=2 sum=3 backend=gloo" in l for l in results), results
    assert out.stdout.count("launcher: torchrun (TORCHELASTIC_RUN_ID=") == 1


def test_a_task_that_never_comes_is_named_by_the_others():
    """srun's variables say 2 tasks but one process starts: it stops after collective_timeout
    saying which rank never came (rank 0), or that the rendezvous host never answered (rank 1)."""
    for present, says in (
        (0, "rank 0: rank(s) 1 of 2 never came to the rendezvous within 2s"),
        (1, "rank 1: no rendezvous at 127.0.0.1:"),
    ):
        ((code, out),) = run_as_srun_tasks(
            [CFM_RUN, "--device", "cpu", "-o", "collective_timeout=2", "--", "python", PROBE],
            job_id=_job_id(),
            step=present,
            ranks=[present],
            timeout=120,
        )
        assert code == 2 and f"cfm-run: error: {says}" in out, out[-3000:]
        assert "RANKS" not in out


def test_a_failure_on_one_srun_task_ends_the_other():
    """Rank 1 fails while rank 0 waits in a barrier: rank 0 ends at once (srun, unlike mpirun,
    lets the other tasks run on), not after the collective timeout."""
    tasks = run_as_srun_tasks(
        [CFM_RUN, "--device", "cpu", "--", "python", ALLREDUCE, "--fail-on-rank-1"],
        job_id=_job_id(),
        timeout=120,
    )
    out = "".join(text for _, text in tasks)
    assert all(code != 0 for code, _ in tasks), out[-3000:]
    assert "deliberate failure on rank 1" in out and "ending all 2 ranks" in out
    assert "timed out" not in out, out[-3000:]


def test_hydragnn_which_uses_mpi_itself_is_refused_under_torchrun(tmp_path):
    """HydraGNN reduces with mpi4py's COMM_WORLD; under torchrun each process's MPI is alone, so
    its reductions would cover one rank: a usage error at start, said once, before any data."""
    script = tmp_path / "train.py"
    script.write_text("import hydragnn\nraise SystemExit('the trainer must not start')\n")
    out = _cfm_run(
        "--enable",
        "hydragnn",
        "--",
        "python",
        str(script),
        env=clean_env(),
        launcher=torchrun_command(2),
    )
    assert out.returncode != 0
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, out.stdout[-3000:]
    assert (
        "HydraGNN uses MPI itself (mpi4py's COMM_WORLD): MPI sees 1 rank(s) where torchrun "
        "started 2: start it with mpirun" in errors[0]
    ), errors
    assert "must not start" not in out.stdout


def test_srun_env_is_what_srun_gives_a_task():
    env = srun_env(1, 4, 99, step=3)
    launch = detect(env)
    assert (launch.launcher, launch.rank, launch.world_size, launch.job) == (
        "srun",
        1,
        4,
        "slurm.99.3",
    )
    assert launch.single_node


# -------------------------------------------------------- the same training under each launcher


@pytest.fixture(scope="module")
def mpirun_run(tmp_path_factory):
    from tests.helpers.mace_runs import launched_run

    folder, code, out = launched_run(tmp_path_factory, "mpirun")
    assert code == 0, out[-3000:]
    return folder, out


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_a_training_under_each_launcher_equals_mpiruns(tmp_path_factory, mpirun_run, launcher):
    """``torchrun --nproc_per_node 2 cfm-run ...`` and two srun tasks train one model on 2 ranks:
    the same losses, weights and batches as ``mpirun -np 2`` (float64, same plan), bit for bit.
    Before, each process trained alone ("rank 0 of 1") and one deleted the other's checkpoint."""
    from tests.helpers.mace_runs import launched_run, run_differences

    folder, code, out = launched_run(tmp_path_factory, launcher)
    assert code == 0, out[-3000:]
    assert "rank 0 of 2" in out and "rank 1 of 2" in out and "rank 0 of 1" not in out
    assert "binpack train: 2 steps on each of 2 ranks, capacity 100 (atoms)" in out
    assert run_differences(mpirun_run, (folder, out)) == []
