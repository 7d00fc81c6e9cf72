"""The data files ``cfm-plan`` reads, as the trainers read them; sizes only.

A reader walks one input in the trainer's order and yields :class:`Block` objects of up to
:data:`BLOCK` structures: their atom counts and, where the file holds geometry, positions, cells
and periodicity (the edges are counted afterwards, :mod:`.neighbours`), or the edge counts the file
holds. mace's HDF5 files also give each structure's elements and which of its labels are not
finite (:attr:`Block.elements`, :attr:`Block.labels`: the trainers' start-up checks, kept in the
sizes cache); elsewhere nothing else of a structure (energies, forces) is read.

Formats (:data:`FORMATS`; :func:`detect` tells them from the path unless ``--format`` says):
``xyz`` (and every other format ``ase.io.read`` reads), ``h5`` and ``lmdb`` (mace's), ``db`` (an
ASE database), ``pyg`` (a ``torch.save``-d list of PyG graphs: unpickling runs the file's code, so
read only files you trust) and ``sizes`` (an ``.npz`` of ``atoms`` and ``edges``). How each is read:
:func:`read_blocks`; the files one input stands for: :func:`files_of`.
"""

from __future__ import annotations

import glob
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

FORMATS = ("xyz", "h5", "lmdb", "db", "pyg", "sizes")
#: structures per block handed to the edge counter
BLOCK = 4096

_SUFFIX = {
    ".xyz": "xyz",
    ".extxyz": "xyz",
    ".h5": "h5",
    ".hdf5": "h5",
    ".lmdb": "lmdb",
    ".aselmdb": "lmdb",
    ".mdb": "lmdb",
    ".db": "db",
    ".pt": "pyg",
    ".pth": "pyg",
    ".npz": "sizes",
}


class DataError(ValueError):
    """An input that cannot be read: the message names the file (and the structure)."""


@dataclass
class Block:
    """Structures ``start .. start + len(atoms) - 1`` of one file.

    ``positions`` (``[sum(atoms), 3]``), ``cells`` (``[m, 3, 3]``) and ``pbc`` (``[m, 3]``) where
    the file holds geometry; ``edges`` where it holds edge counts instead; ``isolated``: one-atom
    E0 references (``config_type=IsolatedAtom``) that mace does not train on. ``elements`` (the
    sorted atomic numbers of each structure) and ``labels`` (index within the block -> the names
    of its labels that are not finite) where the reader checks the labels (mace's HDF5).
    """

    start: int
    atoms: np.ndarray
    positions: np.ndarray | None = None
    cells: np.ndarray | None = None
    pbc: np.ndarray | None = None
    edges: np.ndarray | None = None
    isolated: np.ndarray = field(default=None)
    elements: list | None = None
    labels: dict | None = None

    def __post_init__(self):
        self.atoms = np.asarray(self.atoms, dtype=np.int64)
        if self.isolated is None:
            self.isolated = np.zeros(len(self.atoms), dtype=bool)


def detect(path: str) -> str:
    """The format of ``path``, one of :data:`FORMATS` (see :func:`read_blocks`), told from its
    suffix, a folder's files or an SQLite header (``--format`` overrides it).

    Raises:
        DataError: a path whose format cannot be told (the message lists the formats).
    """
    if os.path.isdir(path):
        names = os.listdir(path)
        if path.rstrip("/").endswith("_lmdb") or any(
            n.endswith((".lmdb", ".aselmdb", ".mdb")) for n in names
        ):
            return "lmdb"
        if any(n.endswith((".h5", ".hdf5")) for n in names):
            return "h5"
        raise DataError(
            f"{path}: a folder without .h5/.hdf5 shards or .lmdb/.aselmdb files: which data is "
            f"it? Give --format ({', '.join(FORMATS)})"
        )
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".db":
        with open(path, "rb") as fh:
            return "db" if fh.read(16).startswith(b"SQLite format 3") else "lmdb"
    if suffix in _SUFFIX:
        return _SUFFIX[suffix]
    try:
        from ase.io.formats import filetype

        filetype(path, guess=False)
        return "xyz"
    except Exception:  # noqa: BLE001 - ASE raises several types for "not mine"
        pass
    raise DataError(
        f"{path}: cannot tell its format from its name; give --format ({', '.join(FORMATS)})"
    )


