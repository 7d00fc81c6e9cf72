"""What the suite does with a test that never ends (a pytest plugin, tests/conftest.py loads it).

Two time limits, both set in pyproject.toml: ``timeout`` (pytest-timeout) fails a test that runs too
long with its traceback, where Python can still run; ``faulthandler_timeout`` with
``faulthandler_exit_on_timeout`` writes every thread's traceback and ends the worker process a
minute later, where it cannot: a test stuck in compiled code holding the GIL (a kernel, a
collective) never returns to Python, so pytest-timeout's signal never fires and, without the second
limit, one such test holds up the whole run until CI's own limit ends it, saying nothing.

pytest-xdist then starts a new worker. The first worker ended so in a run is a ``rerun`` (an
``R``): the test runs once more; a second fails and ends the run (:func:`pytest_handlecrashitem`).
"""

from __future__ import annotations

import time

import pytest

# what the controller process knows: faulthandler_timeout, when each test started on its worker,
# and the tests whose worker died, in order, each with whether it ran past that limit
LIMIT = [0.0]
STARTED: dict[str, float] = {}
DIED: list[tuple[str, bool]] = []


def pytest_configure(config):
    LIMIT[0] = float(config.getini("faulthandler_timeout") or 0)


def pytest_runtest_logstart(nodeid, location):
    STARTED[nodeid] = time.monotonic()


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """A worker died running ``crashitem`` (xdist's hook, in the controller).

    pytest-xdist starts a new worker and, under ``--dist loadfile``, gives it the unfinished tests
    of that file again, the stuck one among them. The first worker ended in a run past
    ``faulthandler_timeout`` is reported as a ``rerun`` (an ``R``, and a line at the end naming the
    test: :func:`pytest_terminal_summary`), not a failure: the test runs once more. A second one
    fails, and with ``--max-worker-restart=1`` (the Makefile's PYTEST_ARGS) ends the run, so a test
    stuck every time costs two time limits, not one per worker xdist would start. A worker that
    dies sooner (a crash: a segfault, an abort) fails its test, as xdist does (xdist gives it out
    again with the rest of its file, and a second crash ends the run)."""
    ran = time.monotonic() - STARTED.get(crashitem, time.monotonic())
    stuck = bool(LIMIT[0]) and ran >= 0.9 * LIMIT[0]  # 0.9: the controller hears of a start late
    DIED.append((crashitem, stuck))
    if stuck and len(DIED) == 1:
        report.outcome = "rerun"
        report.longrepr = f"{report.longrepr}: it runs once more on a new worker"


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def pytest_terminal_summary(terminalreporter, config):
    if not DIED:
        return
    terminalreporter.section("tests whose worker died")
    for i, (test, stuck) in enumerate(DIED):
        if not stuck:
            terminalreporter.line(f"{test}: its worker crashed: failed")
            continue
        verdict = "ran once more on a new worker" if i == 0 else "failed"
        where = "its threads' tracebacks are above"
        terminalreporter.line(f"{test}: stuck past faulthandler_timeout, {verdict} ({where})")
    limit = config.getoption("maxworkerrestart", None)
    if limit is not None and len(DIED) > int(limit):  # xdist says so only without -q
        terminalreporter.line(
            f"the run stopped there (--max-worker-restart={limit}): the tests after it did not run"
        )
