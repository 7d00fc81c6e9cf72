"""A benchmark's result as a record: one small JSON file per workload, never written into docs/.

Every benchmark (``python -m benchmarks.<name> ...``) prints its tables for the person running it
and writes them, with what they were measured on, to ``<out>/<workload>.json``: ``out`` is
``out/benchmarks/`` under the repository root (git-ignored) unless the benchmark's ``--out DIR``
says otherwise (``--out -``: print only, write nothing). A record (:func:`write_record`) holds::

    schema, workload, title, benchmark (its script), command (the command line that ran it),
    description (the workload in words), device, versions, date, commit,
    tables: [{name, caption, columns, rows}], headline {name: figure}, notes [text], picture

Keeping a result: copy the record into ``benchmarks/results/`` (the newest record of a workload
replaces the older one: same file name) and its picture into ``docs/img/``; ``python -m
benchmarks.render`` makes the tables of docs/benchmarks.md and README from the kept records.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: where records and pictures go without ``--out``
DEFAULT_OUT = ROOT / "out" / "benchmarks"
SCHEMA = 1
#: the distributions whose versions a record names, when installed
DISTRIBUTIONS = (
    "cfm-plugins",
    "torch",
    "triton",
    "numpy",
    "mace-torch",
    "e3nn",
    "nequip",
    "HydraGNN",
    "cuequivariance-torch",
)
#: environment variables that change what a benchmark measures: named in its command
_COMMAND_ENV = ("OMP_NUM_THREADS",)
_COMMAND_ENV_PREFIX = "CFM_PLUGINS_"
#: modules that call this one on a benchmark's behalf
_NOT_BENCHMARKS = ("benchmarks.record", "benchmarks.training")
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--out DIR`` option every benchmark takes: where its record goes."""
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help=f"folder of the result record (default {DEFAULT_OUT.relative_to(ROOT)}/; "
        "'-': print only, write no record)",
    )


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def device_text(device=None) -> str:
    """The device in words: the GPU's name for a CUDA device, else the CPU and its cores.

    Args:
        device: a ``torch.device``, a device string (``"cuda"``, ``"cuda:1"``, ``"cpu"``) or
            None (the CPU).
    """
    if _is_cuda(device):
        import torch

        return torch.cuda.get_device_name(device)
    name = _cpu_name()
    cores = f"{os.cpu_count()} cores"
    return (
        f"{platform.machine()} CPU ({name}), {cores}"
        if name
        else f"{platform.machine()} CPU, {cores}"
    )


def _is_cuda(device) -> bool:
    return (getattr(device, "type", None) or str(device or "cpu").split(":")[0]) == "cuda"


def _commit() -> str:
    try:
        res = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else "unknown"


def environment(device=None) -> dict:
    """What a measurement was made on: ``device`` (:func:`device_text`), ``versions`` (Python, the
    platform, and each of :data:`DISTRIBUTIONS` that is installed; CUDA's with a CUDA device),
    ``date`` (today, ISO) and ``commit`` (``git rev-parse --short HEAD`` of the checkout, or
    ``"unknown"``).

    Args:
        device: the device the benchmark ran on (see :func:`device_text`).

    Returns:
        a dict with the keys ``device``, ``versions``, ``date`` and ``commit``.
    """
    versions = {"python": platform.python_version(), "platform": platform.platform(terse=True)}
    for name in DISTRIBUTIONS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    text = device_text(device)
    if _is_cuda(device):
        import torch

        versions["cuda"] = str(torch.version.cuda)
    return {
        "device": text,
        "versions": versions,
        "date": dt.date.today().isoformat(),
        "commit": _commit(),
    }


def _module_of(path: str | None) -> str | None:
    """``benchmarks.x`` for the file ``benchmarks/x.py`` of this checkout, else None."""
    if not path:
        return None
    try:
        rel = Path(path).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts) if rel.suffix == ".py" else None


def _caller_module() -> str | None:
    """The benchmark module that called into this one (the first frame outside it)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__")
        spec = frame.f_globals.get("__spec__")
        module = spec.name if spec is not None else name
        if module and module.startswith("benchmarks.") and module not in _NOT_BENCHMARKS:
            return module
        frame = frame.f_back
    return None


def command_line(argv: Sequence[str] | None = None, module: str | None = None) -> str:
    """The command that runs the benchmark again, from the repository root: the variables that
    change what it measures (``OMP_NUM_THREADS``, ``CFM_PLUGINS_*``), the interpreter (relative to
    the checkout when inside it), ``-m <module>`` and the arguments.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        module: the benchmark's module (default: the benchmark module that called this function,
            else the script of ``sys.argv[0]`` when it is a file of this checkout).

    Returns:
        the command as one shell-quoted line.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    module = module or _caller_module() or _module_of(sys.argv[0])
    try:
        python = str(Path(sys.executable).relative_to(ROOT))
    except ValueError:
        python = "python"
    env = [
        f"{k}={shlex.quote(v)}"
        for k, v in sorted(os.environ.items())
        if k in _COMMAND_ENV or k.startswith(_COMMAND_ENV_PREFIX)
    ]
    run = ["-m", module] if module else [sys.argv[0]]
    return " ".join([*env, shlex.join([python, *run, *args])])


def cell(text):
    """A table cell as a record holds it: an int or float where ``text`` is a plain number, else
    the text (stripped): ``"13.70"`` -> 13.7, ``"1.00x"`` stays."""
    if not isinstance(text, str):
        return text
    text = text.strip()
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


