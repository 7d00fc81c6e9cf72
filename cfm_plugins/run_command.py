"""``cfm-run``: enable plugins, set up the ranks and torch.distributed, run a trainer in-process.

    mpirun -np 2 cfm-run --enable mace,binpack,fused -- mace_run_train --name=x --train_file=...
    srun -n 2 cfm-run --enable mace,binpack,fused -- mace_run_train ...
    torchrun --nproc_per_node 2 $(which cfm-run) --enable mace,binpack,fused -- mace_run_train ...
    cfm-run --enable binpack -- python my_train.py --epochs 3
    cfm-run --list

The trainer command after ``--`` (a console script, ``python script.py ARGS`` or ``python -m
module ARGS``) runs in this process, after the plugins are enabled (the adapter serving it by
itself) and the process group exists; its ``--cfm-<key>=<value>`` options become plugin options.
The ranks come from the launcher (:mod:`cfm_plugins.launchers`). A failure on one rank ends all
ranks instead of leaving them waiting; a collective that times out names the stalled rank.
Temporary files are removed by the last rank to exit, or by the next cfm-run
(:mod:`cfm_plugins.tempcopy`).
"""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import signal
import sys
import time
import traceback
from importlib.metadata import entry_points

from cfm_plugins import __version__
from cfm_plugins.config import build_config
from cfm_plugins.launchers import rank_hint
from cfm_plugins.manager import MissingAdapterError, UnknownPluginError, catalog, create_manager
from cfm_plugins.options import UsageError
from cfm_plugins.tempcopy import release as remove_temp_dirs

log = logging.getLogger("cfm_plugins")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cfm-run",
        description="Run a trainer with cfm-plugins enabled "
        "(launch it under mpirun, srun or torchrun for several ranks).",
        epilog="Example: mpirun -np 2 cfm-run --enable mace,binpack,fused -- "
        "mace_run_train --config cfg.yaml",
    )
    p.add_argument(
        "--enable",
        "-e",
        metavar="NAMES",
        help="comma-separated plugins to enable "
        "(default: $CFM_PLUGINS, else the cfm_plugins: key of --config)",
    )
    p.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a plugin option, e.g. -o max_tokens=3072 (repeatable)",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        help="device for the process group (default auto)",
    )
    p.add_argument(
        "--list",
        action="store_true",
        help="list the installed plugins with every option they read, and exit",
    )
    p.add_argument(
        "--log-level",
        metavar="LEVEL",
        help=f"cfm-run's own log lines: {', '.join(l.lower() for l in LOG_LEVELS)} (default: "
        "$CFM_LOG_LEVEL, else info)",
    )
    p.add_argument("--version", action="version", version=f"cfm-plugins {__version__}")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer command")
    return p


def print_plugins(out=sys.stdout) -> None:
    """Every installed plugin and every option it declares (name, type, default, help)."""
    cat = catalog()
    if not cat.plugins:
        print("no cfm-plugins plugins are installed", file=out)
    adapters = set(cat.adapters())
    for info in cat.plugins.values():
        kind = " (trainer adapter)" if info.name in adapters else ""
        summary = (
            info.summary.split(": ", 1)[1]
            if info.summary.startswith(info.name + ":")
            else info.summary
        )
        print(f"{info.name}{kind}: {summary}  [{info.value}; {info.distribution}]", file=out)
        if info.name in cat.broken:
            print(f"    cannot be loaded: {cat.broken[info.name]}", file=out)
    print(
        "\noptions (highest precedence first: -o name=V on cfm-run, --cfm-<name>=V in the trainer "
        "command, CFM_<NAME>=V in the environment, the cfm_plugins: key of the trainer's config):",
        file=out,
    )
    for name, decl in cat.options().items():
        opt = decl.option
        choices = f" {{{','.join(opt.choices)}}}" if opt.choices else ""
        print(
            f"  {name} ({opt.type.__name__}{choices}, default {opt.default!r}; {decl.plugin})\n    "
            f"  {opt.help}",
            file=out,
        )


