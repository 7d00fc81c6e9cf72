"""The temporary copies of trainer config files: one folder per job, removed by the last rank alive.

cfm-run hands the trainer a copy of its config file without the ``cfm_plugins:`` key. Every rank
needs the copy at the same path the moment it starts, before MPI has joined the ranks, so each
rank writes it (the same bytes; written to a private name, then renamed over, so a rank never
reads a half-written file) into one folder per job: ``$TMPDIR/cfm_plugins_job_<job>/``, where
``<job>`` comes from the launcher (Open MPI/PMIx namespace, Slurm job and step), or this process
id outside a launcher. Inside it, each rank holds a marker ``ranks/<host>.<pid>`` for as long as
it runs.

A rank leaving (at exit, on SIGTERM/SIGHUP) removes its marker, and the folder when no rank of
this host that holds a marker is still alive; a rank that ends the job after a failure (MPI Abort)
removes the folder, since the others are killed. A rank killed outright
(SIGKILL, the OOM killer) cannot clean up after itself: the ranks that survive it do, and when
the whole job was killed, the next cfm-run on the host removes folders whose ranks are all gone.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

PREFIX = "cfm_plugins_job_"
#: launcher variables naming the job, first found wins (all ranks of a job see the same value)
JOB_VARIABLES = (
    ("PMIX_NAMESPACE",),
    ("OMPI_MCA_ess_base_jobid",),
    ("SLURM_JOB_ID", "SLURM_STEP_ID"),
    ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"),  # torchrun: its store's address too
)
#: a folder without any rank marker is left alone this long (a rank may be between mkdir and marker)
UNMARKED_GRACE_S = 600.0

_MINE: list[Path] = []  # the job folders this process holds a marker in


def job_key(environ=os.environ) -> str:
    """A name shared by every rank of this job (and by no other job), safe as a file name."""
    for names in JOB_VARIABLES:
        if all(environ.get(n) for n in names):
            raw = "-".join(environ[n] for n in names)
            break
    else:
        raw = f"pid{os.getpid()}"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)[:64]
    return f"{safe}-{hashlib.blake2b(raw.encode(), digest_size=4).hexdigest()}"


def _marker_name() -> str:
    return f"{socket.gethostname()}.{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _live_ranks(folder: Path) -> tuple[int, bool]:
    """(markers of live processes on this host, whether markers of other hosts exist)."""
    host, live, elsewhere = socket.gethostname(), 0, False
    try:
        markers = list((folder / "ranks").iterdir())
    except OSError:
        return 0, False
    for marker in markers:
        name, _, pid = marker.name.rpartition(".")
        if name != host:
            elsewhere = True
        elif pid.isdigit() and _alive(int(pid)):
            live += 1
    return live, elsewhere


def _remove_if_unused(folder: Path) -> None:
    live, elsewhere = _live_ranks(folder)
    if live == 0 and not elsewhere:
        shutil.rmtree(folder, ignore_errors=True)


def remove_stale(tmp: Path | None = None) -> None:
    """Remove the job folders of this host whose ranks have all ended (killed jobs)."""
    tmp = Path(tmp or tempfile.gettempdir())
    try:
        folders = [p for p in tmp.iterdir() if p.name.startswith(PREFIX) and p.is_dir()]
    except OSError:
        return
    for folder in folders:
        if folder in _MINE or not _owned(folder):
            continue
        try:
            marked = any((folder / "ranks").iterdir())
            age = time.time() - folder.stat().st_mtime
        except OSError:
            marked, age = False, 0.0
        if marked:
            _remove_if_unused(folder)
        elif age > UNMARKED_GRACE_S:
            shutil.rmtree(folder, ignore_errors=True)


def _owned(path: Path) -> bool:
    """A real folder (not a link) of this user: a job folder's name can be guessed, so one made by
    someone else is never used nor removed."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def job_folder() -> Path:
    """This job's folder, with this process's marker in it (made on first use; stale ones swept).

    Private to this user (mode 0700); where the name is taken by another user's folder, a
    private folder of this process only is used instead.
    """
    folder = Path(tempfile.gettempdir()) / f"{PREFIX}{job_key()}"
    if folder not in _MINE:
        remove_stale(folder.parent)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        if not _owned(folder):
            folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}pid{os.getpid()}-"))
        (folder / "ranks").mkdir(exist_ok=True)
        (folder / "ranks" / _marker_name()).touch()
        if not _MINE:
            atexit.register(release)
        _MINE.append(folder)
    return folder


def write_copy(name: str, text: str) -> Path:
    """``text`` as the file ``name`` in this job's folder (every rank writes the same bytes).

    Copies of different content (an MPMD job with several config files of one name) go to
    different sub-folders, named by the content's digest.
    """
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
    target = job_folder() / digest / name
    target.parent.mkdir(parents=True, exist_ok=True)
    private = target.with_name(f".{name}.{_marker_name()}")
    private.write_text(text)
    os.replace(private, target)
    return target


def release(job_ends: bool = False) -> None:
    """This process leaves its job folders: marker removed, folder too when no rank uses it
    (idempotent).

    ``job_ends``: this rank is ending the whole job (MPI Abort after a failure): the folder is
    removed now, since the other ranks are killed, possibly while blocked in a collective where
    they cannot run their own clean-up.
    """
    while _MINE:
        folder = _MINE.pop()
        if job_ends:
            shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            (folder / "ranks" / _marker_name()).unlink()
        except OSError:
            pass
        _remove_if_unused(folder)
