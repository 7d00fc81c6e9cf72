"""Per-sample graph sizes (atoms, edges) of the datasets mace_run_train builds, and the checks of
the data mace reads lazily, done in the same pass.

- xyz input: a list of ``AtomicData`` (sizes read off each graph; the data was checked when mace
  read the file, :mod:`.data_checks`);
- HDF5 input: ``mace.data.HDF5Dataset`` (one file; a folder of shards is a ``ConcatDataset`` of
  them) and LMDB input: ``mace.data.LMDBDataset`` (one or several database files), read, checked
  and their edges counted in one pass, cached (:func:`local_sizes`);
- ``torch.utils.data.ConcatDataset`` of any of these (what mace makes of several files/heads).

:func:`local_sizes` gives the sizes of one rank's shard only (``indices``); :func:`tag` tells a
lazy dataset which loader it feeds and the ranks; :func:`cache_dirs` says where the sizes cache is.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
import types
from dataclasses import dataclass, field

import numpy as np
from torch.utils.data import ConcatDataset

log = logging.getLogger("cfm_plugins.mace")

#: seconds between two progress lines of a long read
PROGRESS_S = 10.0
#: structures handed to the edge counter at once
CHUNK = 4096


def _graph_size(data) -> tuple[int, int]:
    return int(data.num_nodes), int(data.edge_index.shape[1])


def _hdf5_atoms(dataset, index: int) -> int:
    batch_index, config_index = divmod(index, dataset.batch_size)
    grp = dataset.file["config_batch_" + str(batch_index)]
    return int(grp["config_" + str(config_index)]["atomic_numbers"].shape[0])


def sample_size(dataset, index: int, need_edges: bool = True) -> tuple[int, int]:
    """(atoms, edges) of sample ``index`` by building its graph; edges is -1 when not needed and
    costly to get."""
    if isinstance(dataset, ConcatDataset):
        d = bisect.bisect_right(dataset.cumulative_sizes, index)
        start = dataset.cumulative_sizes[d - 1] if d > 0 else 0
        return sample_size(dataset.datasets[d], index - start, need_edges)
    if not need_edges and hasattr(dataset, "file") and hasattr(dataset, "batch_size"):
        return _hdf5_atoms(dataset, index), -1
    item = dataset[index]
    if item is None:
        raise ValueError(
            f"sample {index} of {type(dataset).__name__} could not be read (the dataset returned "
            "None)"
        )
    return _graph_size(item)


# ------------------------------------------------------------------------------ the datasets
@dataclass
class DataTag:
    """What the sizes pass of a lazy dataset needs to know of the run: ``role`` (train, valid,
    test), ``dist`` (the ranks, :class:`cfm_plugins.distributed.DistInfo`), ``cache_dirs``
    (folders holding the cache, looked up in order; the first is written)."""

    role: str = "test"
    dist: object = None
    cache_dirs: tuple = ()

    def __getstate__(self):  # a loader's worker processes get the dataset: not the ranks
        return {"role": self.role, "dist": None, "cache_dirs": self.cache_dirs}


def cache_dirs(work_dir: str | None) -> tuple[str, ...]:
    """Where the sizes cache is looked up: mace's ``--work_dir``, then the current folder
    (``cfm-plan``'s default; ``cfm-plan --cache WORK_DIR`` writes it where training looks first).
    The first is written."""
    out = []
    for d in (work_dir, os.getcwd()):
        if d and os.path.realpath(d) not in {os.path.realpath(x) for x in out}:
            out.append(d)
    return tuple(out)


def _is_hdf5(leaf) -> bool:
    return hasattr(leaf, "file_path") and hasattr(leaf, "batch_size") and hasattr(leaf, "file")


def _is_lmdb(leaf) -> bool:
    return hasattr(leaf, "AseDB") and hasattr(leaf.AseDB, "dbs")


def _leaves(dataset, start: int = 0) -> list[tuple[object, int, int]]:
    """``(dataset, first global index, length)`` of the datasets a ConcatDataset is made of."""
    if isinstance(dataset, ConcatDataset):
        out, offset = [], start
        for part in dataset.datasets:
            out += _leaves(part, offset)
            offset += len(part)
        return out
    return [(dataset, start, len(dataset))]


def tag(dataset, role: str, dist=None, dirs: tuple = ()) -> None:
    """Mark the HDF5/LMDB datasets of ``dataset`` with their :class:`DataTag` (the
    ``load_dataset_for_path`` seam calls it). A dataset without a tag (mace's ``--test_dir`` sets,
    made after training) is checked on each rank for its share alone."""
    for leaf, _, _ in _leaves(dataset):
        if _is_hdf5(leaf) or _is_lmdb(leaf):
            leaf._cfm_data = DataTag(role, dist, tuple(dirs))


@dataclass
class _File:
    """One file of a lazy dataset and this rank's structures in it (``local``: indices in the
    file; ``where``: their positions in the shard)."""

    path: str
    fmt: str
    leaf: object
    n: int
    start: int  # index of the file's first structure in ``leaf``
    local: np.ndarray = None
    where: np.ndarray = None
    row_ids: list = None  # LMDB: the row id (the database key) of each structure in the file
    hit: dict | None = None
    read: dict = field(default_factory=dict)  # what this rank read (see _read_file)


def _files(leaf) -> list[_File]:
    if _is_hdf5(leaf):
        return [_File(str(leaf.file_path), "h5", leaf, len(leaf), 0)]
    db = leaf.AseDB
    out = []
    for j, d in enumerate(db.dbs):
        start = db._idlen_cumulative[j - 1] if j else 0
        fmt = "lmdb" if type(d).__name__ == "LMDBDatabase" else "db"
        out.append(
            _File(str(d.filename), fmt, leaf, len(db.db_ids[j]), int(start), row_ids=db.db_ids[j])
        )
    return out


# ------------------------------------------------------------------------------ reading
def _h5_structures(f: _File, local):
    import h5py

    from cfm_plugins.api import h5_read

    h5, size = f.leaf.file, f.leaf.batch_size
    batch, batch_no = None, -1
    for i in local:
        b, c = divmod(int(i), size)
        if b != batch_no:
            batch, batch_no = h5["config_batch_" + str(b)].id, b
        g = h5py.h5g.open(batch, b"config_" + str(c).encode())
        props = h5py.h5g.open(g, b"properties")
        yield types.SimpleNamespace(
            atomic_numbers=h5_read(g, b"atomic_numbers"),
            positions=h5_read(g, b"positions"),
            cell=h5_read(g, b"cell"),
            pbc=h5_read(g, b"pbc"),
            properties={key.decode(): h5_read(props, key) for key in props},
        )


def _lmdb_structures(f: _File, local):
    """mace's ``LMDBDataset.__getitem__`` up to its configuration (no graph)."""
    from mace.data.utils import KeySpecification, config_from_atoms
    from mace.tools.default_keys import DefaultKeys

    keys = KeySpecification.from_defaults()
    for i in local:
        atoms = f.leaf.AseDB.get_atoms(f.start + int(i))
        results = getattr(getattr(atoms, "calc", None), "results", None) or {}
        if "energy" in results:
            atoms.info[DefaultKeys.ENERGY.value] = results["energy"]
        if "forces" in results:
            atoms.arrays[DefaultKeys.FORCES.value] = results["forces"]
        if "stress" in results:
            atoms.info[DefaultKeys.STRESS.value] = results["stress"]
        yield config_from_atoms(atoms, key_specification=keys)