def resolve_command(command: list[str]):
    """A callable running the trainer command in-process, and the sys.argv it expects."""
    if not command:
        raise ValueError(
            "no trainer command: give it after `--`, e.g. `cfm-run --enable binpack -- "
            "mace_run_train ...`"
        )
    head, rest = command[0], command[1:]
    if os.path.basename(head).startswith("python"):
        if rest[:1] == ["-m"] and len(rest) > 1:
            module = rest[1]
            return (lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)), [
                module,
                *rest[2:],
            ]
        if not rest:
            raise ValueError("`python` needs a script: `-- python script.py ARGS`")
        if rest[0].startswith("-c"):
            raise ValueError(
                "`python -c CODE` is not supported: cfm-run runs a trainer script or module "
                "in this process, after the plugins are set up; write the code to a file and run "
                "`-- python FILE.py ARGS`, or run a module with `-- python -m MODULE ARGS`"
            )
        if rest[0].startswith("-"):
            raise ValueError(
                f"`python {rest[0]}`: cfm-run runs `-- python script.py ARGS` or `-- python -m "
                "MODULE ARGS` in this process and takes no other option of python's; set it "
                "through its environment variable instead (e.g. PYTHONUNBUFFERED=1 for -u)"
            )
        script = rest[0]
        if not os.path.isfile(script):
            raise FileNotFoundError(f"trainer script {script!r} does not exist")
        return (lambda: runpy.run_path(script, run_name="__main__")), [script, *rest[1:]]
    # a console script by name, or by path (`$(which mace_run_train)`, `.venv/bin/nequip-train`)
    name = os.path.basename(head)
    if name == head or os.path.isfile(head):
        for ep in entry_points(group="console_scripts"):
            if ep.name == name:
                return (lambda load=ep.load: load()()), [head, *rest]
    if os.path.isfile(head) and (head.endswith(".py") or _python_shebang(head)):
        return (lambda: runpy.run_path(head, run_name="__main__")), command
    raise ValueError(
        f"{head!r} is neither a console script installed in this Python environment ({sys.prefix}) "
        "nor a Python script; use `-- python script.py ARGS` for scripts, and run cfm-run from "
        "the environment that has the trainer installed"
    )


