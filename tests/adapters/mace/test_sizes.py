"""The sizes of the data mace reads lazily (``adapters/mace/sizes.py``): HDF5 and LMDB files read
once per rank share without building a graph, their edges counted by ``cfm::count_edges`` and
equal to mace's own graphs, kept in ``cfm-plan``'s cache (a cache ``cfm-plan`` wrote is used), and
the data checked in the same read. One process here; the 2-rank runs are in test_data_checks.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cfm_plugins.distributed import DistInfo
from cfm_plugins.plan import cache
from cfm_plugins_adapters.mace import sizes as mace_sizes
from tests.adapters.mace.test_data_checks import _frames, write_h5, write_lmdb

R_MAX = 4.0


def mace_graphs(dataset):
    items = [dataset[i] for i in range(len(dataset))]
    return [int(d.num_nodes) for d in items], [int(d.edge_index.shape[1]) for d in items]


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """A sharded HDF5 folder and an LMDB folder of the same 10 CuNi cells, and mace's datasets."""
    from mace.data.hdf5_dataset import dataset_from_sharded_hdf5
    from mace.data.lmdb_dataset import LMDBDataset
    from mace.tools.utils import AtomicNumberTable

    folder = tmp_path_factory.mktemp("lazy")
    frames, _, _ = _frames(folder, n_train=10, n_valid=1)
    h5 = write_h5(folder / "h5", frames, shards=3)
    lmdb = write_lmdb(folder / "train_lmdb", frames)
    z = AtomicNumberTable([28, 29])
    return {
        "folder": folder,
        "h5": (h5, lambda: dataset_from_sharded_hdf5(str(h5), z_table=z, r_max=R_MAX)),
        "lmdb": (lmdb, lambda: LMDBDataset(str(lmdb), r_max=R_MAX, z_table=z)),
    }


@pytest.mark.parametrize("kind", ["h5", "lmdb"])
def test_sizes_equal_maces_graphs_and_come_from_the_cache_next_time(sets, kind, tmp_path, caplog):
    """Each share of two ranks' worth read alone (as two ranks would) gives mace's own atoms and
    edges; a second read of the same files reads no structure (the log says so)."""
    _, make = sets[kind]
    dataset = make()
    want = mace_graphs(dataset)
    mace_sizes.tag(dataset, "train", DistInfo(), (str(tmp_path),))
    caplog.set_level(logging.INFO, logger="cfm_plugins.mace")
    atoms, edges = mace_sizes.local_sizes(dataset, np.arange(len(dataset)), need_edges=True)
    assert (atoms.tolist(), edges.tolist()) == want
    assert "counted with cfm::count_edges" in caplog.text
    assert list((tmp_path / cache.FOLDER).glob("*.npz"))
    caplog.clear()
    share = np.arange(1, len(dataset), 2)
    atoms, edges = mace_sizes.local_sizes(dataset, share, need_edges=True)
    assert atoms.tolist() == [want[0][i] for i in share]
    assert edges.tolist() == [want[1][i] for i in share]
    assert "from the sizes cache" in caplog.text and ", 0 read)" in caplog.text


def test_a_cache_cfm_plan_wrote_gives_the_edges_and_the_checks(sets, tmp_path, caplog):
    """``cfm-plan``'s cache (same folder, same key) of mace's HDF5 files holds the edges and the
    checks: training counts no edge and reads no structure."""
    from cfm_plugins.plan.sizes import read_sizes

    h5, make = sets["h5"]
    planned = read_sizes([(str(h5), "h5")], R_MAX, cache_dir=str(tmp_path), show_progress=False)
    for f in planned:
        assert cache.load(str(tmp_path), cache.key(f.path, "h5", R_MAX))["checks"] is not None
    dataset = make()
    mace_sizes.tag(dataset, "train", DistInfo(), (str(tmp_path),))
    caplog.set_level(logging.INFO, logger="cfm_plugins.mace")
    atoms, edges = mace_sizes.local_sizes(dataset, np.arange(len(dataset)), need_edges=True)
    assert (atoms.tolist(), edges.tolist()) == mace_graphs(dataset)
    assert "counted with" not in caplog.text and "edges of 3 file(s) from the sizes" in caplog.text
    assert ", 0 read)" in caplog.text and "checks of 3 file(s) from the sizes cache" in caplog.text


