"""The ranks cfm-run sets up (issue 12): where the rendezvous listens, a stalled rank named after the
collective timeout, one GPU per rank. Real `mpirun -np 2`."""
from __future__ import annotations

import re
import time

import pytest

from tests.helpers import BIN, clean_env, run_mpi

CFM_RUN = str(BIN / "cfm-run")
PROBE = "tests/scripts/rank_probe.py"


@pytest.mark.mpi
def test_single_node_rendezvous_listens_on_loopback_only():
    # MPI's own TCP transport is turned off so that every listening socket left is ours (store, gloo)
    out = run_mpi([CFM_RUN, "--device", "cpu", "--", "python", PROBE, "--listeners"], timeout=120,
                  env=clean_env(OMPI_MCA_btl="self,sm"))
    assert out.returncode == 0, out.stdout[-3000:]
    port = re.search(r"process group gloo at 127\.0\.0\.1:(\d+)", out.stdout).group(1)
    lines = [l for l in out.stdout.splitlines() if l.startswith("LISTEN")]
    assert len(lines) == 2, out.stdout
    listeners = [a for l in lines for a in l.split()[2:]]
    assert f"127.0.0.1:{port}" in listeners  # the rendezvous store, on rank 0
    assert all(a.startswith("127.0.0.1:") for a in listeners), listeners  # nothing on *, :: or a routable address


@pytest.mark.mpi
def test_a_stalled_rank_is_named_after_the_collective_timeout():
    start = time.monotonic()
    out = run_mpi([CFM_RUN, "--device", "cpu", "-o", "collective_timeout=3", "--", "python", PROBE,
                   "--stall-rank-1"], timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert "rank 0: a collective timed out after 3s (option collective_timeout): rank(s) 1 never reached it" \
        in out.stdout, out.stdout[-3000:]
    assert elapsed < 60, f"took {elapsed:.0f}s"


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.mpi
@pytest.mark.gpu
@pytest.mark.skipif(_cuda_count() < 2, reason="needs 2 CUDA devices on one node (each rank takes its own)")
def test_each_rank_takes_its_own_gpu_with_nccl():
    out = run_mpi([CFM_RUN, "--device", "cuda", "--", "python", PROBE, "--device"], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    devices = dict(re.findall(r"DEVICE rank=(\d) (cuda:\d) backend=nccl LOCAL_RANK=\d", out.stdout))
    assert devices == {"0": "cuda:0", "1": "cuda:1"}, out.stdout[-3000:]