def files_of(path: str, fmt: str) -> list[str]:
    """The files one input stands for, in the order the trainer reads them."""
    if not os.path.isdir(path):
        return [path]
    if fmt == "h5":
        return [p for p in glob.glob(path + "/*") if os.path.isfile(p)]  # mace's (unsorted) order
    if fmt == "lmdb":
        return [
            p
            for p in sorted(glob.glob(f"{path}/*"))
            if os.path.isfile(p) and p.endswith((".lmdb", ".aselmdb", ".mdb", ".db"))
        ]
    raise DataError(f"{path}: a folder, but {fmt} data comes in one file")


def count_hint(path: str, fmt: str) -> tuple[int | None, int | None]:
    """``(structures, bytes)`` of a file where cheap to know (for the progress bar)."""
    try:
        if fmt == "h5":
            import h5py

            with h5py.File(path, "r") as f:
                keys = list(f.keys())
                return (len(keys) * len(f[keys[0]].keys()) if keys else 0), None
        if fmt == "lmdb":
            return len(_lmdb_ids(path)[1]), None
        if fmt == "db":
            import ase.db

            with ase.db.connect(path) as db:
                return db.count(), None
        if fmt == "xyz" and path.lower().endswith((".xyz", ".extxyz")):
            return _xyz_estimate(path), os.path.getsize(path)
    except Exception:  # noqa: BLE001 - a hint only; the reader names the real error
        return None, None
    return None, None


