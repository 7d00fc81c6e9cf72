"""The docs check: every command and snippet a user copies from README and docs/ runs as written.

``make docs-check`` (part of ``make test-all``) runs::

    python -m tools.docs_check            # README.md, CONTRIBUTING.md, CHANGELOG.md, docs/*.md
    python -m tools.docs_check docs/mace.md --list   # the blocks and what the check does with each

It checks every relative link and anchor (:func:`check_links`), and that every fenced block a user
copies carries a directive that says what the check does with it (:func:`plan_block`): an HTML
comment right above the fence, invisible on the rendered page, such as ``<!-- docs-check: run -->``
(every directive and its syntax: :data:`KEYS`). Then it runs each file's blocks in page order as a
reader pastes them, in a fresh folder standing for the repository root (:func:`run_doc`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the files checked by default, relative to the repository root
DEFAULT_FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/*.md")
SHELL = {"bash", "sh", "shell", "console", "zsh"}
PYTHON = {"python", "py"}
DATA = {"yaml", "yml", "json", "toml"}
COPYABLE = SHELL | PYTHON | DATA
#: first words of an unlabeled block that a user would paste into a shell
COMMAND_WORDS = (
    "make",
    "mpirun",
    "srun",
    "torchrun",
    "cfm-run",
    "python",
    "python3",
    "pip",
    "cd",
    "export",
    "git",
    "bash",
    "nequip-",
    "mace_",
    "$ ",
)
#: seconds a block may run unless its ``timeout`` directive says otherwise
DEFAULT_TIMEOUT = 300.0
#: The directives: one or more HTML comments right above a code block's fence (``;`` separates
#: several in one comment)::
#:
#:     <!-- docs-check: run -->                     run the block as written
#:     <!-- docs-check: replace -np 4 => -np 2 -->  run it with this text replaced (tiny settings);
#:                                                  the text must occur in the block
#:     <!-- docs-check: skip: needs a GPU -->       not run, for the reason given (required)
#:     <!-- docs-check: file train.yaml -->         write the block to this file (then parse it)
#:     <!-- docs-check: parse -->                   yaml/json/toml: check that it parses
#:     <!-- docs-check: venv .venv-nequip -->       run with another environment of the checkout
#:     <!-- docs-check: expect TEXT -->             the block's output must contain TEXT
#:     <!-- docs-check: timeout 600 -->             seconds (default 300)
#:
#: and for a whole file: ``<!-- docs-check-file: venv .venv-nequip -->`` (the default environment
#: of its blocks) or ``<!-- docs-check-file: skip: REASON -->`` (no block of it runs; its links are
#: still checked).
KEYS = {"run", "replace", "skip", "file", "parse", "venv", "expect", "timeout"}


class DocError(Exception):
    """A directive or block the check cannot act on (the message names file and line)."""


@dataclass
class Block:
    path: Path  # the markdown file
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    directives: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"

    def get(self, key: str) -> list[str]:
        return [v for k, v in self.directives if k == key]


@dataclass
class Doc:
    path: Path
    blocks: list[Block]
    file_directives: list[tuple[str, str]]
    anchors: set[str]
    links: list[tuple[int, str]]  # (line, target)


@dataclass
class Outcome:
    block: Block
    status: str  # PASS, FAIL, SKIP
    detail: str = ""
    seconds: float = 0.0


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------- parsing
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
DIRECTIVE = re.compile(r"<!--\s*docs-check(?P<file>-file)?:(?P<body>.*?)-->", re.S)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(
    r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)"
)
IMAGE = re.compile(r"!\[[^\]]*\]\((?P<target>[^)\s]+)\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(?P<target>\S+)")


def parse_directives(body: str, where: str) -> list[tuple[str, str]]:
    """``run; replace A => B`` -> [("run", ""), ("replace", "A => B")]: directives separated by
    ``;`` or new lines. ``skip`` takes the rest of its line as the reason."""
    out = []
    lines = body.strip().splitlines()
    for line in lines:
        parts = line.split(";")
        for n, part in enumerate(parts):
            part = part.strip()
            if not part:
                continue
            m = re.match(r"([a-z-]+)\s*:?\s*(.*)$", part, re.S)
            key = m.group(1) if m else part
            if key not in KEYS:
                raise DocError(
                    f"{where}: unknown docs-check directive {key!r} (known: {sorted(KEYS)})"
                )
            if key == "skip":
                out.append(("skip", ";".join([m.group(2), *parts[n + 1 :]]).strip()))
                break
            out.append((key, m.group(2).strip()))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed (``-`` and
    ``_`` kept), spaces to ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def parse(path: Path) -> Doc:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    file_directives: list[tuple[str, str]] = []
    anchors: dict[str, int] = {}
    links: list[tuple[int, str]] = []
    pending: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            indent, mark = fence.group("indent"), fence.group("fence")
            lang = (fence.group("info").split() or [""])[0].lower()
            body = []
            j = i + 1
            while j < len(lines) and not re.match(
                rf"^[ \t]*{re.escape(mark[0])}{{{len(mark)},}}\s*$", lines[j]
            ):
                body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
                j += 1
            blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", pending))
            pending = []
            i = j + 1
            continue
        if "<!--" in line and "docs-check" in line:
            j = i
            while "-->" not in lines[j] and j + 1 < len(lines):
                j += 1
            comment = "\n".join(lines[i : j + 1])
            for m in DIRECTIVE.finditer(comment):
                found = parse_directives(m.group("body"), f"{rel(path)}:{i + 1}")
                (file_directives if m.group("file") else pending).extend(found)
            i = j + 1
            continue
        if line.strip() and pending and not line.lstrip().startswith("<!--"):
            raise DocError(
                f"{rel(path)}:{i + 1}: a docs-check directive must stand right above a code block"
            )
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            n = anchors.get(base, 0)
            anchors[base] = n + 1
            anchors.setdefault(f"{base}-{n}" if n else base, 1)
        code_free = re.sub(r"`[^`]*`", "", line)
        for pattern in (LINK, IMAGE, REFDEF):
            for m in pattern.finditer(code_free):
                links.append((i + 1, m.group("target").strip("<>")))
        i += 1
    return Doc(path, blocks, file_directives, set(anchors), links)


# --------------------------------------------------------------------------------------- links
def check_links(docs: dict[Path, Doc]) -> list[str]:
    """Problems of the relative links: a missing file, or an anchor no heading of it has.

    Every relative link (``[text](path)``, ``[text](path#anchor)``, ``[text](#anchor)``) must point
    to an existing file, and an anchor to a heading of that file (GitHub's heading slugs,
    :func:`slug`)."""
    problems = []
    for doc in docs.values():
        for line, target in doc.links:
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.path.parent / file_part).resolve() if file_part else doc.path.resolve()
            where = f"{rel(doc.path)}:{line}"
            if not dest.exists():
                problems.append(f"{where}: link to {target}: no file {rel(dest)}")
                continue
            if anchor and dest.suffix == ".md":
                try:
                    other = docs.get(dest) or parse(dest)
                except DocError as e:  # a linked file not checked in this run
                    problems.append(f"{where}: link to {target}: {e}")
                    continue
                if anchor not in other.anchors:
                    problems.append(
                        f"{where}: link to {target}: {rel(dest)} has no heading #{anchor}"
                    )
    return problems


# ------------------------------------------------------------------------------------ planning
def looks_like_command(text: str) -> bool:
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return first.startswith(COMMAND_WORDS) and not first.startswith("#")


def plan(doc: Doc) -> tuple[list[tuple[Block, str, str]], list[str]]:
    """(block, action, note) for every block (action run, file, parse, skip, or none: not a block
    a user copies), and the problems: a copyable block without a directive, a bad directive."""
    steps, problems = [], []
    for block in doc.blocks:
        try:
            steps.append(plan_block(doc, block))
        except DocError as e:
            problems.append(str(e))
    return steps, problems


def plan_block(doc: Doc, block: Block) -> tuple[Block, str, str]:
    """(block, action, note): what the check does with ``block`` by its directives (:data:`KEYS`).

    Every fenced block a user copies (``bash``/``sh``/``console``, ``python``,
    ``yaml``/``json``/``toml``: :data:`COPYABLE`) needs a directive: a copyable block without one
    is a failure (:class:`DocError`), and so is an unlabeled block that looks like a command
    (:data:`COMMAND_WORDS`: label it, or ``text`` for output)."""
    keys = {k for k, _ in block.directives}
    if block.lang not in COPYABLE:
        if block.directives:
            raise DocError(f"{block.where}: docs-check directive on a `{block.lang}` block")
        if not block.lang and looks_like_command(block.text):
            raise DocError(
                f"{block.where}: an unlabeled block that looks like a command: label it "
                "(```bash, ```python; ```text for output) and give it a docs-check directive"
            )
        return block, "none", ""
    skips = block.get("skip") or [v for k, v in doc.file_directives if k == "skip"]
    if any(not s for s in skips):
        raise DocError(f"{block.where}: `skip` needs a reason (skip: needs a GPU)")
    if skips:
        return block, "skip", skips[0]
    if "file" in keys:
        return block, "file", block.get("file")[0]
    if "parse" in keys:
        if block.lang not in DATA:
            raise DocError(f"{block.where}: `parse` is for yaml/json/toml blocks")
        return block, "parse", ""
    if keys & {"run", "replace", "expect", "venv", "timeout"}:
        if block.lang in DATA:
            raise DocError(f"{block.where}: a {block.lang} block is not run: use file or parse")
        return block, "run", ""
    raise DocError(
        f"{block.where}: a `{block.lang}` block without a docs-check directive: "
        + (
            "write it to a file a later block reads (<!-- docs-check: file NAME -->) or check "
            "that it parses (<!-- docs-check: parse -->)"
            if block.lang in DATA
            else "run it (<!-- docs-check: run -->, or replace OLD => NEW for tiny settings) or "
            "say why not (<!-- docs-check: skip: REASON -->)"
        )
    )


def substituted(block: Block) -> str:
    text = block.text
    for rule in block.get("replace"):
        old, sep, new = rule.partition("=>")
        old, new = old.strip(), new.strip()
        if not sep or not old:
            raise DocError(f"{block.where}: replace needs `OLD => NEW`, got {rule!r}")
        if old not in text:
            raise DocError(f"{block.where}: replace {old!r}: not in the block (the doc changed?)")
        text = text.replace(old, new)
    return text


def parse_data(lang: str, text: str) -> None:
    if lang == "json":
        json.loads(text)
    elif lang == "toml":
        import tomllib

        tomllib.loads(text)
    else:
        import yaml

        yaml.safe_load(text)


# ------------------------------------------------------------------------------------- running
WORKER = r"""
import json, os, sys, traceback
out = os.fdopen(os.dup(1), "w")
ns = {"__name__": "__main__"}
for request in sys.stdin:
    req = json.loads(request)
    log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(log, 1); os.dup2(log, 2)
    ok = True
    try:
        os.chdir(req["cwd"])
        exec(compile(req["code"], req["name"], "exec"), ns)
    except BaseException:
        ok = False
        traceback.print_exc()
    finally:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
        os.close(log); os.close(saved[0]); os.close(saved[1])
    out.write(json.dumps({"ok": ok}) + "\n"); out.flush()
"""


class PythonSession:
    """One Python process per file and environment: blocks run in one namespace, in order."""

    def __init__(self, python: str, env: dict[str, str]):
        self.proc = subprocess.Popen(
            [python, "-u", "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )

    def run(self, code: str, name: str, cwd: Path, log: Path, timeout: float) -> bool:
        request = {"code": code, "name": name, "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                self.close()
                with open(log, "a") as f:
                    f.write(f"\n[docs-check] timed out after {timeout:.0f} s\n")
                return False
        reply = self.proc.stdout.readline()
        if not reply:
            return False
        return json.loads(reply)["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def block_env(venv: Path) -> dict[str, str]:
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CFM_", "OMPI_", "PMIX_", "MASTER_", "VIRTUAL_ENV", "PYTHON"))
        and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
    }
    keep.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{keep.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return keep


MPIRUN_WRAPPER = """mpirun() {
  local extra=()
  [[ " $* " == *" --oversubscribe "* ]] || extra+=(--oversubscribe)
  [[ $(id -u) != 0 || " $* " == *" --allow-run-as-root "* ]] || extra+=(--allow-run-as-root)
  command mpirun "${extra[@]}" "$@"
}
"""


#: variables bash itself sets in the environment it passes on: not a block's doing
BASH_OWN = {"_", "PWD", "OLDPWD", "SHLVL"}
#: before a block: the names set so far (bash's own and the environment's), then the plain shell
#: variables of the blocks before; at its exit: the directory, the environment and every other
#: variable (``declare -p``), whatever the block's status
SHELL_STATE = """__dc_own=" $(compgen -v | tr '\\n' ' ') "
__dc_cwd={cwd} __dc_env={env} __dc_variables={variables}
trap '__dc_rc=$?; set +e; pwd > "$__dc_cwd"; env -0 > "$__dc_env"
for __dc_v in $(compgen -v); do
  [[ $__dc_own == *" $__dc_v "* || $__dc_v == __dc_* ]] || declare -p "$__dc_v"
done > "$__dc_variables" 2>/dev/null; exit $__dc_rc' EXIT
cd {start}
{restore}
set -eo pipefail
"""


class ShellSession:
    """The shell blocks of one file as one terminal session: each block runs in its own ``bash``
    started where the blocks before it left the working directory, their exported variables (set,
    changed or unset) and their plain shell variables."""

    def __init__(self, cwd: Path, state_dir: Path):
        self.cwd = cwd
        self.state_dir = state_dir
        self.exported: dict[str, str | None] = {}  # None: unset by a block
        self.variables: Path | None = None  # the last block's ``declare -p`` lines
        self.blocks = 0

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (a block's environment, :func:`block_env`) with the session's variables; the
        block's environment stays first on ``PATH``."""
        env = dict(base)
        for key, value in self.exported.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        first = base["PATH"].split(os.pathsep)[0]
        if env.get("PATH", "").split(os.pathsep)[0] != first:
            env["PATH"] = f"{first}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = base["VIRTUAL_ENV"]
        return env

    def run(self, script: str, base: dict[str, str], log: Path, timeout: float) -> bool:
        self.blocks += 1
        files = {k: self.state_dir / f"shell{self.blocks}.{k}" for k in ("cwd", "env", "variables")}
        restore = f". {shlex_quote(self.variables)}" if self.variables else ""
        full = (
            SHELL_STATE.format(
                **{k: shlex_quote(v) for k, v in files.items()},
                start=shlex_quote(self.cwd),
                restore=restore,
            )
            + MPIRUN_WRAPPER
            + script
        )
        env = self.env(base)
        with open(log, "a") as f:
            proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-c", full],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                f.write(f"\n[docs-check] timed out after {timeout:.0f} s\n")
                return False
        self.keep_state(env, files)
        return code == 0

    def keep_state(self, env: dict[str, str], files: dict[str, Path]) -> None:
        try:
            self.cwd = Path(files["cwd"].read_text().strip())
            pairs = files["env"].read_text().split("\0")
        except OSError:  # the block ended before its exit trap ran
            return
        after = dict(p.split("=", 1) for p in pairs if "=" in p)
        for key in (set(env) | set(after)) - BASH_OWN:
            if after.get(key) != env.get(key):
                self.exported[key] = after.get(key)
        if files["variables"].exists():
            self.variables = files["variables"]


def shlex_quote(p) -> str:
    import shlex

    return shlex.quote(str(p))


def make_sandbox(tmp: Path) -> Path:
    """A folder standing for the repository root: a copy of examples/ (without outputs) and links to
    the checkout's environments."""
    box = tmp / "repo"
    box.mkdir()
    shutil.copytree(
        ROOT / "examples",
        box / "examples",
        ignore=shutil.ignore_patterns("out", "dataset", "logs", "__pycache__"),
    )
    for venv in ROOT.glob(".venv*"):
        if venv.is_dir():
            (box / venv.name).symlink_to(venv)
    return box


def tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in lines[-n:])


def run_doc(doc: Doc, steps, tmp: Path, echo) -> list[Outcome]:
    """Run one file's blocks in page order in a fresh sandbox: its shell blocks as one session, its
    Python blocks in one interpreter per environment.

    The sandbox (:func:`make_sandbox`) stands for the repository root: a copy of ``examples/`` and
    links to the checkout's environments ``.venv*``. Blocks run as a reader pastes them, with no
    hidden set-up: a block that needs an earlier one says so in the page's text. The shell blocks
    run as one shell session (:class:`ShellSession`: each in ``bash -e -o pipefail``; the working
    directory, exported and plain shell variables carry over to the next block), the Python blocks
    in one interpreter per environment (:class:`PythonSession`: names carry over; it starts with the
    shell session's variables and runs each block in the shell's current directory). The
    environment's ``bin`` comes first on ``PATH`` (as after ``. .venv/bin/activate``),
    ``OMP_NUM_THREADS=1`` (:func:`block_env`), and ``mpirun`` gets ``--oversubscribe`` (and
    ``--allow-run-as-root`` as root; :data:`MPIRUN_WRAPPER`), as the docs tell users on few cores. A
    block whose environment does not exist is skipped, saying so."""
    box = make_sandbox(tmp)
    shell = ShellSession(box, tmp)
    default_venv = next((v for k, v in doc.file_directives if k == "venv"), ".venv")
    sessions: dict[str, PythonSession] = {}
    outcomes = []
    try:
        for n, (block, action, note) in enumerate(steps):
            if action == "none":
                continue
            if action == "skip":
                outcomes.append(Outcome(block, "SKIP", note))
                echo(outcomes[-1])
                continue
            start = time.monotonic()
            log = tmp / f"block{n}.log"
            log.touch()
            try:
                ok, detail = True, ""
                if action in ("file", "parse"):
                    parse_data(block.lang, block.text)
                    if action == "file":
                        dest = shell.cwd / note
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        dest.write_text(block.text)
                        detail = f"wrote {note}"
                else:
                    venv_name = (block.get("venv") or [default_venv])[0]
                    venv = ROOT / venv_name
                    if not (venv / "bin" / "python").exists():
                        outcomes.append(Outcome(block, "SKIP", f"no {venv_name} in the checkout"))
                        echo(outcomes[-1])
                        continue
                    env = block_env(box / venv_name)
                    timeout = float((block.get("timeout") or [DEFAULT_TIMEOUT])[0])
                    code = substituted(block)
                    if block.lang in SHELL:
                        ok = shell.run(code, env, log, timeout)
                    else:
                        if venv_name not in sessions:  # started from the shell session, as a reader
                            python = str(venv / "bin" / "python")
                            sessions[venv_name] = PythonSession(python, shell.env(env))
                        ok = sessions[venv_name].run(code, block.where, shell.cwd, log, timeout)
                    output = log.read_text(errors="replace")
                    for text in block.get("expect"):
                        if ok and text not in output:
                            ok, detail = False, f"the output lacks {text!r}"
                if not ok:
                    detail = (detail or "failed") + "\n" + tail(log)
            except (DocError, ValueError, SyntaxError) as e:  # json/yaml errors are ValueErrors
                ok, detail = False, str(e)
            except Exception as e:  # yaml.YAMLError, tomllib errors
                ok, detail = False, f"{type(e).__name__}: {e}"
            outcomes.append(
                Outcome(block, "PASS" if ok else "FAIL", detail, time.monotonic() - start)
            )
            echo(outcomes[-1])
    finally:
        for session in sessions.values():
            session.close()
    return outcomes


# ----------------------------------------------------------------------------------------- CLI
def collect(patterns) -> list[Path]:
    files = []
    for pattern in patterns:
        path = Path(pattern)
        matches = (
            sorted(ROOT.glob(pattern))
            if not path.is_absolute() and not path.exists()
            else [path.resolve()]
        )
        files += [m.resolve() for m in matches if m.is_file() and m.resolve() not in files]
    return files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.docs_check",
        description="Run the commands and snippets of README and docs/, and check their links.",
    )
    parser.add_argument(
        "files", nargs="*", help=f"markdown files or globs (default: {' '.join(DEFAULT_FILES)})"
    )
    parser.add_argument("--list", action="store_true", help="list the blocks and their actions")
    parser.add_argument("--links-only", action="store_true", help="check the links alone")
    parser.add_argument("--keep", action="store_true", help="keep the sandboxes (printed)")
    args = parser.parse_args(argv)

    start = time.monotonic()
    files = collect(args.files or DEFAULT_FILES)
    if not files:
        parser.error(f"no markdown file matches {args.files}")
    problems: list[str] = []
    docs: dict[Path, Doc] = {}
    for f in files:
        try:
            docs[f] = parse(f)
        except DocError as e:
            problems.append(str(e))
    problems += check_links(docs)
    plans = {}
    for path, doc in docs.items():
        plans[path], found = plan(doc)
        problems += found
    if args.list:
        for steps in plans.values():
            for block, action, note in steps:
                if action != "none":
                    print(f"{block.where:32} {block.lang:8} {action:6} {note}")
    outcomes: list[Outcome] = []
    if not (args.list or args.links_only):

        def echo(o: Outcome) -> None:
            note = f" ({o.seconds:.1f} s)" if o.status != "SKIP" else f": {o.detail}"
            print(f"{o.status} {o.block.where} {o.block.lang}{note}", flush=True)
            if o.status == "FAIL":
                print(o.detail, flush=True)

        for path, steps in plans.items():
            if not any(action in ("run", "file", "parse") for _, action, _ in steps):
                for block, action, note in steps:  # nothing to run: no sandbox
                    if action == "skip":
                        outcomes.append(Outcome(block, "SKIP", note))
                        echo(outcomes[-1])
                continue
            tmp = Path(tempfile.mkdtemp(prefix=f"docs-check-{path.stem}-"))
            try:
                outcomes += run_doc(docs[path], steps, tmp, echo)
            finally:
                if args.keep:
                    print(f"kept {tmp}")
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
    for p in problems:
        print(f"FAIL {p}")
    counts = {s: sum(o.status == s for o in outcomes) for s in ("PASS", "FAIL", "SKIP")}
    failed = counts["FAIL"] + len(problems)
    print(
        f"docs check: {len(files)} files, {counts['PASS']} blocks passed, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped; {len(problems)} other problem(s); "
        f"{time.monotonic() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
