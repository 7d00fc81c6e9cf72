"""The readers (``cfm_plugins.plan.readers`` through ``read_sizes``): each format gives the atoms
and edges, in the order, of the data set the trainer builds from the same files (mace's own
``HDF5Dataset``/``dataset_from_sharded_hdf5`` and ``LMDBDataset``, ASE's reader, PyG graphs)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from cfm_plugins.plan.readers import DataError, _xyz_estimate, count_hint, detect
from cfm_plugins.plan.sizes import read_sizes
from tests.helpers import BIN, clean_env

R_MAX = 4.0


@pytest.fixture(scope="module")
def frames():
    """CuNi cells and clusters of 1..72 atoms, periodic and not, two isolated-atom references."""
    from ase import Atoms
    from ase.build import bulk

    rng = np.random.default_rng(0)
    out = [
        Atoms("Cu", cell=[20, 20, 20], info={"config_type": "IsolatedAtom"}),
        Atoms("Ni", cell=[20, 20, 20], info={"config_type": "IsolatedAtom"}),
    ]
    for i in range(14):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((1 + i % 3, 1 + i % 2, 1 + (i // 3) % 2))
        a.rattle(0.05, seed=i)
        if i % 4 == 3:  # a cluster: no cell, not periodic
            a.pbc = False
            a.cell = np.zeros((3, 3))
        sym = np.array(a.get_chemical_symbols())
        sym[rng.random(len(a)) < 0.3] = "Ni"
        a.set_chemical_symbols(sym)
        a.info["REF_energy"] = -1.0 * len(a)
        out.append(a)
    return out


def mace_sizes(dataset):
    items = [dataset[i] for i in range(len(dataset))]
    return [int(d.num_nodes) for d in items], [int(d.edge_index.shape[1]) for d in items]


def flat(files):
    return (
        np.concatenate([f.atoms for f in files]).tolist(),
        np.concatenate([f.edges for f in files]).tolist(),
    )


def neighbour_counts(frames):
    from mace.data.neighborhood import get_neighborhood

    return [
        get_neighborhood(a.positions, R_MAX, tuple(bool(x) for x in a.pbc), a.cell.array.copy())[
            0
        ].shape[1]
        for a in frames
    ]


def test_xyz(frames, tmp_path):
    from ase.io import write

    write(tmp_path / "train.xyz", frames)
    assert detect(str(tmp_path / "train.xyz")) == "xyz"
    (f,) = read_sizes([(str(tmp_path / "train.xyz"), "xyz")], R_MAX, show_progress=False)
    assert f.atoms.tolist() == [len(a) for a in frames]
    assert f.edges.tolist() == neighbour_counts(frames)
    assert f.isolated.tolist() == [True, True] + [False] * (len(frames) - 2)
    assert not f.bad
    # the progress bar's total: exact for a small file, scaled from its start for a large one
    assert count_hint(str(tmp_path / "train.xyz"), "xyz")[0] == len(frames)
    estimate = _xyz_estimate(str(tmp_path / "train.xyz"), sample=20_000)
    assert len(frames) / 3 < estimate < 3 * len(frames)


def test_an_ase_database(frames, tmp_path):
    import ase.db

    path = tmp_path / "train.db"
    with ase.db.connect(path) as db:
        for a in frames:
            db.write(a, config_type=a.info.get("config_type", "Default"))
    assert detect(str(path)) == "db"
    (f,) = read_sizes([(str(path), "db")], R_MAX, show_progress=False)
    assert f.atoms.tolist() == [len(a) for a in frames]
    assert f.edges.tolist() == neighbour_counts(frames)
    assert f.isolated.sum() == 2


def _mace_h5(frames, path):
    """A mace HDF5 file written by mace's own writer (what mace_prepare_data writes per shard)."""
    import h5py
    from mace.data.utils import KeySpecification, config_from_atoms, save_configurations_as_HDF5

    keys = KeySpecification(info_keys={"energy": "REF_energy"}, arrays_keys={})
    configs = [config_from_atoms(a, key_specification=keys) for a in frames]
    with h5py.File(path, "w") as f:
        f.attrs["drop_last"] = False
        save_configurations_as_HDF5(configs, 0, f)


def test_mace_hdf5_a_file_and_a_folder_of_shards(frames, tmp_path):
    from mace.data.hdf5_dataset import HDF5Dataset, dataset_from_sharded_hdf5
    from mace.tools.utils import AtomicNumberTable

    z = AtomicNumberTable([28, 29])
    one = tmp_path / "one.h5"
    _mace_h5(frames, one)
    (f,) = read_sizes([(str(one), "h5")], R_MAX, show_progress=False)
    assert flat([f]) == mace_sizes(HDF5Dataset(str(one), r_max=R_MAX, z_table=z))
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, part in enumerate((frames[:5], frames[5:11], frames[11:])):
        _mace_h5(part, shards / f"train_{k}.h5")
    assert detect(str(shards)) == "h5"
    files = read_sizes([(str(shards), "h5")], R_MAX, show_progress=False)
    assert len(files) == 3
    want = mace_sizes(dataset_from_sharded_hdf5(str(shards), z_table=z, r_max=R_MAX))
    assert flat(files) == want  # mace's order of the shards too