def test_a_cache_cfm_plan_wrote_names_a_bad_label_and_element(tmp_path):
    """The checks ``cfm-plan`` kept for an HDF5 file name a NaN label and an unknown element as a
    read of the file would, the file not being read again."""
    from mace.data.hdf5_dataset import HDF5Dataset
    from mace.tools.utils import AtomicNumberTable

    from cfm_plugins.plan.sizes import read_sizes
    from cfm_plugins_adapters.mace.data_checks import DataCheckError

    frames, _, _ = _frames(tmp_path, n_train=6, n_valid=1)
    frames[3].arrays["REF_forces"][1, 2] = np.nan
    frames[5].symbols[0] = "Au"
    path = write_h5(tmp_path / "bad", frames) / "part_0.h5"
    read_sizes([(str(path), "h5")], R_MAX, cache_dir=str(tmp_path), show_progress=False)
    entry = cache.load(str(tmp_path), cache.key(str(path), "h5", R_MAX))
    assert entry["checks"]["labels"] == {3: "forces not finite"}
    for known, want in (
        ([28, 29, 79], rf"structure 3 of {path}: forces not finite"),
        ([28, 29], rf"structure 5 of {path}: Au \(Z=79\)"),
    ):
        dataset = HDF5Dataset(str(path), r_max=R_MAX, z_table=AtomicNumberTable(known))
        mace_sizes.tag(dataset, "train", DistInfo(), (str(tmp_path),))
        dataset.file.close()  # not read again: the checks come from cfm-plan's entry
        with pytest.raises(DataCheckError, match=want):
            mace_sizes.local_sizes(dataset, np.arange(len(dataset)), need_edges=True)


def test_checks_come_from_the_cache_too(sets, tmp_path):
    """A NaN label and an unknown element found on the first read are found again from the cache
    (the file is not read again), named alike."""
    from mace.data.hdf5_dataset import HDF5Dataset
    from mace.tools.utils import AtomicNumberTable

    from cfm_plugins_adapters.mace.data_checks import DataCheckError

    frames, _, _ = _frames(tmp_path, n_train=6, n_valid=1)
    frames[4].info["REF_energy"] = np.inf
    frames[2].symbols[0] = "Au"
    folder = write_h5(tmp_path / "bad", frames)
    path = folder / "part_0.h5"
    for known in ([28, 29, 79], [28, 29, 79], [28, 29]):
        dataset = HDF5Dataset(str(path), r_max=R_MAX, z_table=AtomicNumberTable(known))
        mace_sizes.tag(dataset, "train", DistInfo(), (str(tmp_path),))
        want = (
            rf"structure 4 of {path}: energy not finite"
            if 79 in known
            else rf"structure 2 of {path}: Au \(Z=79\)"
        )
        with pytest.raises(DataCheckError, match=want):
            mace_sizes.local_sizes(dataset, np.arange(len(dataset)), need_edges=True)


def test_a_long_read_says_how_far_it_is(sets, tmp_path, caplog, monkeypatch):
    """A progress line while a read lasts (every PROGRESS_S seconds; 0 here: every chunk)."""
    _, make = sets["h5"]
    dataset = make()
    mace_sizes.tag(dataset, "valid", DistInfo(), ())
    monkeypatch.setattr(mace_sizes, "PROGRESS_S", 0.0)
    monkeypatch.setattr(mace_sizes, "CHUNK", 2)
    caplog.set_level(logging.INFO, logger="cfm_plugins.mace")
    mace_sizes.local_sizes(dataset, np.arange(len(dataset)), need_edges=True)
    assert "of this rank's 10 structures read" in caplog.text
