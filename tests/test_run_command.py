"""`cfm-run`: listing plugins, errors, running trainers in-process, real MPI rendezvous, option
conflicts logged and temporary config copies removed on every rank (issue 12)."""

import re
import subprocess

import pytest
import yaml

from tests.helpers import BIN, ROOT, clean_env, run_mpi, run_process

CFM_RUN = str(BIN / "cfm-run")
PROBE = "tests/scripts/rank_probe.py"


def run(*args, timeout=120):
    return run_process([CFM_RUN, *args], timeout)


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


def test_an_unknown_log_level_is_a_usage_error_naming_where_it_came_from(monkeypatch, capsys):
    from cfm_plugins.run_command import main

    monkeypatch.setenv("CFM_LOG_LEVEL", "loud")
    for argv, says in (
        (["--", "python", "x.py"], "CFM_LOG_LEVEL='loud'"),
        (["--log-level", "chatty", "--", "python", "x.py"], "--log-level='chatty'"),
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        assert (
            f"cfm-run: error: {says}: expected one of debug, info, warning, error, critical"
            in capsys.readouterr().err
        )
    out = run("--log-level", "WARNING", "--", "python", "no_such_script.py")  # either case
    assert out.returncode == 2 and "no_such_script.py" in out.stdout


def test_runs_a_console_script_in_process_with_its_exit_code():
    out = run("--", "cfm-run", "--version")  # a console script run in-process (argparse exits 0)
    assert out.returncode == 0 and "cfm-plugins" in out.stdout


def test_a_console_script_given_by_its_path_runs_too():
    out = run("--", str(BIN / "cfm-run"), "--version")  # `-- $(which mace_run_train) ...`
    assert out.returncode == 0 and "cfm-plugins" in out.stdout, out.stdout
    out = run("--", "/nonexistent/bin/mace_run_train")
    assert (
        out.returncode == 2
        and "/nonexistent/bin/mace_run_train" in out.stdout
        and "environment" in out.stdout
    )


def test_mpirun_rendezvous_without_master_addr():
    out = run_mpi(
        [CFM_RUN, "--device", "cpu", "--", "python", "tests/scripts/allreduce_ranks.py", "--flag"],
        timeout=120,
    )
    assert out.returncode == 0, out.stdout
    results = [l for l in out.stdout.splitlines() if l.startswith("RESULT")]
    assert len(results) == 2, out.stdout
    for line in results:
        assert "world=2 sum=3 backend=gloo master=127.0.0.1:" in line and "argv=['--flag']" in line


def test_a_failure_on_one_rank_ends_every_rank_quickly():
    """Rank 1 fails while rank 0 waits in a barrier: cfm-run ends both, at once. Checked by what
    the job says, not by how long it took (that depends on the machine's load): a rank 0 left
    waiting would end by the collective timeout (300 s), after this run's limit of 120 s."""
    out = run_mpi(
        [
            CFM_RUN,
            "--device",
            "cpu",
            "--",
            "python",
            "tests/scripts/allreduce_ranks.py",
            "--fail-on-rank-1",
        ],
        timeout=120,
    )
    assert out.returncode != 0
    assert "deliberate failure on rank 1" in out.stdout
    assert "ending all 2 ranks" in out.stdout
    assert "a collective timed out" not in out.stdout, out.stdout[-3000:]  # rank 0 did not wait


def _trainer_config(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {"name": "x", "cfm_plugins": {"enable": ["mace", "binpack", "static"], "cost": "edges"}}
        )
    )
    return cfg


@pytest.mark.parametrize("fail", [False, True], ids=["success", "failure"])
def test_conflicts_are_logged_and_temporary_files_removed_on_every_rank(tmp_path, fail):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cfg = _trainer_config(tmp_path)
    args = [
        CFM_RUN,
        "--device",
        "cpu",
        "--enable",
        "mace,binpack,fused",
        "-o",
        "cost=atoms",
        "--",
        "python",
        PROBE,
        "--config",
        str(cfg),
    ] + (["--fail-on-rank-1"] if fail else [])
    out = run_mpi(args, timeout=120, env=clean_env(TMPDIR=str(tmp)))
    assert (out.returncode != 0) == fail, out.stdout[-3000:]
    assert list(tmp.glob("cfm_plugins_*")) == [], [str(p) for p in tmp.rglob("*")]
    assert re.search(
        r"plugins from cfm-run --enable \(mace, binpack, fused\) override the cfm_plugins: key "
        r"of \S+train.yaml \(enable\) \(mace, binpack, static\): static not enabled",
        out.stdout,
    ), out.stdout[-3000:]
    assert (
        "option cost='atoms' from cfm-run -o overrides 'edges' from the cfm_plugins: key of"
        in out.stdout
    )


