"""setup.py: what it checks before building, and how many sources it compiles at a time; the
license the package declares and ships.

setup.py is run as pip runs it (``python setup.py ...`` in a fresh interpreter); ``--name`` makes
``setup()`` print the name and stop, so its helpers can be called afterwards without building.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from tests.helpers import ROOT, clean_env


def run_setup(
    code: str = "", env_extra: dict | None = None, before: str = ""
) -> subprocess.CompletedProcess:
    """Runs ``before``, then setup.py with ``--name``, in a fresh interpreter, then ``code`` with
    its globals as ``g``."""
    prog = (
        textwrap.dedent(before)
        + textwrap.dedent("""
        import runpy, sys
        sys.argv = ["setup.py", "--name"]
        g = runpy.run_path("setup.py")
    """)
        + textwrap.dedent(code)
    )
    env = clean_env()
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


def test_an_old_setuptools_stops_the_build_with_the_command_that_fixes_it():
    res = run_setup(before="import setuptools; setuptools.__version__ = '65.5.0'")
    assert res.returncode == 1
    assert "needs setuptools >= 77, this environment has 65.5.0" in res.stderr
    assert "pip install --upgrade 'setuptools>=77' wheel" in res.stderr


def test_build_jobs_default_to_the_usable_cpus_and_follow_the_environment():
    res = run_setup("import os; print('jobs', g['build_jobs'](), len(os.sched_getaffinity(0)))")
    assert res.returncode == 0, res.stderr[-2000:]
    jobs, cpus = res.stdout.split("jobs ")[1].split()
    assert jobs == cpus
    res = run_setup("print('jobs', g['build_jobs']())", {"CFM_PLUGINS_BUILD_JOBS": "3"})
    assert res.returncode == 0 and "jobs 3" in res.stdout, res.stderr[-2000:]
    for bad in ("0", "x", "-2"):
        res = run_setup("g['build_jobs']()", {"CFM_PLUGINS_BUILD_JOBS": bad})
        assert (
            res.returncode == 1
            and f"CFM_PLUGINS_BUILD_JOBS='{bad}': give a whole number of jobs" in res.stderr
        )


def test_run_parallel_keeps_the_order_and_raises_a_failure():
    res = run_setup("""
        import time
        def slow(x):
            time.sleep(0.05 * (5 - x))  # the first finishes last
            return x * x
        assert g['run_parallel'](slow, [1, 2, 3, 4], 4) == [1, 4, 9, 16]
        assert g['run_parallel'](slow, [1, 2], 1) == [1, 4]
        def fail(x):
            if x == 2:
                raise RuntimeError("compile of 2 failed")
            return x
        try:
            g['run_parallel'](fail, [1, 2, 3], 3)
        except RuntimeError as exc:
            print("raised:", exc)
    """)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "raised: compile of 2 failed" in res.stdout


def test_the_license_pyproject_declares_ships_as_its_text():
    """pyproject's SPDX ``license`` and the LICENSE file setuptools ships with the package agree."""
    # a regex, not tomllib: the package supports Python 3.10
    declared = re.search(r'^license = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared, 'pyproject.toml has no SPDX `license = "..."` line'
    text = (ROOT / "LICENSE").read_text()
    assert declared.group(1) == "MIT"
    assert (
        text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text
    )
    assert "Copyright (c)" in text


def optional_dependencies() -> str:
    """pyproject.toml's ``[project.optional-dependencies]`` table, as text."""
    return (
        (ROOT / "pyproject.toml")
        .read_text()
        .split("[project.optional-dependencies]")[1]
        .split("\n[")[0]
    )


def test_no_extra_pins_triton_exactly_so_a_newer_torch_keeps_its_own():
    """torch's CUDA wheels pin their triton (2.13: 3.7.1, 2.14: 3.8.0). An exact pin in an extra
    made ``pip install -e '.[test]'`` beside torch 2.14.1 replace torch with 2.13 (seen
    2026-11-26); the exact version belongs to the Makefile, beside its pinned torch."""
    extras = optional_dependencies()
    assert re.search(r'"triton>=[\d.]+; sys_platform == \'linux\'"', extras), extras
    assert not re.search(r'"triton\s*==', extras)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TRITON_VERSION \?= \d+\.\d+\.\d+$", makefile, re.M)
    assert (
        makefile.count("install -q torch==$(TORCH_VERSION) $(TRITON_PIN)") == 3
    )  # .venv, -nequip, -hydragnn


def test_the_readme_command_for_another_torch_sets_variables_the_makefile_takes():
    """README's ``make test TORCH_VERSION=... TRITON_VERSION=... HYDRAGNN_DEPS=none``: each name
    is a Makefile variable a command line may set (``?=``), so a rename cannot leave the README
    setting nothing (make takes an unknown variable silently)."""
    command = re.search(r"`(make test (?:\w+=\S+ ?)+)`", (ROOT / "README.md").read_text())
    assert command, "README.md lost its `make test TORCH_VERSION=...` line"
    names = re.findall(r"(\w+)=", command.group(1))
    assert set(names) == {"TORCH_VERSION", "TRITON_VERSION", "HYDRAGNN_DEPS"}, names
    makefile = (ROOT / "Makefile").read_text()
    for name in names:
        assert re.search(rf"^{name} \?= ", makefile, re.M), f"Makefile has no `{name} ?=`"


def test_every_make_target_runs_pytest_with_the_same_workers():
    """``make test`` (and its NequIP and HydraGNN suites) run pytest with ``TEST_JOBS`` workers of
    pytest-xdist, a test file per worker (a module's fixtures are built once): the [test] extra must
    install xdist, and no target may call pytest without the shared arguments."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^TEST_JOBS \?= \d+$", makefile, re.M)
    assert re.search(r"^PYTEST_ARGS := .*-n \$\(TEST_JOBS\) --dist loadfile", makefile, re.M)
    runs = re.findall(r"-m pytest (\S+)", makefile)
    assert len(runs) == 4 and set(runs) == {"$(PYTEST_ARGS)"}, (
        runs
    )  # main, hydragnn, nequip, hydragnn-src
    extras = optional_dependencies()
    assert re.search(r'^test = \[.*"pytest-xdist>=[\d.]+"', extras, re.M), extras


def test_make_test_leaves_out_the_declared_cost_markers_and_test_all_nothing():
    """``make test`` selects with FAST_TESTS (``-m``), ``make test-all`` runs the same target with
    no selection. pytest takes an unknown name in ``-m`` silently (a misspelt marker would leave
    nothing out), so every name there is a marker pyproject.toml declares; every declared marker
    but ``gpu`` is in it (``fast`` keeps, the others leave out); the table in tests/conftest.py
    sets declared markers only."""
    from tests.conftest import COSTS

    makefile = (ROOT / "Makefile").read_text()
    expr = re.search(r'^FAST_TESTS := -m "(.+)"$', makefile, re.M)
    assert expr, 'Makefile has no `FAST_TESTS := -m "..."`'
    names = set(re.findall(r"\w+", expr.group(1))) - {"and", "or", "not"}
    block = (ROOT / "pyproject.toml").read_text().split("\nmarkers = [\n")[1].split("\n]")[0]
    declared = set(re.findall(r'^    "(\w+): ', block, re.M))
    assert names <= declared and declared - names == {"gpu"}, (names, declared)
    assert {marker for *_, markers in COSTS for marker in markers} <= declared
    assert re.search(r"^TEST_SELECT \?= \$\(FAST_TESTS\)$", makefile, re.M)
    assert re.search(
        r"^test: venv\n\t\$\(PY\) -m pytest \$\(PYTEST_ARGS\) \$\(TEST_SELECT\)$", makefile, re.M
    )
    assert re.search(r"^test-all: venv\n\t\$\(MAKE\) test TEST_SELECT=$", makefile, re.M)
