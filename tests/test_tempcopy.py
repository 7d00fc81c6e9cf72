"""One config copy per job, removed by the last rank alive, or by the next run when the whole job
was killed (issue 24: each rank made its own copy, and a killed rank left it in /tmp)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest

from cfm_plugins import tempcopy

WRITER = """
import os, signal, sys
from cfm_plugins.tempcopy import write_copy
print(write_copy("train.yaml", "name: x\\n"), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()  # a rank still running, until the test closes stdin
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    """This process as a rank of job "ns-test" with its temporary files under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PMIX_NAMESPACE", "ns-test@1")
    yield tmp_path
    tempcopy.release()


def rank(tmp_path, mode: str, namespace: str = "ns-test@1") -> tuple[subprocess.Popen, str]:
    """Another rank (a child process) that writes the copy, then is killed or keeps running."""
    env = dict(os.environ, TMPDIR=str(tmp_path), PMIX_NAMESPACE=namespace)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    return proc, proc.stdout.readline().strip()


def test_every_rank_of_a_job_shares_one_copy_and_the_last_one_removes_it(job):
    other, path = rank(job, "run")
    mine = tempcopy.write_copy("train.yaml", "name: x\n")
    assert str(mine) == path and mine.read_text() == "name: x\n"  # one copy for the job
    assert len(list(job.glob("cfm_plugins_job_*"))) == 1
    tempcopy.release()
    assert mine.is_file()  # the other rank still runs: its copy stays
    other.communicate("")
    assert other.returncode == 0 and not list(job.iterdir())  # it left last and removed the folder


def test_a_killed_rank_leaves_nothing_once_the_others_exit(job):
    killed, path = rank(job, "kill")
    killed.wait()
    assert killed.returncode == -signal.SIGKILL and os.path.isfile(
        path
    )  # SIGKILL: no clean-up of its own
    tempcopy.write_copy("train.yaml", "name: x\n")
    tempcopy.release()  # the surviving rank leaves
    assert not list(job.iterdir())


def test_the_next_run_removes_the_folder_of_a_job_killed_whole(job):
    killed, path = rank(job, "kill", namespace="ns-earlier@1")
    killed.wait()
    assert os.path.isfile(path)
    alive, kept = rank(job, "run", namespace="ns-running@1")  # a job still running on this host
    tempcopy.write_copy("train.yaml", "name: y\n")  # the next run sweeps
    assert not os.path.exists(os.path.dirname(os.path.dirname(path))) and os.path.isfile(kept)
    alive.communicate("")


def test_copies_of_other_content_do_not_collide_and_the_job_key_is_a_file_name(job):
    a = tempcopy.write_copy("c.json", "{}")
    b = tempcopy.write_copy("c.json", '{"x": 1}')  # MPMD: another config file of the same name
    assert a != b and a.name == b.name == "c.json" and a.read_text() == "{}"
    key = tempcopy.job_key({"PMIX_NAMESPACE": "prterun-host-12/34@1"})
    assert "/" not in key and key.startswith("prterun-host-12_34_1-")
    assert tempcopy.job_key({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}).startswith("7-0-")
    assert tempcopy.job_key({}).startswith(f"pid{os.getpid()}-")
