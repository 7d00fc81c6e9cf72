"""tools/run_list.py: commands run in order within one time limit; the one running when the time
is up is stopped with its children, its output kept; the ones after it do not start."""

from __future__ import annotations

import os
import re
import sys
import time

from tools.run_list import main


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_list_stops_at_its_limit_with_the_running_commands_children(tmp_path, capsys):
    child = "import time; time.sleep(120)"
    spawner = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('child', p.pid, flush=True); time.sleep(120)"
    )
    listing = tmp_path / "commands.txt"
    listing.write_text(
        "# a comment, then a blank line\n\n"
        "echo first; exit 3\n"
        f'{sys.executable} -c "{spawner}"\n'
        "echo never\n"
    )
    logs = tmp_path / "logs"
    rc = main([str(listing), "--limit", "4", "--out", str(logs), "--grace", "2"])
    assert rc == 1
    first, second = (logs / "01.log").read_text(), (logs / "02.log").read_text()
    assert first.startswith("$ echo first") and "first\n" in first and "# exit 3" in first
    assert "# stopped at the time limit" in second
    pid = int(re.search(r"child (\d+)", second).group(1))  # its output up to the stop is kept
    for _ in range(50):  # the grandchild is stopped too
        if not _alive(pid):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {pid} of the stopped command is still alive")
    assert not (logs / "03.log").exists()
    summary = capsys.readouterr().out
    assert "| 3 | not started: no time left | 0.0 | - | `echo never` |" in summary
    assert "| 1 | exit 3 |" in summary


def test_a_list_that_runs_through_exits_0(tmp_path):
    listing = tmp_path / "commands.txt"
    listing.write_text("echo a\necho b >&2\n")
    assert main([str(listing), "--limit", "60", "--out", str(tmp_path / "logs")]) == 0
    assert "b\n" in (tmp_path / "logs" / "02.log").read_text()  # stderr too