class _Progress:
    """A log line every :data:`PROGRESS_S` seconds of a long read (rank 0's, or every rank's
    where the ranks are not known)."""

    def __init__(self, total: int, loud: bool):
        self.total, self.done, self.loud = total, 0, loud
        self.t0 = self.last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.loud and now - self.last >= PROGRESS_S and self.done < self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            log.info(
                "sizes and data checks: %d of this rank's %d structures read (%.0f%%, %.0f/s, "
                "%.0f s left)",
                self.done,
                self.total,
                100.0 * self.done / self.total,
                rate,
                (self.total - self.done) / rate,
            )


def _read_file(f: _File, local, count: bool, r_max: float, counter: str, progress) -> dict:
    """Read structures ``local`` of ``f``: atoms, element sets, what is not finite, and (``count``)
    the edges at ``r_max``."""
    from cfm_plugins.api import Block, count_block
    from cfm_plugins_adapters.mace.data_checks import bad_values

    structures = _h5_structures if f.fmt == "h5" else _lmdb_structures
    m = len(local)
    atoms = np.zeros(m, np.int64)
    edges = np.full(m, -1, np.int64)
    sets: dict[tuple, int] = {}
    zset = np.zeros(m, np.int32)
    labels: dict[int, str] = {}
    bad: dict[int, str] = {}
    for lo in range(0, m, CHUNK):
        part = local[lo : lo + CHUNK]
        pos, cells, pbcs = [], [], []
        for k, s in enumerate(structures(f, part)):
            z = np.asarray(s.atomic_numbers, dtype=np.int64).reshape(-1)
            atoms[lo + k] = len(z)
            zset[lo + k] = sets.setdefault(tuple(int(x) for x in np.unique(z)), len(sets))
            found = bad_values(s)
            if found:
                labels[int(part[k])] = ", ".join(found) + " not finite"
            if count:
                pos.append(np.asarray(s.positions, dtype=np.float64).reshape(-1, 3))
                c = np.zeros((3, 3)) if s.cell is None else np.asarray(s.cell, dtype=np.float64)
                cells.append(c.reshape(3, 3) if c.size == 9 else np.zeros((3, 3)))
                p = np.zeros(3, bool) if s.pbc is None else np.asarray(s.pbc, dtype=bool)
                pbcs.append(np.broadcast_to(p.reshape(-1), (3,)))
        if count and len(part):
            block = Block(0, atoms[lo : lo + len(part)], np.concatenate(pos), np.stack(cells))
            block.pbc = np.stack(pbcs)
            e, b = count_block(block, r_max, counter)
            edges[lo : lo + len(part)] = e
            for k, why in b.items():
                bad[int(part[k])] = why
        progress.update(len(part))
    return {
        "atoms": atoms,
        "edges": edges,
        "zsets": list(sets),
        "zset": zset,
        "labels": labels,
        "bad": bad,
    }