def _python_shebang(path: str) -> bool:
    """Whether ``path`` is a script whose first line runs Python (``#!.../python3``)."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _remove_temp_files_on_signal() -> None:
    """A termination signal (mpirun ending the job, a scheduler's SIGTERM) still removes our
    files."""

    def handler(signum, _frame):
        remove_temp_dirs()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread, or not on this platform
            pass


def _failure_message(exc: BaseException, dist) -> str:
    """What to print when the trainer failed on this rank; names the stalled ranks on a timeout."""
    from cfm_plugins.distributed import is_timeout, stalled_ranks

    if is_timeout(exc):
        stalled = stalled_ranks(dist)
        who = (
            f"rank(s) {', '.join(map(str, stalled))} never reached it (stalled or stuck elsewhere)"
            if stalled
            else "every rank reached it, so the cause is elsewhere (network?)"
            if stalled == []
            else "which rank stalled cannot be told"
        )
        return (
            f"cfm-run: rank {dist.rank}: a collective timed out after {dist.timeout_s:g}s "
            f"(option collective_timeout): {who}; ending all {dist.world_size} ranks"
        )
    return (
        f"cfm-run: rank {dist.rank} failed ({type(exc).__name__}: {exc}); ending all "
        f"{dist.world_size} ranks"
    )


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level, given = (
        (args.log_level, "--log-level")
        if args.log_level is not None
        else (os.environ.get("CFM_LOG_LEVEL") or "info", "CFM_LOG_LEVEL")
    )
    if level.upper() not in LOG_LEVELS:
        parser.error(
            f"{given}={level!r}: expected one of {', '.join(l.lower() for l in LOG_LEVELS)}"
        )
    rank_tag = rank_hint(os.environ)  # from the launcher's variables (mpirun, srun, torchrun)
    # our own logger only: trainers configure the root logger themselves
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[cfm rank {rank_tag}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level.upper())
    log.propagate = False
    if args.list:
        try:
            print_plugins()
            sys.stdout.flush()
        except BrokenPipeError:  # the reader stopped early (`cfm-run --list | head -3`): fine
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    options = list(args.option) + ([f"device={args.device}"] if args.device else [])
    _remove_temp_files_on_signal()
    try:
        return _run(args, command, options, rank_tag)
    finally:
        remove_temp_dirs()


#: seconds a rank other than 0 waits after a usage error that every rank found alike, before it
#: exits: launchers (mpirun, torchrun) end the whole job when one process exits non-zero, so the
#: exit that ends it is rank 0's, after it printed the error (the job ends as soon as rank 0 exits)
ERROR_GRACE_S = 10.0


def _usage_error(exc: BaseException, rank_tag: str) -> int:
    """Print a usage error once (rank 0; every rank found it alike, before any rendezvous) and
    return the exit status, 2."""
    if rank_tag == "0":
        print(f"cfm-run: error: {exc}", file=sys.stderr, flush=True)
    else:
        time.sleep(ERROR_GRACE_S)
    return 2


def _run(args, command, options, rank_tag) -> int:
    try:
        config = build_config(args.enable, options, trainer_argv=command)
        if rank_tag == "0":
            for note in config.notes:
                log.info("%s", note)
        pm = create_manager(config)
        run, trainer_argv = resolve_command(command)
    except (
        UnknownPluginError,
        MissingAdapterError,
        ValueError,
        FileNotFoundError,
        ImportError,
    ) as exc:
        return _usage_error(exc, rank_tag)
    if rank_tag == "0":
        for warning in config.warnings:
            log.warning("%s", warning)

    if args.device:
        config.option_sources["device"] = "cfm-run --device"
    from cfm_plugins.distributed import SetupError

    try:
        dist = pm.hook.cfm_init_distributed(config=config)
    except SetupError as exc:  # where every rank raises it alike, one says it
        if rank_tag == "0" or not exc.alike:
            print(f"cfm-run: error: {exc}", file=sys.stderr)
        return 2
    config.dist = dist
    log.info(
        "plugins enabled: %s (from %s); rank %d of %d",
        ", ".join(config.enabled) or "none",
        config.source,
        dist.rank,
        dist.world_size,
    )
    from cfm_plugins.distributed import ABORT_CLEANUPS, abort_all, shutdown

    ABORT_CLEANUPS.append(remove_temp_dirs)  # a rank ended because another failed (srun, torchrun)

    code = usage = 0
    undos: list = []

    def after_trainer(code: int) -> None:
        for undo in reversed(undos):  # the seams, last installed first
            undo()
        pm.hook.cfm_after_trainer(config=config, dist=dist, exit_code=code)

    try:
        undos = [
            u for u in pm.hook.cfm_before_trainer(config=config, dist=dist, argv=trainer_argv) if u
        ]
        sys.argv = trainer_argv
        try:
            run()
        except SystemExit as exc:
            code = _exit_code(exc)
    except UsageError as exc:  # a setting to change, found once the trainer's arguments are read
        code = usage = 2  # every rank finds it alike: rank 0 says it; no traceback, no abort
        if dist.rank == 0:
            print(f"cfm-run: error: {exc}", file=sys.stderr, flush=True)
        after_trainer(code)
    except BaseException as exc:  # noqa: BLE001 - one rank's failure must end all ranks
        traceback.print_exc()
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
        message = _failure_message(exc, dist) if dist.world_size > 1 else None
        after_trainer(code)
        if message:
            remove_temp_dirs(
                job_ends=True
            )  # Abort ends this process (without atexit) and every other rank
            print(message, file=sys.stderr, flush=True)
            abort_all(dist, 1)
    else:
        after_trainer(code)
    if code != 0 and dist.world_size > 1 and not usage:
        print(
            f"cfm-run: rank {dist.rank}: trainer exited with {code}; ending all ranks",
            file=sys.stderr,
            flush=True,
        )
        remove_temp_dirs(job_ends=True)
        abort_all(dist, code)
    shutdown(dist)
    return code


if __name__ == "__main__":
    sys.exit(main())
