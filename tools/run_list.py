"""Run a list of commands (benchmarks, tests) one after the other within one time limit.

    python -m tools.run_list COMMANDS.txt --limit 600 [--out out/tools/run_list]

``COMMANDS.txt`` holds one shell command a line (blank lines and ``#`` comments skipped), run from
the current folder with ``bash -c``. Each command gets the time that is left of ``--limit``
seconds; one still running when it is up is stopped with its children (its process group:
``SIGTERM``, then ``SIGKILL`` after ``--grace`` seconds), and the commands after it are not
started. Each command's output (stdout and stderr) goes to ``<out>/<NN>.log`` as it comes, headed
by the command, so what a stopped command printed is kept. A summary (exit status, seconds, log)
is printed at the end; the exit status is 0 when every command ran and exited 0, else 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "out" / "tools" / "run_list"


def read_commands(path: Path) -> list[str]:
    """The commands of ``path``: its lines, without blank lines and ``#`` comments."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def stop(proc: subprocess.Popen, grace: float) -> None:
    """Stop ``proc`` and every process of its group: SIGTERM, then SIGKILL after ``grace`` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_list(commands: list[str], limit: float, out: Path, grace: float = 10.0) -> list[dict]:
    """Run ``commands`` in order within ``limit`` seconds in all, each one's output to
    ``out/<NN>.log``.

    Returns:
        one dict per command: ``command``, ``log``, ``status`` ("exit N", "stopped at the time
        limit" or "not started: no time left") and ``seconds``.
    """
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + limit
    results = []
    for k, command in enumerate(commands, 1):
        log = out / f"{k:02d}.log"
        left = deadline - time.monotonic()
        if left <= 0:
            results.append(
                dict(command=command, log=None, status="not started: no time left", seconds=0.0)
            )
            continue
        t0 = time.monotonic()
        with open(log, "w") as fh:
            fh.write(f"$ {command}\n")
            fh.flush()
            proc = subprocess.Popen(
                ["bash", "-c", command],
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped with its children
            )
            try:
                status = f"exit {proc.wait(timeout=left)}"
            except subprocess.TimeoutExpired:
                stop(proc, grace)
                status = "stopped at the time limit"
        seconds = time.monotonic() - t0
        with open(log, "a") as fh:
            fh.write(f"\n# {status} after {seconds:.1f} s\n")
        results.append(dict(command=command, log=str(log), status=status, seconds=seconds))
        print(f"[{k}/{len(commands)}] {status} in {seconds:.1f} s: {command}", flush=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("commands", type=Path, help="a file with one shell command a line")
    p.add_argument("--limit", type=float, required=True, help="seconds for the whole list")
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"folder of the logs (default {DEFAULT_OUT.relative_to(ROOT)})",
    )
    p.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    args = p.parse_args(argv)
    if not args.commands.is_file():
        p.error(f"{args.commands}: no such file (one shell command a line)")
    commands = read_commands(args.commands)
    if not commands:
        p.error(f"{args.commands} has no commands (blank lines and '#' comments are skipped)")
    results = run_list(commands, args.limit, args.out, args.grace)
    print("\n| # | status | s | log | command |\n|---|---|---|---|---|")
    for k, r in enumerate(results, 1):
        print(
            f"| {k} | {r['status']} | {r['seconds']:.1f} | {r['log'] or '-'} | `{r['command']}` |"
        )
    return 0 if all(r["status"] == "exit 0" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