def test_a_rank_killed_outright_leaves_no_config_copy(tmp_path):
    """SIGKILL gives rank 1 no chance to clean up: the one copy of the job is removed by rank 0 as
    mpirun ends it (issue 24: every rank had its own copy, and the killed rank's stayed in /tmp)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    args = [
        CFM_RUN,
        "--device",
        "cpu",
        "--enable",
        "mace",
        "--",
        "python",
        PROBE,
        "--config",
        str(_trainer_config(tmp_path)),
        "--kill-rank-1",
    ]
    out = run_mpi(args, timeout=120, env=clean_env(TMPDIR=str(tmp)))
    assert out.returncode != 0
    copies = set(re.findall(r"ARGS rank=\d --config (\S+)", out.stdout))
    assert len(copies) == 1 and "/cfm_plugins_job_" in copies.pop(), out.stdout[
        -3000:
    ]  # one copy, both ranks
    assert list(tmp.glob("cfm_plugins_*")) == [], [str(p) for p in tmp.rglob("*")]


def test_features_without_an_adapter_for_the_command_stop_at_start():
    out = run("--enable", "binpack,fused", "--", "python", PROBE)
    assert out.returncode == 2, out.stdout
    assert "binpack, fused work(s) through a trainer adapter" in out.stdout
    listed = out.stdout.split("installed adapters: ", 1)[1].split(")", 1)[0].split(", ")
    assert "mace" in listed and "hydragnn" in listed, out.stdout


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("collective_timeout", "-5", "must be a number > 0 (default 300)"),
        ("collective_timeout", "0", "must be a number > 0 (default 300)"),
        ("collective_timeout", "nan", "is not a finite number"),
        ("max_tokens", "nan", "is not a finite number"),
        ("max_tokens", "inf", "is not a finite number"),
        ("max_tokens", "0", "must be a number > 0"),
    ],
)
def test_bad_numbers_are_refused_at_start_on_one_rank(option, value, says):
    """Checked with the other options before anything runs (issue 24: `collective_timeout=0` became
    300, `-5` reached the TCPStore, `max_tokens=nan` failed after the data was loaded)."""
    out = run("-o", f"{option}={value}", "--", "python", "tests/scripts/allreduce_ranks.py")
    assert out.returncode == 2, out.stdout[-3000:]
    error = next((l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")), "")
    assert (
        f"cfm-plugins option {option}='{value}'" in error
        and says in error
        and "from cfm-run -o" in error
    ), error
    assert "Traceback" not in out.stdout


def test_a_negative_collective_timeout_ends_every_rank_at_start():
    out = run_mpi(
        [
            CFM_RUN,
            "--device",
            "cpu",
            "-o",
            "collective_timeout=-5",
            "--",
            "python",
            "tests/scripts/allreduce_ranks.py",
        ],
        timeout=120,
    )
    assert out.returncode != 0
    # every rank refuses it before MPI joins them; rank 0 says it, once (it was said once per rank)
    assert out.stdout.count("cfm-run: error: cfm-plugins option collective_timeout='-5'") == 1, (
        out.stdout[-3000:]
    )
    assert "TCPStore" not in out.stdout and "RESULT" not in out.stdout  # before any rendezvous


# --- messages at start --------------------------------------------------------------------------


def test_an_option_of_a_plugin_not_enabled_stops_at_start_naming_the_plugin():
    out = run(
        "--enable",
        "mace,binpack,fused",
        "-o",
        "static_shapes=true",
        "-o",
        "compile=default",
        "--",
        "mace_run_train",
        "--name=x",
    )
    assert out.returncode == 2, out.stdout[-3000:]
    error = [l for l in out.stdout.splitlines() if l.startswith("cfm-run: error:")]
    assert len(error) == 1 and "--enable mace,binpack,fused,static" in error[0], out.stdout
    assert "Traceback" not in out.stdout


def test_a_misspelled_cfm_plugins_key_is_warned_at_start(tmp_path):
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"name": "x", "cfm_plugin": {"enable": ["mace"]}}))
    script = tmp_path / "train.py"
    script.write_text("import sys\nassert sys.argv[1:3] == ['--config', sys.argv[2]]\n")
    out = run("--", "python", str(script), "--config", str(cfg))
    assert out.returncode == 0, out.stdout[-3000:]
    assert re.search(
        r"\[cfm rank 0\] WARNING \S+train.yaml has no cfm_plugins: key but has 'cfm_plugin': "
        r"did you mean 'cfm_plugins'\?",
        out.stdout,
    ), out.stdout[-3000:]


def test_python_dash_c_is_refused_saying_what_to_do():
    """It said "trainer script '-c' does not exist"."""
    out = run("--enable", "mace", "--", "python", "-c", "print(1)")
    assert out.returncode == 2, out.stdout[-3000:]
    assert "`python -c CODE` is not supported" in out.stdout
    assert "`-- python FILE.py ARGS`" in out.stdout and "does not exist" not in out.stdout


def test_the_list_into_a_pipe_closed_early_ends_quietly():
    """`cfm-run --list | head -3` ended with a BrokenPipeError traceback and exit 1. Here the reader
    is gone before cfm-run writes (the read end closed), so every write meets the broken pipe."""
    import os

    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(
            [CFM_RUN, "--list"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=clean_env(),
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert out.returncode == 0 and out.stderr == "", out.stderr