def _xyz_estimate(path: str, sample: int = 4 << 20) -> int | None:
    """Frames of an XYZ file: counted in its first ``sample`` bytes (from their atom-count lines),
    scaled to its size (exact for a file no larger), for the progress bar's time left; None where
    the start does not look like XYZ."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        lines = fh.read(sample).split(b"\n")
    if size > sample:
        lines.pop()  # cut short
    frames = covered = i = 0
    while i < len(lines):
        try:
            n = int(lines[i].strip() or b"-1")
        except ValueError:
            return None
        if n < 0:  # a blank line between frames
            covered += len(lines[i]) + 1
            i += 1
            continue
        if i + n + 2 > len(lines):
            break
        frames += 1
        covered += sum(len(x) + 1 for x in lines[i : i + n + 2])
        i += n + 2
    if frames == 0:
        return None
    return frames if size <= sample else max(frames, round(frames * size / covered))


def read_blocks(path: str, fmt: str, progress=None) -> Iterator[Block]:
    """The structures of one file in blocks; ``progress(structures, bytes_position)`` is called
    after each block.

    The formats (``fmt``, :data:`FORMATS`):

    - ``xyz``: extended XYZ and every other format ``ase.io.read`` reads (what mace reads as its
      ``--train_file``); one-atom structures with ``config_type=IsolatedAtom`` are marked: mace
      takes them as its E0s and trains without them (unless ``--keep_isolated_atoms``).
    - ``h5``: mace's preprocessed HDF5 (``mace_prepare_data``): one file, or a folder of shards
      read in the order mace's ``dataset_from_sharded_hdf5`` reads them (``glob(folder + "/*")``,
      :func:`files_of`); structure ``i`` of a file is ``config_batch_<i // B>/config_<i % B>``,
      ``B`` the size of its first batch, as mace's ``HDF5Dataset`` indexes it.
    - ``lmdb``: mace's LMDB (fairchem's ASE-LMDB, ``*.aselmdb``/``*.lmdb``: one file, or a folder
      of them in sorted order as mace's ``AseDBDataset``): rows ``1..nextid-1`` less the deleted
      ones.
    - ``db``: an ASE database (SQLite ``.db``; mace reads it through ``ase.io.read`` too).
    - ``pyg``: a ``torch.save``-d list of PyG graphs (HydraGNN's data): atoms and edges as the
      graphs hold them (``num_nodes``, ``edge_index``), no counting. Unpickling runs the file's
      code: read only files you trust.
    - ``sizes``: a ``.npz`` with ``atoms`` (and ``edges``) arrays, e.g. sizes written by a script.

    Raises:
        DataError: the file cannot be read (named, with the structure where known).
    """
    reader = {
        "xyz": _xyz,
        "h5": _h5,
        "lmdb": _lmdb,
        "db": _db,
        "pyg": _pyg,
        "sizes": _sizes,
    }[fmt]
    try:
        yield from reader(path, progress or (lambda n, pos=None: None))
    except DataError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read as {fmt} data: {exc}") from exc


class _Collector:
    """Gathers structures into blocks."""

    def __init__(self, progress):
        self.progress = progress
        self.start = 0
        self._clear()

    def _clear(self):
        self.atoms, self.pos, self.cells, self.pbc, self.iso = [], [], [], [], []
        self.elements, self.labels = [], {}

    def add(self, positions, cell, pbc, isolated=False, elements=None, labels=None):
        """One structure; ``elements`` and ``labels`` (the names of labels that are not finite)
        where the reader checks them, for every structure of the file."""
        if elements is not None:
            self.elements.append(tuple(elements))
            if labels:
                self.labels[len(self.atoms)] = labels
        p = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        self.atoms.append(len(p))
        self.pos.append(p)
        c = np.zeros((3, 3)) if cell is None else np.asarray(cell, dtype=np.float64)
        self.cells.append(c.reshape(3, 3) if c.size == 9 else np.zeros((3, 3)))
        self.pbc.append(
            np.zeros(3, bool) if pbc is None else np.broadcast_to(np.asarray(pbc, bool), (3,))
        )
        self.iso.append(bool(isolated))
        return len(self.atoms) >= BLOCK

    def flush(self, position=None) -> Block | None:
        if not self.atoms:
            return None
        block = Block(
            self.start,
            np.array(self.atoms, dtype=np.int64),
            np.concatenate(self.pos) if self.pos else np.zeros((0, 3)),
            np.stack(self.cells),
            np.stack(self.pbc),
            isolated=np.array(self.iso, dtype=bool),
            elements=self.elements if len(self.elements) == len(self.atoms) else None,
            labels=self.labels if len(self.elements) == len(self.atoms) else None,
        )
        self.start += len(self.atoms)
        self._clear()
        self.progress(len(block.atoms), position)
        return block


def _is_isolated(atoms) -> bool:
    return len(atoms) == 1 and atoms.info.get("config_type") == "IsolatedAtom"


def _xyz(path, progress):
    from ase.io import iread

    out = _Collector(progress)
    with open(path, "rb") as raw:
        import io

        fh = io.TextIOWrapper(raw)
        fmt = "extxyz" if path.lower().endswith((".xyz", ".extxyz")) else None
        frames = iread(fh, index=":", format=fmt) if fmt else iread(path, index=":")
        for atoms in frames:
            if out.add(atoms.positions, atoms.cell.array, atoms.pbc, _is_isolated(atoms)):
                yield out.flush(raw.tell() if fmt else None)
        block = out.flush(raw.tell() if fmt else None)
        if block is not None:
            yield block


def _db(path, progress):
    import ase.db

    out = _Collector(progress)
    with ase.db.connect(path) as db:
        for row in db.select():
            iso = row.natoms == 1 and row.get("config_type") == "IsolatedAtom"
            if out.add(row.positions, row.cell, row.pbc, iso):
                yield out.flush()
    block = out.flush()
    if block is not None:
        yield block


def _h5(path, progress):
    import h5py

    out = _Collector(progress)
    with h5py.File(path, "r") as f:
        keys = list(f.keys())
        if not keys:
            return
        size = len(f[keys[0]].keys())
        batch, batch_no = None, -1
        for i in range(len(keys) * size):
            b, j = divmod(i, size)
            try:
                if b != batch_no:
                    batch, batch_no = f["config_batch_" + str(b)].id, b
                g = h5py.h5g.open(batch, b"config_" + str(j).encode())
                pos, cell, pbc = (h5_read(g, name) for name in (b"positions", b"cell", b"pbc"))
                numbers = np.unique(np.asarray(h5_read(g, b"atomic_numbers"), np.int64))
                labels = _not_finite(h5py.h5g.open(g, b"properties")) if b"properties" in g else []
            except KeyError as exc:
                raise DataError(
                    f"{path}: structure {i}: mace reads it from config_batch_{b}/config_{j}, which "
                    f"is missing ({exc}); the file's batches differ in size (mace's HDF5Dataset "
                    "takes every batch to be as large as the first)"
                ) from None
            if out.add(pos, cell, pbc, False, numbers.tolist(), labels):
                yield out.flush()
    block = out.flush()
    if block is not None:
        yield block


def _not_finite(properties) -> list[str]:
    """:func:`not_finite` of a mace HDF5 structure's properties (a low-level group)."""
    return not_finite((name.decode(), h5_read(properties, name)) for name in properties)


def not_finite(items) -> list[str]:
    """The names of the numeric values of ``items`` (``(name, value)`` pairs) that hold NaN or
    inf; a missing value (None, or mace's string "None") is not checked."""
    names = []
    for name, value in items:
        if value is None or isinstance(value, (str, bytes)):
            continue
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            continue
        if not np.all(np.isfinite(arr)):
            names.append(name)
    return names


def h5_value(value):
    """A value of mace's HDF5 as mace unpacks it: strings decoded, the string "None" (a missing
    value) as None."""
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.dtype.kind in "SO" and value.shape == ():
        value = value[()]
        value = value.decode("utf-8") if isinstance(value, bytes) else value
    return None if isinstance(value, str) and value == "None" else value


def h5_read(gid, name: bytes):
    """Dataset ``name`` of the low-level group ``gid`` (h5py's ``h5g``/``h5d`` API: a few times
    faster than ``Group[...]`` for the small datasets of one structure), as :func:`h5_value`."""
    import h5py

    ds = h5py.h5d.open(gid, name)
    if ds.dtype.kind not in "fiub":
        return h5_value(h5py.Dataset(ds)[()])
    out = np.empty(ds.shape, ds.dtype)
    ds.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    return out


def _loads():
    try:
        import orjson

        return orjson.loads
    except ImportError:
        import json

        return json.loads


def _lmdb_env(path):
    import lmdb

    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    return lmdb.open(path, subdir=False, readonly=True, lock=False, meminit=False)


def _lmdb_ids(path):
    """``(env, ids)`` as mace's ``LMDBDatabase`` lists them: 1..nextid-1 less the deleted ids."""
    env = _lmdb_env(path)
    loads = _loads()
    with env.begin() as txn:
        raw = txn.get(b"nextid")
        nextid = loads(zlib.decompress(raw)) if raw else 1
        raw = txn.get(b"deleted_ids")
        deleted = set(loads(zlib.decompress(raw))) if raw else set()
    return env, [i for i in range(1, nextid) if i not in deleted]


def _ndarray(obj):
    if isinstance(obj, dict) and "__ndarray__" in obj:
        shape, dtype, flat = obj["__ndarray__"]
        return np.asarray(flat, dtype=dtype).reshape(shape)
    return obj


def _lmdb(path, progress):
    env, ids = _lmdb_ids(path)
    loads = _loads()
    out = _Collector(progress)
    try:
        with env.begin() as txn:
            for k, idx in enumerate(ids):
                raw = txn.get(f"{idx}".encode("ascii"))
                if raw is None:
                    raise DataError(f"{path}: structure {k} (row id {idx}) is missing")
                row = loads(zlib.decompress(raw))
                pos = _ndarray(row.get("positions"))
                if pos is None:
                    raise DataError(f"{path}: structure {k} (row id {idx}) has no positions")
                if out.add(pos, _ndarray(row.get("cell")), _ndarray(row.get("pbc"))):
                    yield out.flush()
    finally:
        env.close()
    block = out.flush()
    if block is not None:
        yield block


def _pyg(path, progress):
    import torch

    graphs = torch.load(path, weights_only=False, map_location="cpu")
    if not hasattr(graphs, "__len__") or not hasattr(graphs, "__getitem__"):
        raise DataError(f"{path}: holds a {type(graphs).__name__}, not a list of PyG graphs")
    atoms = np.empty(len(graphs), dtype=np.int64)
    edges = np.empty(len(graphs), dtype=np.int64)
    for i in range(len(graphs)):
        g = graphs[i]
        if not hasattr(g, "num_nodes"):
            raise DataError(f"{path}: structure {i} is a {type(g).__name__}, not a PyG graph")
        atoms[i] = int(g.num_nodes)
        ei = getattr(g, "edge_index", None)
        edges[i] = -1 if ei is None else int(ei.shape[1])
    progress(len(atoms), None)
    yield Block(0, atoms, edges=edges)


def _sizes(path, progress):
    with np.load(path) as z:
        if "atoms" not in z:
            raise DataError(f"{path}: a sizes file needs an 'atoms' array (it has {list(z)})")
        atoms = np.asarray(z["atoms"], dtype=np.int64).reshape(-1)
        edges = np.asarray(z["edges"], dtype=np.int64).reshape(-1) if "edges" in z else None
    if edges is not None and edges.shape != atoms.shape:
        raise DataError(f"{path}: {len(atoms)} atom counts but {len(edges)} edge counts")
    progress(len(atoms), None)
    yield Block(0, atoms, edges=edges)
