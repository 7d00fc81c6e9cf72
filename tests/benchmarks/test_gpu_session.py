"""benchmarks/gpu_session/*.sh: what a GPU session runs, checked here.

The scripts run only when a GPU machine is lent, in a few long calls of scarce device time: a
misspelt option found there costs a whole call. Here every script must be valid bash, every
benchmark command in it must parse with that benchmark's own options, and the test selection
must select tests.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys

import pytest

from tests.helpers import ROOT, clean_env

SESSION = ROOT / "benchmarks" / "gpu_session"
SCRIPTS = sorted(SESSION.glob("*.sh"))
_BENCH = re.compile(r"python3 benchmarks/(\w+)\.py (.*)$")


def benchmark_commands() -> list[tuple[str, str, list[str]]]:
    """(script, benchmark module, argv) of each ``python3 benchmarks/X.py ...`` line."""
    found = []
    for script in SCRIPTS:
        for line in script.read_text().splitlines():
            m = _BENCH.search(line)
            if m:
                argv = shlex.split(m.group(2).replace("$OUT", "/tmp/out").replace("$(( L / 2 ))", "100"))
                found.append((script.name, m.group(1), argv))
    return found


class _Parsed(Exception):
    """Raised in place of running a benchmark once its command line has parsed."""


def test_the_session_has_its_preparation_library_and_numbered_calls():
    names = [s.name for s in SCRIPTS]
    assert {"prepare.sh", "lib.sh"} <= set(names)
    calls = [n for n in names if n[0].isdigit()]
    assert len(calls) >= 3 and all("benchmarks/gpu_session/lib.sh" in (SESSION / n).read_text() for n in calls)
    assert len(benchmark_commands()) >= 8


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_valid_bash(script):
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("script,module,argv", benchmark_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_benchmark_command_parses_with_the_benchmarks_own_options(monkeypatch, script, module, argv):
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(_Parsed):  # an unknown option or value exits (SystemExit 2) instead
        main(argv)


def test_the_cuda_test_selection_selects_tests():
    text = (SESSION / "3_tests_memory_epochs.sh").read_text()
    m = re.search(r"pytest (.*) -k \"([^\"]+)\" ([\w/ ]+?) -rs", text)
    assert m, "the CUDA test command moved: update this test"
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-k",
                          m.group(2), *m.group(3).split()], capture_output=True, text=True, env=clean_env(),
                         cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    selected = [line for line in res.stdout.splitlines() if "::" in line]
    assert len(selected) >= 9  # the C++ CUDA and Triton kernels, gradgradcheck, CFMCalculator on cuda
    assert any("calculators" in s for s in selected) and any("triton" in s for s in selected)
