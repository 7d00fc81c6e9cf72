"""The suite's guard against a test that never ends (``tests/helpers/stuck_tests.py``, the limits
in pyproject.toml), on a generated test file run as ``make test`` runs the suite (the Makefile's
PYTEST_ARGS, this repository's pytest settings), the two time limits shortened: a test
stuck in compiled code while holding the GIL, where pytest-timeout's signal never reaches Python,
ends its worker with every thread's traceback; the run goes on, runs it once more, and a second
stuck test fails and ends the run. A test that crashes its worker fails, and is not run again as a
stuck one is. No test gives a subprocess longer than pytest-timeout's limit allows (the
subprocess's own timeout then fails the test with its output)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from tests.helpers import ROOT, SUBPROCESS_LIMIT_S

STUCK = """
import ctypes
import os
import pathlib


def test_before():
    pass


def test_stuck_holding_the_gil():
    marker = pathlib.Path(os.environ["STUCK_MARKER"])
    if os.environ["STUCK_MODE"] == "crash":
        os.abort()  # a crash, not a stuck test
    if os.environ["STUCK_MODE"] == "always" or not marker.exists():
        marker.write_text("stuck")
        mutex = ctypes.create_string_buffer(64)  # a zeroed glibc mutex: unlocked
        libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL, as a kernel or a collective may
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)  # never returns; a signal cannot reach Python (STUCK_LINE)


def test_after():
    pass
"""


STUCK_LINE = 1 + next(i for i, line in enumerate(STUCK.splitlines()) if "(STUCK_LINE)" in line)


def make_pytest_args() -> list[str]:
    """The Makefile's PYTEST_ARGS, with TEST_JOBS at its default (2)."""
    line = re.search(r"^PYTEST_ARGS := (.*)$", (ROOT / "Makefile").read_text(), re.M)
    return shlex.split(line.group(1).replace("$(TEST_JOBS)", "2"))


def run_stuck(tmp_path, mode: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), *make_pytest_args()]
        + ["--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-p", "tests.helpers.stuck_tests"]
        + ["-o", "timeout=1", "-o", "faulthandler_timeout=3", str(tmp_path / "test_stuck.py")],
        capture_output=True,
        text=True,
        timeout=300,  # the point: the run ends
        cwd=ROOT,
        env={**os.environ, "STUCK_MARKER": str(tmp_path / "marker"), "STUCK_MODE": mode},
    )


def test_a_test_stuck_once_ends_its_worker_says_where_and_passes_when_run_again(tmp_path):
    res = run_stuck(tmp_path, "once")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # faulthandler's tracebacks, from the worker's standard error: the test's own line among them
    assert res.stderr.count("Timeout (0:00:03)!") == 1, res.stderr[-3000:]
    assert f'test_stuck.py", line {STUCK_LINE} in test_stuck_holding_the_gil' in res.stderr
    assert re.search(r"\[gw\d+\] node down: Not properly terminated", res.stdout), res.stdout
    assert "3 passed, 1 rerun" in res.stdout, res.stdout[-3000:]
    assert (
        "test_stuck.py::test_stuck_holding_the_gil: stuck past faulthandler_timeout, ran once more"
        " on a new worker" in res.stdout
    )


def test_a_test_stuck_every_time_fails_and_ends_the_run_after_its_second_worker(tmp_path):
    res = run_stuck(tmp_path, "always")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stderr.count("Timeout (0:00:03)!") == 2, res.stderr[-3000:]
    assert "crashed while running 'test_stuck.py::test_stuck_holding_the_gil'" in res.stdout
    # test_after never ran: the run stopped at the second worker ended, and says so
    assert "1 failed, 1 passed, 1 rerun" in res.stdout, res.stdout[-3000:]
    assert "test_stuck.py::test_stuck_holding_the_gil: stuck past faulthandler_timeout, failed" in (
        res.stdout
    )
    assert (
        "the run stopped there (--max-worker-restart=1): the tests after it did not run"
        in res.stdout
    )


def test_a_test_that_crashes_its_worker_fails_and_is_not_taken_for_a_stuck_one(tmp_path):
    res = run_stuck(tmp_path, "crash")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Timeout (" not in res.stderr and "rerun" not in res.stdout, res.stdout[-3000:]
    assert "crashed while running 'test_stuck.py::test_stuck_holding_the_gil'" in res.stdout
    assert "test_stuck.py::test_stuck_holding_the_gil: its worker crashed: failed" in res.stdout
    assert "stuck past" not in res.stdout


def test_no_subprocess_timeout_reaches_pytests_limit():
    """Every literal ``timeout=`` of the test files (subprocess runs, ``communicate``, the
    helpers' defaults) is at most SUBPROCESS_LIMIT_S, which is below pytest-timeout's limit."""
    import ast

    # a regex, not tomllib: the package supports Python 3.10
    limit = re.search(r"^timeout = (\d+)$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert SUBPROCESS_LIMIT_S <= int(limit.group(1)) - 30
    found, over = 0, []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "timeout":
                value = node.value
            elif isinstance(node, ast.arguments):  # a default: def run(..., timeout=300)
                named = node.args[len(node.args) - len(node.defaults) :] + node.kwonlyargs
                defaults = node.defaults + node.kw_defaults
                value = next((d for a, d in zip(named, defaults) if a.arg == "timeout"), None)
            else:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
                found += 1
                if value.value > SUBPROCESS_LIMIT_S:
                    over.append(f"{path.relative_to(ROOT)}:{value.lineno} timeout={value.value}")
    assert found > 50 and not over, over
