"""``cfm-run``: enable plugins, set up MPI ranks and torch.distributed, run a trainer in-process.

    mpirun -np 2 cfm-run --enable mace,binpack,fused -- mace_run_train --name=x --train_file=...
    cfm-run --enable binpack -- python my_train.py --epochs 3
    cfm-run --list

The trainer command after ``--`` is a console script (e.g. ``mace_run_train``), ``python
script.py ARGS`` or ``python -m module ARGS``; it runs in this process, after the plugins are
enabled and the process group exists. ``--cfm-<key>=<value>`` options in the trainer command
are taken out and become plugin options. A failure on one rank ends all ranks (MPI Abort)
instead of leaving them waiting.
"""
from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback
from importlib.metadata import entry_points

from cfm_plugins import __version__
from cfm_plugins.config import build_config
from cfm_plugins.manager import Session, UnknownPluginError, available_plugins, create_manager, set_active

log = logging.getLogger("cfm_plugins")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cfm-run",
        description="Run a trainer with cfm-plugins enabled (launch it under mpirun for several ranks).",
        epilog="Example: mpirun -np 2 cfm-run --enable mace,binpack,fused -- mace_run_train --config cfg.yaml",
    )
    p.add_argument("--enable", "-e", metavar="NAMES",
                   help="comma-separated plugins to enable (default: $CFM_PLUGINS, else the cfm_plugins: key of --config)")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="a plugin option, e.g. -o max_tokens=3072 (repeatable)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device for the process group (default auto)")
    p.add_argument("--list", action="store_true", help="list the installed plugins and exit")
    p.add_argument("--log-level", default=os.environ.get("CFM_LOG_LEVEL", "INFO"))
    p.add_argument("--version", action="version", version=f"cfm-plugins {__version__}")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the trainer command")
    return p


def print_plugins(out=sys.stdout) -> None:
    plugins = available_plugins()
    if not plugins:
        print("no cfm-plugins plugins are installed", file=out)
        return
    width = max(len(n) for n in plugins)
    for info in plugins.values():
        print(f"{info.name:<{width}}  {info.summary}  [{info.value}; {info.distribution}]", file=out)


def resolve_command(command: list[str]):
    """A callable running the trainer command in-process, and the sys.argv it expects."""
    if not command:
        raise ValueError("no trainer command: give it after `--`, e.g. `cfm-run --enable binpack -- mace_run_train ...`")
    head, rest = command[0], command[1:]
    if os.path.basename(head).startswith("python"):
        if rest[:1] == ["-m"] and len(rest) > 1:
            module = rest[1]
            return (lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)), [module, *rest[2:]]
        if not rest:
            raise ValueError("`python` needs a script: `-- python script.py ARGS`")
        script = rest[0]
        if not os.path.isfile(script):
            raise FileNotFoundError(f"trainer script {script!r} does not exist")
        return (lambda: runpy.run_path(script, run_name="__main__")), [script, *rest[1:]]
    for ep in entry_points(group="console_scripts"):
        if ep.name == head:
            return (lambda: ep.load()()), [head, *rest]
    if head.endswith(".py") and os.path.isfile(head):
        return (lambda: runpy.run_path(head, run_name="__main__")), command
    raise ValueError(
        f"{head!r} is neither an installed console script nor a Python script; "
        "use `-- python script.py ARGS` for scripts"
    )


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rank_tag = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("PMI_RANK") or "0"
    # our own logger only: trainers configure the root logger themselves
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[cfm rank {rank_tag}] %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(args.log_level.upper())
    log.propagate = False
    if args.list:
        print_plugins()
        return 0
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    options = list(args.option) + ([f"device={args.device}"] if args.device else [])
    try:
        config = build_config(args.enable, options, trainer_argv=command)
        pm = create_manager(config)
        run, trainer_argv = resolve_command(command)
    except (UnknownPluginError, ValueError, FileNotFoundError) as exc:
        print(f"cfm-run: error: {exc}", file=sys.stderr)
        return 2

    dist = pm.hook.cfm_init_distributed(config=config)
    session = Session(pm, config, dist)
    set_active(session)
    log.info("plugins enabled: %s (from %s); rank %d of %d", ", ".join(config.enabled) or "none",
             config.source, dist.rank, dist.world_size)
    from cfm_plugins.distributed import abort_all, shutdown

    code = 0
    try:
        pm.hook.cfm_before_trainer(config=config, dist=dist, argv=trainer_argv)
        sys.argv = trainer_argv
        try:
            run()
        except SystemExit as exc:
            code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - one rank's failure must end all ranks
        traceback.print_exc()
        if dist.world_size > 1:
            print(f"cfm-run: rank {dist.rank} failed ({type(exc).__name__}: {exc}); ending all "
                  f"{dist.world_size} ranks", file=sys.stderr, flush=True)
            abort_all(dist, 1)
        code = 130 if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        pm.hook.cfm_after_trainer(config=config, dist=dist, exit_code=code)
        set_active(None)
    if code != 0 and dist.world_size > 1:
        print(f"cfm-run: rank {dist.rank}: trainer exited with {code}; ending all ranks", file=sys.stderr, flush=True)
        abort_all(dist, code)
    shutdown(dist)
    return code


if __name__ == "__main__":
    sys.exit(main())