def test_mace_prepare_data_output(frames, tmp_path):
    """The folder mace's own mace_prepare_data writes (2 processes: 2 shards)."""
    from ase.io import write
    from mace.data.hdf5_dataset import dataset_from_sharded_hdf5
    from mace.tools.utils import AtomicNumberTable

    write(tmp_path / "train.xyz", frames)
    res = subprocess.run(
        [
            str(BIN / "mace_prepare_data"),
            f"--train_file={tmp_path / 'train.xyz'}",
            "--valid_fraction=0.2",
            f"--h5_prefix={tmp_path}/h5/",
            f"--r_max={R_MAX}",
            "--num_process=2",
            "--energy_key=REF_energy",
            "--seed=1",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    folder = str(tmp_path / "h5" / "train")
    files = read_sizes([(folder, detect(folder))], R_MAX, show_progress=False)
    z = AtomicNumberTable([28, 29])
    want = mace_sizes(dataset_from_sharded_hdf5(folder, z_table=z, r_max=R_MAX))
    assert flat(files) == want and len(want[0]) > 0


def test_mace_lmdb_a_file_and_a_folder(frames, tmp_path):
    from mace.data.lmdb_dataset import LMDBDataset
    from mace.tools.fairchem_dataset.lmdb_dataset_tools import LMDBDatabase
    from mace.tools.utils import AtomicNumberTable

    folder = tmp_path / "train_lmdb"
    folder.mkdir()
    for name, part in (("a", frames[:7]), ("b", frames[7:])):
        db = LMDBDatabase(folder / f"{name}.aselmdb")
        for a in part:
            db.write(a, data={})  # mace's LMDBDatabase adds to ASE's shared default otherwise
        db.close()
    assert detect(str(folder)) == "lmdb" and detect(str(folder / "a.aselmdb")) == "lmdb"
    files = read_sizes([(str(folder), "lmdb")], R_MAX, show_progress=False)
    z = AtomicNumberTable([28, 29])
    assert flat(files) == mace_sizes(LMDBDataset(str(folder), r_max=R_MAX, z_table=z))
    assert not any(f.isolated.any() for f in files)  # mace trains on every LMDB row


def test_pyg_graphs_keep_their_own_edges(tmp_path):
    import torch
    from torch_geometric.data import Data

    graphs = [
        Data(x=torch.zeros(n, 1), edge_index=torch.zeros(2, 3 * n, dtype=torch.long), num_nodes=n)
        for n in (3, 7, 12)
    ]
    torch.save(graphs, tmp_path / "set.pt")
    (f,) = read_sizes([(str(tmp_path / "set.pt"), "pyg")], None, show_progress=False)
    assert f.atoms.tolist() == [3, 7, 12] and f.edges.tolist() == [9, 21, 36]


def test_a_sizes_file(tmp_path):
    np.savez(tmp_path / "s.npz", atoms=[3, 5], edges=[6, 20])
    (f,) = read_sizes([(str(tmp_path / "s.npz"), "sizes")], None, show_progress=False)
    assert f.atoms.tolist() == [3, 5] and f.edges.tolist() == [6, 20]
    np.savez(tmp_path / "bad.npz", natoms=[3])
    with pytest.raises(DataError, match="bad.npz.*'atoms'"):
        read_sizes([(str(tmp_path / "bad.npz"), "sizes")], None, show_progress=False)


def test_formats_are_told_by_name_or_refused_naming_the_path(tmp_path):
    for name, fmt in (("a.extxyz", "xyz"), ("b.hdf5", "h5"), ("c.pt", "pyg"), ("d.npz", "sizes")):
        (tmp_path / name).write_text("x")
        assert detect(str(tmp_path / name)) == fmt
    (tmp_path / "e.weird").write_text("what is this")
    with pytest.raises(DataError, match="e.weird.*--format"):
        detect(str(tmp_path / "e.weird"))
    os.mkdir(tmp_path / "empty")
    with pytest.raises(DataError, match="empty.*--format"):
        detect(str(tmp_path / "empty"))


def test_a_garbled_file_is_named(tmp_path):
    (tmp_path / "garbled.xyz").write_text("3\nno atoms follow\nCu 0 0\n")
    with pytest.raises(DataError, match="garbled.xyz"):
        read_sizes([(str(tmp_path / "garbled.xyz"), "xyz")], R_MAX, show_progress=False)
