"""The sizes cache (``cfm_plugins.plan.cache``): a second read of the same files reads no structure;
a changed file or another cutoff reads again."""

from __future__ import annotations

import os

import numpy as np

from cfm_plugins.plan import cache
from cfm_plugins.plan.sizes import read_sizes


def _write(path, n=5, seed=0):
    from ase.build import bulk
    from ase.io import write

    frames = []
    for i in range(n):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((1 + i % 2, 1, 1))
        a.rattle(0.05, seed=seed + i)
        frames.append(a)
    write(path, frames)


def test_a_second_read_comes_from_the_cache(tmp_path):
    data = tmp_path / "train.xyz"
    _write(data)
    first = read_sizes([(str(data), "xyz")], 4.0, cache_dir=str(tmp_path), show_progress=False)
    assert not first[0].from_cache
    assert list((tmp_path / cache.FOLDER).glob("train.xyz.*.npz"))
    second = read_sizes([(str(data), "xyz")], 4.0, cache_dir=str(tmp_path), show_progress=False)
    assert second[0].from_cache
    np.testing.assert_array_equal(first[0].atoms, second[0].atoms)
    np.testing.assert_array_equal(first[0].edges, second[0].edges)


def test_another_cutoff_or_a_changed_file_reads_again(tmp_path):
    data = tmp_path / "train.xyz"
    _write(data)
    kw = dict(cache_dir=str(tmp_path), show_progress=False)
    at4 = read_sizes([(str(data), "xyz")], 4.0, **kw)[0]
    at5 = read_sizes([(str(data), "xyz")], 5.0, **kw)[0]
    assert not at5.from_cache and at5.edges.sum() > at4.edges.sum()
    _write(data, n=6, seed=10)
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    again = read_sizes([(str(data), "xyz")], 4.0, **kw)[0]
    assert not again.from_cache and len(again) == 6


def test_an_unwritable_cache_folder_leaves_the_plan_without_a_cache(tmp_path):
    data = tmp_path / "train.xyz"
    _write(data)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    out = read_sizes([(str(data), "xyz")], 4.0, cache_dir=str(blocker), show_progress=False)
    assert len(out[0]) == 5 and not out[0].from_cache


def test_an_entry_keeps_the_trainers_checks_and_the_plan_still_reads_it(tmp_path):
    """The trainer writes an entry with what its data checks found (labels not finite, element
    sets); the plan reads the same entry as its own, and an entry the plan wrote has no checks."""
    data = tmp_path / "train.xyz"
    _write(data)
    kw = dict(cache_dir=str(tmp_path), show_progress=False)
    (planned,) = read_sizes([(str(data), "xyz")], 4.0, **kw)
    k = cache.key(str(data), "xyz", 4.0)
    assert cache.load(str(tmp_path), k)["checks"] is None
    checks = {"labels": {3: "energy not finite"}, "zsets": [[29]], "zset": np.zeros(5, np.int32)}
    assert cache.save(str(tmp_path), k, planned, checks)
    hit = cache.load(str(tmp_path), k)
    assert hit["checks"]["labels"] == {3: "energy not finite"}
    assert hit["checks"]["zsets"] == [[29]] and hit["checks"]["zset"].tolist() == [0] * 5
    (again,) = read_sizes([(str(data), "xyz")], 4.0, **kw)
    assert again.from_cache and again.edges.tolist() == planned.edges.tolist()
