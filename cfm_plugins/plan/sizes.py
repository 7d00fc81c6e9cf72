"""The sizes of a data set: atoms and edges of every structure, checked, counted once and cached.

:func:`read_sizes` reads every input (:mod:`.readers`), checks every structure (no atoms, a
non-finite position, periodic along a direction whose cell vector is zero or degenerate: each
recorded with its file and index), counts the edges at ``r_max`` (:mod:`.neighbours`) and caches
the result per file beside the output (:mod:`.cache`), so the next plan of the same files reads
no structure. What a check finds is kept in :class:`FileSizes` (``bad``); whether the plan may go on
without those structures is the caller's decision (``--skip-bad``).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from . import cache as cache_mod
from .neighbours import CountError, backend, count_edges
from .readers import Block, DataError, count_hint, files_of, read_blocks


@dataclass
class FileSizes:
    """The sizes of one file's structures, in the trainer's order.

    ``edges`` is ``-1`` where not counted (no ``r_max``) or not held by the file, and for a bad
    structure; ``bad`` maps a structure's index to what is wrong with it; ``isolated`` marks the
    one-atom E0 references of ASE-read files (``config_type=IsolatedAtom``).
    """

    path: str
    fmt: str
    atoms: np.ndarray
    edges: np.ndarray
    isolated: np.ndarray
    bad: dict = field(default_factory=dict)
    from_cache: bool = False
    seconds: float = 0.0
    counter: str = ""

    def __len__(self) -> int:
        return len(self.atoms)


def check_block(block: Block) -> dict[int, str]:
    """What is wrong with the structures of ``block`` (by index within the file)."""
    bad: dict[int, str] = {}
    atoms = block.atoms
    for i in np.flatnonzero(atoms <= 0):
        bad[int(i)] = "has no atoms"
    if block.positions is None:
        return {block.start + k: v for k, v in sorted(bad.items())}
    off = np.concatenate([[0], np.cumsum(atoms)])
    finite = np.isfinite(block.positions).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)
        owner = np.searchsorted(off, rows, side="right") - 1
        for s in np.unique(owner):
            first = int(rows[owner == s][0] - off[s])
            bad.setdefault(int(s), f"has a non-finite position (atom {first})")
    pbc = block.pbc
    periodic = np.flatnonzero(pbc.any(axis=1))
    if len(periodic):
        cell = block.cells[periodic] * pbc[periodic][:, :, None]
        norms = np.linalg.norm(cell, axis=2)
        gram = cell @ cell.transpose(0, 2, 1) + np.eye(3) * (~pbc[periodic])[:, :, None]
        scale = np.prod(np.where(pbc[periodic], norms**2, 1.0), axis=1)
        with np.errstate(invalid="ignore"):
            degenerate = ~(np.linalg.det(gram) > 1e-18 * scale)
        for k, s in enumerate(periodic):
            if not degenerate[k]:
                continue
            dirs = np.flatnonzero(pbc[s])
            zero = [int(d) for d in dirs if not norms[k, d] > 0]
            if zero:
                why = (
                    f"is periodic along lattice vector(s) {zero} (pbc={pbc[s].tolist()}) but its "
                    "cell is zero there: no cell given"
                )
            else:
                why = (
                    f"is periodic (pbc={pbc[s].tolist()}) but its cell vectors are degenerate "
                    f"(parallel or not finite): {block.cells[s].tolist()}"
                )
            bad.setdefault(int(s), why)
    return {block.start + k: v for k, v in sorted(bad.items())}


def _count_block(block: Block, r_max: float | None, counter: str) -> tuple[np.ndarray, dict]:
    """Edges of a block's structures (``-1``: not counted) and the bad ones found."""
    bad = check_block(block)
    m = len(block.atoms)
    if block.edges is not None:
        return np.asarray(block.edges, dtype=np.int64), bad
    edges = np.full(m, -1, dtype=np.int64)
    if r_max is None or block.positions is None:
        return edges, bad
    ok = np.ones(m, dtype=bool)
    ok[[i - block.start for i in bad]] = False
    while ok.any():
        keep = np.flatnonzero(ok)
        counts = block.atoms[keep]
        off = np.concatenate([[0], np.cumsum(block.atoms)])
        rows = np.concatenate([np.arange(off[s], off[s + 1]) for s in keep])
        try:
            edges[keep] = count_edges(
                block.positions[rows],
                np.concatenate([[0], np.cumsum(counts)]),
                block.cells[keep],
                block.pbc[keep],
                r_max,
                counter,
            )
            break
        except CountError as err:
            s = int(keep[err.index])
            bad[block.start + s] = str(err)
            ok[s] = False
    return edges, dict(sorted(bad.items()))