# ------------------------------------------------------------------------------ the cache
def _cache_hit(f: _File, r_max: float, dirs) -> dict | None:
    from cfm_plugins.api import plan_cache

    if f.fmt not in ("h5", "lmdb"):
        return None
    k = plan_cache.key(f.path, f.fmt, r_max)
    for d in dirs:
        hit = plan_cache.load(d, k)
        if hit is not None and len(hit["atoms"]) == f.n:
            hit["folder"] = d
            return hit
    return None


def _write_cache(f: _File, r_max: float, folder: str, parts: list[dict], counter: str) -> bool:
    """Write ``f``'s entry from every rank's ``parts`` (``local`` indices and what was read);
    False where they do not cover the file or have no edges."""
    from cfm_plugins.api import FileSizes, plan_cache

    atoms = np.full(f.n, -1, np.int64)
    edges = np.full(f.n, -1, np.int64)
    zset = np.full(f.n, -1, np.int32)
    sets: dict[tuple, int] = {}
    labels, bad = {}, {}
    for p in parts:
        idx = np.asarray(p["local"], np.int64)
        atoms[idx], edges[idx] = p["atoms"], p["edges"]
        remap = np.array(
            [sets.setdefault(tuple(s), len(sets)) for s in p["zsets"]] or [0], np.int32
        )
        zset[idx] = remap[np.asarray(p["zset"], np.int64)]
        labels.update(p["labels"])
        bad.update(p["bad"])
    if (atoms < 0).any() or (zset < 0).any() or ((edges < 0).sum() > len(bad)):
        return False
    sizes = FileSizes(f.path, f.fmt, atoms, edges, np.zeros(f.n, bool), dict(sorted(bad.items())))
    sizes.counter = counter
    checks = {"labels": labels, "zsets": [list(s) for s in sets], "zset": zset}
    return plan_cache.save(folder, plan_cache.key(f.path, f.fmt, r_max), sizes, checks) is not None


# ------------------------------------------------------------------------------ the pass
def _known(leaf) -> set[int] | None:
    z = getattr(leaf, "z_table", None)
    return {int(x) for x in z.zs} if z is not None else None


def _source(f: _File, i: int) -> tuple:
    return (f.path, int(i))


def _what(f: _File, i: int, text: str) -> str:
    return f"{text} (LMDB row id {f.row_ids[int(i)]})" if f.row_ids is not None else text


