"""`cfm-run`: listing plugins, errors, running trainers in-process, real MPI rendezvous."""
import subprocess
import time

import pytest

from conftest import BIN, ROOT, clean_env, run_mpi

CFM_RUN = str(BIN / "cfm-run")


def run(*args, timeout=120):
    return subprocess.run([CFM_RUN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env=clean_env(), cwd=ROOT)


def test_list_shows_installed_plugins():
    out = run("--list")
    assert out.returncode == 0
    for name in ("binpack", "fused", "mace"):
        assert name in out.stdout


def test_unknown_plugin_is_a_clear_error():
    out = run("--enable", "binpak", "--", "python", "tests/scripts/allreduce_ranks.py")
    assert out.returncode == 2
    assert "unknown cfm-plugins plugin(s): binpak" in out.stdout and "binpack" in out.stdout


def test_missing_command_and_missing_script_are_clear_errors():
    assert "no trainer command" in run("--enable", "binpack").stdout
    out = run("--", "python", "no_such_script.py")
    assert out.returncode == 2 and "no_such_script.py" in out.stdout


def test_runs_a_console_script_in_process_with_its_exit_code():
    out = run("--", "cfm-run", "--version")  # a console script run in-process (argparse exits 0)
    assert out.returncode == 0 and "cfm-plugins" in out.stdout


def test_a_console_script_given_by_its_path_runs_too():
    out = run("--", str(BIN / "cfm-run"), "--version")  # `-- $(which mace_run_train) ...`
    assert out.returncode == 0 and "cfm-plugins" in out.stdout, out.stdout
    out = run("--", "/nonexistent/bin/mace_run_train")
    assert out.returncode == 2 and "/nonexistent/bin/mace_run_train" in out.stdout and "environment" in out.stdout


@pytest.mark.mpi
def test_mpirun_rendezvous_without_master_addr():
    out = run_mpi([CFM_RUN, "--device", "cpu", "--", "python", "tests/scripts/allreduce_ranks.py", "--flag"], timeout=120)
    assert out.returncode == 0, out.stdout
    results = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    assert len(results) == 2, out.stdout
    for line in results:
        assert "world=2 sum=3 backend=gloo master=127.0.0.1:" in line and "argv=['--flag']" in line


@pytest.mark.mpi
def test_a_failure_on_one_rank_ends_every_rank_quickly():
    start = time.monotonic()
    out = run_mpi([CFM_RUN, "--device", "cpu", "--", "python", "tests/scripts/allreduce_ranks.py",
                   "--fail-on-rank-1"], timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert "deliberate failure on rank 1" in out.stdout
    assert "ending all 2 ranks" in out.stdout
    assert elapsed < 60, f"took {elapsed:.0f}s: the surviving rank waited"