class Progress:
    """A progress bar on stderr over every input: structures, rate and time left (tqdm when it is
    installed, else a plain line redrawn at most twice a second); silent when ``enabled`` is
    False."""

    def __init__(self, total: int | None, enabled: bool = True, unit: str = "structures"):
        self.enabled, self.total, self.done = enabled, total, 0
        self._bar, self._t0, self._last = None, time.monotonic(), 0.0
        self.unit = unit
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, unit=f" {unit}", unit_scale=True, file=sys.stderr, smoothing=0.1
            )
        except ImportError:
            self._bar = None

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last < 0.5 and (self.total is None or self.done < self.total):
            return
        self._last = now
        rate = self.done / max(now - self._t0, 1e-9)
        left = f", {(self.total - self.done) / rate:.0f} s left" if self.total and rate > 0 else ""
        of = f"/{self.total}" if self.total else ""
        print(
            f"\rcounting: {self.done}{of} {self.unit}, {rate:.0f}/s{left}    ",
            end="",
            file=sys.stderr,
            flush=True,
        )

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.done:
            print(file=sys.stderr)


def read_file_sizes(
    path: str,
    fmt: str,
    r_max: float | None,
    counter: str | None = None,
    cache_dir: str | None = None,
    progress: Progress | None = None,
) -> FileSizes:
    """The sizes of one file (cached in ``cache_dir`` unless it is None).

    Raises:
        DataError: the file is missing or cannot be read (named).
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file or folder")
    if not os.access(path, os.R_OK):
        raise DataError(f"{path}: not readable (permission denied)")
    key = cache_mod.key(path, fmt, r_max)
    if cache_dir is not None:
        hit = cache_mod.load(cache_dir, key)
        if hit is not None:
            if progress is not None:
                progress.update(len(hit["atoms"]))
            return FileSizes(
                path,
                fmt,
                hit["atoms"],
                hit["edges"],
                hit["isolated"],
                hit["bad"],
                from_cache=True,
                counter=hit.get("counter", ""),
            )
    use = backend(counter) if r_max is not None and fmt not in ("pyg", "sizes") else ""
    t0 = time.perf_counter()
    atoms, edges, iso, bad = [], [], [], {}
    zsets: dict[tuple, int] = {}
    zset, labels, checked = [], {}, True

    def tick(n, position=None):
        if progress is not None:
            progress.update(n)

    for block in read_blocks(path, fmt, tick):
        e, b = _count_block(block, r_max, use)
        atoms.append(block.atoms)
        edges.append(e)
        iso.append(block.isolated)
        bad.update(b)
        if block.elements is None:
            checked = False
        elif checked:
            zset.append([zsets.setdefault(z, len(zsets)) for z in block.elements])
            for k, names in block.labels.items():
                labels[block.start + k] = ", ".join(names) + " not finite"
    out = FileSizes(
        path,
        fmt,
        np.concatenate(atoms) if atoms else np.zeros(0, np.int64),
        np.concatenate(edges) if edges else np.zeros(0, np.int64),
        np.concatenate(iso) if iso else np.zeros(0, bool),
        bad,
        seconds=time.perf_counter() - t0,
        counter=use,
    )
    checks = None
    if checked and zset:  # the trainers' start-up checks, where the reader made them (mace's HDF5)
        checks = {"labels": labels, "zsets": [list(s) for s in zsets], "zset": np.concatenate(zset)}
    if cache_dir is not None:
        cache_mod.save(cache_dir, key, out, checks)
    return out


def read_sizes(
    inputs,
    r_max: float | None,
    counter: str | None = None,
    cache_dir: str | None = None,
    show_progress: bool = True,
) -> list[FileSizes]:
    """The sizes of every file of ``inputs`` (``(path, format)`` pairs; a folder stands for its
    files, in the trainer's order), in order."""
    files = [(f, fmt) for path, fmt in inputs for f in files_of(path, fmt)]
    total = 0
    for f, fmt in files:
        hit = cache_mod.load(cache_dir, cache_mod.key(f, fmt, r_max)) if cache_dir else None
        n = len(hit["atoms"]) if hit is not None else count_hint(f, fmt)[0]
        if n is None:
            total = None
            break
        total += n
    bar = Progress(total or None, enabled=show_progress)
    try:
        out = []
        for f, fmt in files:
            bar.describe(os.path.basename(f))
            out.append(read_file_sizes(f, fmt, r_max, counter, cache_dir, bar))
        return out
    finally:
        bar.close()