def _lazy_pass(files: list[_File], tags: list[DataTag], need_edges: bool, atoms, edges) -> None:
    from cfm_plugins.api import neighbour_counter
    from cfm_plugins_adapters.mace import data_checks

    t0 = time.perf_counter()
    tagged = [t for t in tags if t is not None]
    the_tag = tagged[0] if tagged else DataTag()
    dist = the_tag.dist
    comm = dist.comm if dist is not None and dist.world_size > 1 else None
    if dist is not None:
        rank, gathered = dist.rank, dist.world_size == 1 or comm is not None
    else:  # not tagged: one process, or this rank's share alone
        rank, world = _torch_ranks()
        gathered = world == 1
    dirs = the_tag.cache_dirs
    r_max = float(files[0].leaf.r_max)
    plan = []
    for f in files:
        f.hit = _cache_hit(f, r_max, dirs)
        hit = f.hit
        fresh = hit is None or hit["checks"] is None
        count = need_edges and (hit is None or (hit["edges"][f.local] < 0).any())
        plan.append((fresh or count, count))
    total = sum(len(f.local) for f, (read, _) in zip(files, plan) if read)
    counter = neighbour_counter(None) if any(count for _, count in plan) else ""
    progress = _Progress(total, loud=rank == 0 or not gathered)
    labels, elements = [], []
    parts = {}
    for j, (f, (read, count)) in enumerate(zip(files, plan)):
        known = _known(f.leaf)
        if read:
            got = _read_file(f, f.local, count, r_max, counter, progress)
            if not count and f.hit is not None:
                got["edges"] = np.asarray(f.hit["edges"][f.local], np.int64)
            atoms[f.where], e = got["atoms"], got["edges"]
            zsets, zset = got["zsets"], got["zset"]
            found = dict(got["labels"])
            for i, why in got["bad"].items():
                found.setdefault(i, why)
            if (count or f.hit is not None) and dirs and f.fmt in ("h5", "lmdb"):
                parts[j] = {"local": f.local, **got}
        else:
            atoms[f.where] = f.hit["atoms"][f.local]
            e = f.hit["edges"][f.local]
            checks = f.hit["checks"]
            zsets, zset = checks["zsets"], np.asarray(checks["zset"])[f.local]
            share = set(f.local.tolist())
            found = {i: why for i, why in checks["labels"].items() if i in share}
            found.update({i: why for i, why in f.hit["bad"].items() if i in share})
        edges[f.where] = np.where(e < 0, 0, e) if need_edges else -1
        labels += [(_source(f, i), _what(f, i, why)) for i, why in sorted(found.items())]
        if known is not None:
            for k, zs in enumerate(zsets):
                odd = sorted(set(zs) - known)
                for i in f.local[zset == k] if odd else ():
                    elements.append((_source(f, i), odd))
    mine = {"labels": labels, "elements": elements, "parts": parts}
    own = time.perf_counter() - t0
    every = comm.allgather(mine) if comm is not None else [mine]
    waited = time.perf_counter() - t0 - own
    written = []
    if rank == 0 and dirs:
        for j, f in enumerate(files):
            ranks_parts = [e["parts"][j] for e in every if j in e["parts"]]
            used = counter or (f.hit or {}).get("counter", "")
            if ranks_parts and _write_cache(f, r_max, dirs[0], ranks_parts, used):
                written.append(f.path)
    if comm is not None and dirs and any(e["parts"] for e in every):
        comm.Barrier()  # the next loader of the same files finds the cache written
    if rank == 0 or not gathered:
        read_files = [f for f, (read, _) in zip(files, plan) if read]
        counted = [f for f, (_, count) in zip(files, plan) if count]
        cached = [f for f in files if f.hit is not None and not any(f is g for g in counted)]
        how = []
        if need_edges and cached:
            how.append(
                f"edges of {len(cached)} file(s) from the sizes cache in "
                f"{os.path.join(cached[0].hit['folder'], '.cfm-plan-cache')}"
            )
        if counted:
            name = "cfm::count_edges" if counter == "cfm" else counter
            how.append(f"edges of {len(counted)} file(s) counted with {name}")
        if len(read_files) < len(files):
            how.append(f"checks of {len(files) - len(read_files)} file(s) from the sizes cache")
        if written:
            how.append(f"cache written in {os.path.join(dirs[0], '.cfm-plan-cache')}")
        log.info(
            "sizes of the %s data (%d file(s), %d structure(s) on this rank, %d read): %s; "
            "%.2f s (and %.2f s waiting for the other ranks)",
            the_tag.role,
            len(files),
            len(atoms),
            total,
            "; ".join(how) or "atoms only",
            time.perf_counter() - t0 - waited,
            waited,
        )
    all_labels = [x for e in every for x in e["labels"]]
    all_elements = [x for e in every for x in e["elements"]]
    known = set().union(*(_known(f.leaf) or set() for f in files))
    verdict = data_checks.lazy_findings(the_tag.role, all_labels, all_elements, known)
    if verdict is None:
        return
    kind, message = verdict
    if kind == "warning":
        if rank == 0 or not gathered:
            log.warning("%s", message)
        return
    if gathered:
        raise data_checks.DataCheckError(message)
    raise ValueError(f"rank {rank}: {message}")


