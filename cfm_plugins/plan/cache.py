"""The sizes of each data file, kept beside the plan's output so that the next plan reads none.

One ``.npz`` per file in ``<folder>/.cfm-plan-cache/``, named by a digest of its key: the file's
real path, size and modification time, the format, ``r_max`` and :data:`VERSION` (how sizes are
read and counted). A file that changed (another size or mtime) or another ``r_max`` misses the
cache and is read again; entries are written atomically (a reader never sees half a file).

The trainers' start-up (``adapters/mace/sizes.py``) reads the same entries and adds to them what its
data checks found (``checks``: the structures whose labels are not finite, and the elements of
each structure as an index into a short list of element sets), so that a later run checks the
file without reading it. ``cfm-plan`` writes them too for mace's HDF5 files; its entries of
other formats have none (their readers read the geometry only), and the trainer reads their
labels once and writes the entry again with them.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

#: bump when what a reader or the edge counter produces changes
VERSION = 1
FOLDER = ".cfm-plan-cache"


def key(path: str, fmt: str, r_max: float | None) -> dict | None:
    """What identifies the sizes of ``path``; None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {
        "path": os.path.realpath(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "format": fmt,
        "r_max": None if r_max is None else float(r_max),
        "version": VERSION,
    }


def _file(folder: str, k: dict) -> str:
    digest = hashlib.blake2b(json.dumps(k, sort_keys=True).encode(), digest_size=12).hexdigest()
    return os.path.join(folder, FOLDER, f"{os.path.basename(k['path'])}.{digest}.npz")


def load(folder: str, k: dict | None) -> dict | None:
    """The cached sizes for key ``k``, or None."""
    if k is None:
        return None
    path = _file(folder, k)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("key") != k:
                return None
            return {
                "atoms": z["atoms"],
                "edges": z["edges"],
                "isolated": z["isolated"],
                "bad": {int(i): why for i, why in meta["bad"]},
                "counter": meta.get("counter", ""),
                "checks": _checks(meta.get("checks"), z),
            }
    except (OSError, KeyError, ValueError):
        return None


def _checks(found, z) -> dict | None:
    """The trainer's checks of an entry: ``labels`` (index -> what is not finite), ``zsets`` (lists
    of atomic numbers) and ``zset`` (per structure, its index into ``zsets``); None if absent."""
    if not found or "zset" not in z:
        return None
    return {
        "labels": {int(i): why for i, why in found["labels"]},
        "zsets": [list(map(int, s)) for s in found["zsets"]],
        "zset": z["zset"],
    }


def save(folder: str, k: dict | None, sizes, checks: dict | None = None) -> str | None:
    """Keep ``sizes`` (a :class:`~cfm_plugins.plan.sizes.FileSizes`) under key ``k``, with the
    trainer's ``checks`` where given (see :func:`_checks`); the file written, or None where the
    folder cannot be written (the plan goes on without a cache)."""
    if k is None:
        return None
    path = _file(folder, k)
    meta = {"key": k, "bad": [[int(i), why] for i, why in sizes.bad.items()]}
    meta["counter"] = sizes.counter
    arrays = {}
    if checks is not None:
        meta["checks"] = {
            "labels": [[int(i), why] for i, why in sorted(checks["labels"].items())],
            "zsets": [list(map(int, s)) for s in checks["zsets"]],
        }
        arrays["zset"] = np.asarray(checks["zset"], np.int32)
    tmp = f"{path}.tmp{os.getpid()}.npz"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        np.savez(
            tmp,
            atoms=np.asarray(sizes.atoms, np.int64),
            edges=np.asarray(sizes.edges, np.int64),
            isolated=np.asarray(sizes.isolated, bool),
            meta=np.array(json.dumps(meta)),
            **arrays,
        )
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return path
