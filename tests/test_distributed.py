"""What cfm-run does about ranks (issue 12): the adapter serving the command, where the rendezvous
listens, temporary files, a stalled rank; and one GPU per rank. Real `mpirun -np 2`."""
from __future__ import annotations

import re
import time

import pytest
import yaml

from conftest import BIN, clean_env, run_mpi

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


def _trainer_config(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "cfm_plugins": {"enable": ["mace", "binpack"], "cost": "edges"}}))
    return cfg


@pytest.mark.mpi
@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_conflicts_are_logged_and_temporary_files_removed_on_every_rank(tmp_path, fail):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cfg = _trainer_config(tmp_path)
    args = [CFM_RUN, "--device", "cpu", "--enable", "mace,fused", "-o", "cost=atoms", "--", "python", PROBE,
            "--config", str(cfg)] + (["--fail-on-rank-1"] if fail else [])
    out = run_mpi(args, timeout=120, env=clean_env(TMPDIR=str(tmp)))
    assert (out.returncode != 0) == fail, out.stdout[-3000:]
    assert list(tmp.glob("cfm_plugins_*")) == [], "temporary config copies were left behind"
    assert re.search(r"plugins from cfm-run --enable \(mace, fused\) override the cfm_plugins: key of \S+train.yaml "
                     r"\(enable\) \(mace, binpack\): binpack not enabled", out.stdout), out.stdout[-3000:]
    assert "option cost='atoms' from cfm-run -o overrides 'edges' from the cfm_plugins: key of" in out.stdout


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


def test_features_without_an_adapter_for_the_command_stop_at_start():
    import subprocess

    out = subprocess.run([CFM_RUN, "--enable", "binpack,fused", "--", "python", PROBE], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120, env=clean_env())
    assert out.returncode == 2, out.stdout
    assert "binpack, fused work(s) through a trainer adapter" in out.stdout
    listed = out.stdout.split("installed adapters: ", 1)[1].split(")", 1)[0].split(", ")
    assert "mace" in listed and "hydragnn" in listed, out.stdout


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


@pytest.mark.mpi
def test_the_adapter_serving_the_command_is_enabled_so_ranks_train_one_model(tmp_path):
    """`CFM_PLUGINS=',,,'` enables nothing; the mace adapter still serves mace_run_train, so the two
    ranks train one model together (mace's --distributed) instead of two into one directory."""
    from test_mace_adapter import mace_args, make_tiny_set

    make_tiny_set(tmp_path, n_train=6, n_valid=2)
    out = run_mpi([CFM_RUN, "--", "mace_run_train", *mace_args(tmp_path, "served", epochs=1)], timeout=600,
                  env=clean_env(CFM_PLUGINS=",,,"))
    assert out.returncode == 0, out.stdout[-4000:]
    assert out.stdout.count("turning on mace's --distributed") == 2, out.stdout[-4000:]
    assert out.stdout.count("the mace adapter serves `mace_run_train") == 2  # every rank
    assert "the environment (CFM_PLUGINS) is ',,,': it names no plugin" in out.stdout
    assert (tmp_path / "served.model").is_file()