def _torch_ranks() -> tuple[int, int]:
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank(), tdist.get_world_size()
    return 0, 1


def local_sizes(dataset, indices, need_edges: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Sizes of the samples ``indices`` of ``dataset`` as two int64 arrays (HDF5 and LMDB data
    checked on the way).

    ``indices`` are one rank's shard, so under MPI each rank reads ``1/world_size`` of the data
    and the sampler gathers the rest. HDF5 and LMDB files are read one structure at a time without
    building its graph (h5py's groups; for LMDB mace's own ``get_atoms`` and
    ``config_from_atoms``): the atomic numbers, the geometry and every property mace reads. In
    that one read:

    - the labels and positions are checked (NaN or infinite: :func:`.data_checks.bad_values`, as
      for xyz) and so are the elements (against the dataset's atomic number table, mace's
      ``z_table``);
    - the edges at the dataset's ``r_max`` are counted by ``cfm-plan``'s counter
      (:func:`cfm_plugins.plan.neighbours.count_edges`: the compiled ``cfm::count_edges``, the
      count of mace's own neighbour list, periodic images included).

    Each file's sizes and check results are kept in ``cfm-plan``'s cache
    (:mod:`cfm_plugins.plan.cache`, the same key: the file's path, size, mtime, format and
    ``r_max``) in the folders of :func:`cache_dirs`. A file found there with its checks is not
    read at all; one ``cfm-plan`` wrote (edges, no checks) is read for the checks only. The ranks
    gather what each read (one ``allgather`` per loader, which every rank reaches): rank 0 writes
    the cache, and every rank stops alike on data that cannot be trained on
    (:class:`.data_checks.DataCheckError`, said once; the messages are
    :func:`.data_checks.lazy_findings`'). Which loader a dataset feeds (training, validation,
    test) and the ranks are told by :func:`tag`.
    """
    if isinstance(dataset, list):  # fast path: in-memory AtomicData
        pairs = [_graph_size(dataset[i]) for i in indices]
        arr = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        return arr[:, 0].copy(), arr[:, 1].copy()
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    atoms = np.zeros(len(indices), np.int64)
    edges = np.full(len(indices), -1, np.int64)
    order = np.argsort(indices, kind="stable")
    sorted_idx = indices[order]
    lazy, tags = [], []
    for leaf, start, n in _leaves(dataset):
        lo, hi = np.searchsorted(sorted_idx, [start, start + n])
        where = order[lo:hi]
        if _is_hdf5(leaf) or _is_lmdb(leaf):
            tags.append(getattr(leaf, "_cfm_data", None))
            for f in _files(leaf):
                inside = (indices[where] >= start + f.start) & (
                    indices[where] < start + f.start + f.n
                )
                f.where = where[inside]
                f.local = indices[f.where] - start - f.start
                lazy.append(f)
            continue
        for w in where:
            i = int(indices[w]) - start
            a, e = (
                _graph_size(leaf[i]) if isinstance(leaf, list) else sample_size(leaf, i, need_edges)
            )
            atoms[w], edges[w] = a, e
    if lazy:
        _lazy_pass(lazy, tags, need_edges, atoms, edges)
    return atoms, edges


def is_mace_dataset(dataset) -> bool:
    if isinstance(dataset, ConcatDataset):
        return all(is_mace_dataset(d) for d in dataset.datasets)
    if isinstance(dataset, list):
        return len(dataset) == 0 or hasattr(dataset[0], "edge_index")
    return type(dataset).__module__.startswith("mace.")
