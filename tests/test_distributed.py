"""The ranks cfm-run sets up (issues 12, 24): where the ranks listen (rendezvous, gloo and Open
MPI), a stalled rank named after the collective timeout, one GPU per rank or two ranks sharing one
with gloo, set-up errors said once. Real `mpirun -np 2`. The other launchers (srun, torchrun):
tests/test_launchers.py."""

from __future__ import annotations

import re

import pytest

from tests.helpers import BIN, clean_env, run_mpi

CFM_RUN = str(BIN / "cfm-run")
PROBE = "tests/scripts/rank_probe.py"


@pytest.mark.mpi
def test_single_node_ranks_listen_on_loopback_only():
    """Every listening socket of the rank processes, ours (store, gloo) and Open MPI's: on one node
    all on 127.0.0.1 (Open MPI's TCP transport, which listens on 0.0.0.0 and ::, is not started)."""
    out = run_mpi([CFM_RUN, "--device", "cpu", "--", "python", PROBE, "--listeners"], timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
    port = re.search(r"process group gloo at 127\.0\.0\.1:(\d+)", out.stdout).group(1)
    lines = [l for l in out.stdout.splitlines() if l.startswith("LISTEN")]
    assert len(lines) == 2, out.stdout
    listeners = [a for l in lines for a in l.split()[2:]]
    assert f"127.0.0.1:{port}" in listeners  # the rendezvous store, on rank 0
    assert all(a.startswith("127.0.0.1:") for a in listeners), (
        listeners
    )  # nothing on *, :: or a routable address
    assert out.stdout.count("BTL rank=") == 2 and "BTL rank=0 self,sm" in out.stdout


@pytest.mark.mpi
def test_a_users_own_mpi_transports_are_kept():
    out = run_mpi(
        [CFM_RUN, "--device", "cpu", "--", "python", PROBE, "--listeners"],
        timeout=120,
        env=clean_env(OMPI_MCA_btl="self,sm,tcp"),
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert "BTL rank=0 self,sm,tcp" in out.stdout and "BTL rank=1 self,sm,tcp" in out.stdout


def test_mpi_transports_are_chosen_on_one_node_only():
    from cfm_plugins.distributed import keep_mpi_off_the_network

    one_node = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    env = dict(one_node)
    assert keep_mpi_off_the_network(env) == "self,sm" and env["OMPI_MCA_btl"] == "self,sm"
    env = dict(one_node, OMPI_MCA_orte_hnp_uri="x")  # Open MPI 4 (ORTE) has no "sm" component
    assert keep_mpi_off_the_network(env) == "self,vader"
    for env in (
        {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},  # two nodes
        dict(one_node, OMPI_MCA_btl="^openib"),  # the user's choice
        {"PMI_SIZE": "2"},
        {},
    ):  # another MPI, or none
        before = dict(env)
        assert keep_mpi_off_the_network(env) is None and env == before


@pytest.mark.mpi
def test_a_stalled_rank_is_named_after_the_collective_timeout():
    # rank 1 never reaches the collective: without the timeout the job would hang until
    # run_mpi's own limit raises subprocess.TimeoutExpired
    out = run_mpi(
        [
            CFM_RUN,
            "--device",
            "cpu",
            "-o",
            "collective_timeout=3",
            "--",
            "python",
            PROBE,
            "--stall-rank-1",
        ],
        timeout=120,
    )
    assert out.returncode != 0
    assert (
        "rank 0: a collective timed out after 3s (option collective_timeout): rank(s) 1 never "
        "reached it" in out.stdout
    ), out.stdout[-3000:]


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.skipif(
    _cuda_count() < 2, reason="needs 2 CUDA devices on one node (each rank takes its own)"
)
def test_each_rank_takes_its_own_gpu_with_nccl():
    out = run_mpi([CFM_RUN, "--device", "cuda", "--", "python", PROBE, "--device"], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    devices = dict(re.findall(r"DEVICE rank=(\d) (cuda:\d) backend=nccl LOCAL_RANK=\d", out.stdout))
    assert devices == {"0": "cuda:0", "1": "cuda:1"}, out.stdout[-3000:]


@pytest.mark.skipif(_cuda_count() < 1, reason="needs CUDA (one GPU that two ranks share)")
def test_two_ranks_on_one_gpu_train_with_gloo_as_on_the_cpu(tmp_path_factory):
    """``mpirun -np 2 cfm-run --enable mace,binpack,fused -o backend=gloo -- mace_run_train ...
    --device cuda --default_dtype float64`` with both ranks on one GPU (nccl refuses two ranks on
    one device): the same losses, weights and batches as the CPU run of the same plan and seeds,
    to 1e-8 relative; each rank on cuda:0 with gloo, the sharing said once, the sampler's plan the
    CPU run's. The CPU run is the launcher tests' mpirun run (tests/test_launchers.py)."""
    from tests.helpers.mace_runs import launched_run, run_differences

    cpu_folder, code, cpu = launched_run(tmp_path_factory, "mpirun")
    assert code == 0, cpu[-3000:]
    folder, code, out = launched_run(
        tmp_path_factory,
        "mpirun",
        device="cuda",
        options=("-o", "backend=gloo"),
        env={"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert code == 0, out[-3000:]
    devices = dict(
        re.findall(r"rank (\d)/2 \(local \d/2\): process group gloo at \S+ \(lo\) on (\S+),", out)
    )
    assert devices == {"0": "cuda:0", "1": "cuda:0"}, out[-3000:]
    assert (
        out.count("ranks share GPUs (ranks 0-1 on ") == 1 and "share cuda:0): backend gloo" in out
    )
    plan = "binpack train: 2 steps on each of 2 ranks, capacity 100 (atoms)"
    assert out.count(plan) == cpu.count(plan) >= 1  # the sampler's plan, as on the CPU
    assert run_differences((cpu_folder, cpu), (folder, out), rel=1e-8) == []


@pytest.mark.skipif(_cuda_count() < 1, reason="needs CUDA (one GPU that two ranks share)")
def test_nccl_on_a_shared_gpu_is_refused_at_start():
    out = run_mpi(
        [CFM_RUN, "--device", "cuda", "-o", "backend=nccl", "--", "python", PROBE, "--device"],
        timeout=300,
        env=clean_env(CUDA_VISIBLE_DEVICES="0"),
    )
    assert out.returncode != 0
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, out.stdout[-3000:]
    assert "backend nccl cannot run several ranks on one GPU (ranks 0-1 on " in errors[0]
    assert "use -o backend=gloo" in errors[0] and "DEVICE rank=" not in out.stdout


def test_shutdown_says_when_the_final_barrier_fails_and_still_closes_the_group(
    tmp_path, monkeypatch, caplog
):
    """A peer that ended first (after an error of its own) makes the final barrier raise: the rank
    says so and closes its process group anyway, rather than hang or abort at exit."""
    import torch.distributed as tdist

    from cfm_plugins.distributed import DistInfo, shutdown

    tdist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )

    def gone(*a, **k):
        raise RuntimeError("Connection closed by peer [127.0.0.1]:12345")

    monkeypatch.setattr(tdist, "barrier", gone)
    with caplog.at_level("WARNING", logger="cfm_plugins"):
        shutdown(DistInfo(rank=0, world_size=1, backend="gloo"))
    assert not tdist.is_initialized()
    assert (
        "rank 0: the final barrier failed (RuntimeError: Connection closed by peer" in caplog.text
    )


@pytest.mark.mpi
def test_cuda_asked_for_where_no_rank_sees_one_is_one_clear_error():
    """``--device cuda`` where torch sees no GPU (a CPU-only torch, or CUDA_VISIBLE_DEVICES hiding
    them): every rank stops before the rendezvous and the trainer, and rank 0 alone says why and
    what to change, without a traceback."""
    import socket

    out = run_mpi(
        [CFM_RUN, "--device", "cuda", "--", "python", PROBE, "--device"],
        timeout=120,
        env=clean_env(CUDA_VISIBLE_DEVICES=""),
    )
    assert out.returncode != 0
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, out.stdout[-3000:]
    assert errors[0].startswith(
        "cfm-run: error: device 'cuda' was asked for (from cfm-run --device), but 2 of 2 "
        f"ranks see no CUDA device (ranks 0-1 on {socket.gethostname()}: "
    )
    assert (
        "is a CPU-only build" in errors[0] or "CUDA_VISIBLE_DEVICES='' hides every GPU" in errors[0]
    )
    assert (
        "or ask for device cpu (the trainer's --device cpu, or cfm-run --device cpu)" in errors[0]
    )
    assert "Traceback" not in out.stdout and "DEVICE rank=" not in out.stdout  # the probe never ran


def test_ranks_without_cuda_are_named_by_host_and_cause():
    from cfm_plugins.distributed import no_cuda_message

    text = no_cuda_message(
        [
            (4, "gpu2", "x hides"),
            (0, "login1", "torch 2.13.0+cpu is a CPU-only build"),
            (5, "gpu2", "x hides"),
            (7, "gpu2", "x hides"),
            (1, "login1", "torch 2.13.0+cpu is a CPU-only build"),
        ],
        8,
        "mace_run_train --device",
    )
    assert text.startswith(
        "device 'cuda' was asked for (from mace_run_train --device), but 5 of 8 ranks see no "
        "CUDA device (ranks 0-1 on login1: torch 2.13.0+cpu is a CPU-only build; ranks 4-5, 7 "
        "on gpu2: x hides). "
    )
    one = no_cuda_message([(0, "vm", "why")], 1, None)
    assert one.startswith(
        "device 'cuda' was asked for, but 1 of 1 rank sees no CUDA device (rank 0 on vm: why)"
    )


@pytest.mark.mpi
def test_a_rendezvous_address_not_of_this_host_is_one_clear_error():
    out = run_mpi(
        [
            CFM_RUN,
            "--device",
            "cpu",
            "-o",
            "master_addr=10.254.1.2",
            "--",
            "python",
            PROBE,
            "--device",
        ],
        timeout=120,
    )
    assert out.returncode != 0
    errors = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(errors) == 1, out.stdout[-3000:]
    assert errors[0].startswith(
        "cfm-run: error: cannot open the rendezvous on 10.254.1.2:0 ("
    )  # the OS's reason
    assert errors[0].endswith(
        "): set master_addr to an address of this host, or master_port (MASTER_PORT) to a free port"
    )
    assert "Traceback" not in out.stdout and "DEVICE rank=" not in out.stdout