def table(name: str, columns: Sequence[str], rows: Iterable[Sequence], caption: str = "") -> dict:
    """A record's table: ``name`` (short, unique in the record), ``columns``, ``rows`` (each as
    long as ``columns``; cells through :func:`cell`) and a ``caption`` saying what the figures are.

    Raises:
        ValueError: a row whose length differs from the columns'.
    """
    columns = [str(c).strip() for c in columns]
    out = []
    for k, row in enumerate(rows):
        row = [cell(c) for c in row]
        if len(row) != len(columns):
            raise ValueError(
                f"table {name!r}: row {k} has {len(row)} cells, the columns {len(columns)} "
                f"({columns}): {row}"
            )
        out.append(row)
    return {"name": name, "caption": caption, "columns": columns, "rows": out}


def _cells(line: str) -> list[str]:
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        raise ValueError(f"not a markdown table row (it must start and end with '|'): {line!r}")
    return [c.strip() for c in line[1:-1].split("|")]


def markdown_table(name: str, lines: Sequence[str], caption: str = "") -> dict:
    """:func:`table` from the lines of a markdown table: its header, the ``|---|`` line, its rows
    (what a benchmark prints).

    Raises:
        ValueError: lines that are not a markdown table, or a row of another length.
    """
    lines = [ln for ln in lines if ln.strip()]
    if len(lines) < 2 or not set(lines[1].replace("|", "").replace(":", "").strip()) <= {"-"}:
        raise ValueError(
            f"table {name!r}: expected a markdown header and a '|---|' line, got {lines[:2]}"
        )
    return table(name, _cells(lines[0]), [_cells(ln) for ln in lines[2:]], caption)


def out_dir(out: str | os.PathLike | None) -> Path | None:
    """The folder records go to: ``out``, :data:`DEFAULT_OUT` for None, None for ``"-"``."""
    if out is not None and str(out) == "-":
        return None
    return Path(out) if out is not None else DEFAULT_OUT


def picture_path(name: str, out: str | os.PathLike | None = None) -> Path:
    """Where a benchmark writes its picture ``name`` (a PNG): beside its records (a temporary
    folder's when ``out`` is ``"-"``), the folder made."""
    folder = out_dir(out)
    if folder is None:
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="cfm_bench_"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def write_record(
    workload: str,
    title: str,
    tables: Sequence[dict],
    *,
    description: str,
    headline: dict | None = None,
    notes: Iterable[str] = (),
    picture: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    device=None,
    command: str | None = None,
    benchmark: str | None = None,
) -> Path | None:
    """Write the record of one workload to ``<out>/<workload>.json`` and say so on stdout.

    ``device``, ``versions``, ``date`` and ``commit`` come from :func:`environment`, ``command``
    from :func:`command_line`; table cells are strings or numbers (:func:`cell`). A picture the
    benchmark draws is written beside the record (:func:`picture_path`); the record names it as
    ``docs/img/<file>``, where it goes when the record is kept.

    Args:
        workload: the record's name (letters, digits, ``_`` and ``-``): its file name.
        title: one line naming what was measured.
        tables: from :func:`table` or :func:`markdown_table`, at least one.
        description: the workload in words (data, model, sizes, ranks, what a figure is).
        headline: a few named figures (strings or numbers) a summary may quote.
        notes: short remarks for the reader.
        picture: a PNG the benchmark wrote (:func:`picture_path`); named ``docs/img/<file>``.
        out: the folder (``--out``; None: :data:`DEFAULT_OUT`; ``"-"``: nothing is written).
        device: what it ran on (:func:`environment`).
        command: the command line (default :func:`command_line`).
        benchmark: its module (default: the benchmark module that called this function).

    Returns:
        the record's path, or None with ``out="-"``.

    Raises:
        ValueError: a workload name that is not a plain file name, no tables, or a malformed table.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", workload):
        raise ValueError(f"workload {workload!r}: use letters, digits, '_', '.' and '-' only")
    if not tables:
        raise ValueError(f"workload {workload!r}: a record needs at least one table")
    checked = []
    for t in tables:
        missing = {"name", "columns", "rows"} - set(t)
        if missing:
            raise ValueError(f"workload {workload!r}: a table without {sorted(missing)}: {t}")
        checked.append(table(t["name"], t["columns"], t["rows"], t.get("caption", "")))
    module = benchmark or _caller_module() or _module_of(sys.argv[0])
    record = {
        "schema": SCHEMA,
        "workload": workload,
        "title": title,
        "benchmark": module.replace(".", "/") + ".py" if module else "unknown",
        "command": command or command_line(module=module),
        "description": description,
        **environment(device),
        "tables": checked,
    }
    if headline:
        record["headline"] = dict(headline)
    notes = [n for n in notes if n and n.strip()]
    if notes:
        record["notes"] = notes
    if picture is not None:
        record["picture"] = f"docs/img/{Path(picture).name}"
    folder = out_dir(out)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{workload}.json"
    path.write_text(dumps(record))
    print(f"wrote {path}", flush=True)
    return path


def dumps(record: dict) -> str:
    """The record as JSON text: indented, each table's columns and each row on one line."""
    inline: dict[str, str] = {}

    def mark(value) -> str:
        key = f"\x00{len(inline)}\x00"
        inline[key] = json.dumps(value, ensure_ascii=False)
        return key

    shown = dict(record)
    shown["tables"] = [
        dict(t, columns=mark(t["columns"]), rows=[mark(r) for r in t["rows"]])
        for t in record["tables"]
    ]
    text = json.dumps(shown, indent=1, ensure_ascii=False)
    for key, value in inline.items():
        text = text.replace(json.dumps(key), value)
    return text + "\n"


def read_record(path: str | os.PathLike) -> dict:
    """A record written by :func:`write_record`."""
    return json.loads(Path(path).read_text())
