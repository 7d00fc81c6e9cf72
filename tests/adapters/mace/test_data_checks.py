"""What mace_run_train would train on, checked before it trains: structures numbered by their
place in the user's file (through mace's random split and its isolated atoms), labels that are
not finite, elements the model does not know. Real mace-torch functions and short real
mace_run_train runs that stop at start."""

from __future__ import annotations

import numpy as np
import pytest
from ase.io import read, write

from tests.helpers.mace_runs import make_tiny_set, run_tiny


def test_structures_are_numbered_by_their_place_in_the_file(tmp_path, monkeypatch):
    """mace's own loader (get_dataset_from_xyz) with --valid_fraction: its random split and the
    isolated atoms it takes out shift the order; every configuration still carries its file and
    index, which point at the frame it was made from."""
    import mace.data.utils as mace_data_utils
    from mace.data import KeySpecification, update_keyspec_from_kwargs
    from mace.tools.scripts_utils import get_dataset_from_xyz

    from cfm_plugins_adapters.mace.data_checks import Sources

    make_tiny_set(tmp_path, n_train=12, n_valid=3)  # train.xyz: 2 isolated atoms, then 12 cells
    sources = Sources()
    monkeypatch.setattr(mace_data_utils, "ase", sources.ase_proxy(mace_data_utils.ase))
    monkeypatch.setattr(
        mace_data_utils,
        "config_from_atoms_list",
        sources.wrap_configs(mace_data_utils.config_from_atoms_list),
    )
    keys = update_keyspec_from_kwargs(
        KeySpecification.from_defaults(),
        {"energy_key": "REF_energy", "forces_key": "REF_forces", "stress_key": "REF_stress"},
    )
    collections, e0s = get_dataset_from_xyz(
        work_dir=str(tmp_path),
        train_path=str(tmp_path / "train.xyz"),
        valid_path=None,
        valid_fraction=0.3,
        key_specification=keys,
        test_path=str(tmp_path / "valid.xyz"),
        seed=3,
    )
    assert sorted(e0s) == [28, 29]  # the isolated atoms are out of the configurations
    frames = {name: read(tmp_path / name, index=":") for name in ("train.xyz", "valid.xyz")}
    configs = collections.train + collections.valid + collections.tests[0][1]
    assert len(configs) == 12 + 3
    seen = set()
    for config in configs:
        path, index = config._cfm_source
        frame = frames[path.rsplit("/", 1)[1]][index]
        np.testing.assert_array_equal(frame.positions, config.positions)
        seen.add((path, index))
    assert len(seen) == len(configs)
    train_idx = sorted(i for p, i in seen if p.endswith("train.xyz"))
    assert train_idx == list(range(2, 14))  # 0 and 1 are the isolated atoms


def test_mace_run_train_stops_at_start_on_a_nan_force_naming_file_and_index(tmp_path):
    """A NaN force in the training file: mace alone trains to NaN (its force scale reads it) and
    saves a NaN model, exit status 0. Under cfm-run: stopped before training, naming the file,
    the structure and the property; a NaN energy in the validation file is a warning naming it."""
    make_tiny_set(tmp_path, n_train=8, n_valid=3)
    frames = read(tmp_path / "train.xyz", index=":")
    frames[5].arrays["REF_forces"][1, 0] = np.nan
    write(tmp_path / "train.xyz", frames)
    valid = read(tmp_path / "valid.xyz", index=":")
    valid[2].info["REF_energy"] = np.inf
    write(tmp_path / "valid.xyz", valid)

    out = run_tiny(tmp_path, "mace")
    assert out.returncode != 0, out.stdout[-3000:]
    train, vfile = tmp_path / "train.xyz", tmp_path / "valid.xyz"
    bad = f"1 training structure(s) hold values that are not finite: structure 5 of {train}: "
    assert bad + "forces not finite" in out.stdout, out.stdout[-3000:]
    assert f"structure 2 of {vfile}: energy not finite" in out.stdout
    assert "validation metrics, and mace's choice of the best epoch" in out.stdout
    assert "Started training" not in out.stdout
    assert not list(tmp_path.glob("*.model")) and not (tmp_path / "checkpoints").exists()


def test_mace_run_train_stops_at_start_on_an_element_the_model_does_not_know(tmp_path):
    """Gold in the test file of a CuNi set: mace alone trains, then fails with `79 is not in
    list` and leaves no final model. Under cfm-run: stopped at start, naming the file, the
    structure, the element and what to do."""
    make_tiny_set(tmp_path, n_train=6, n_valid=2)
    test = read(tmp_path / "valid.xyz", index=":")
    symbols = test[1].get_chemical_symbols()
    symbols[2] = "Au"
    test[1].set_chemical_symbols(symbols)
    write(tmp_path / "test.xyz", test)

    out = run_tiny(tmp_path, "mace", extra=[f"--test_file={tmp_path / 'test.xyz'}"])
    assert out.returncode != 0, out.stdout[-3000:]
    assert f"structure 1 of {tmp_path / 'test.xyz'}: Au (Z=79)" in out.stdout, out.stdout[-3000:]
    assert "its atomic numbers are Ni (28), Cu (29)" in out.stdout
    assert "add 79 to --atomic_numbers" in out.stdout and "Remove these structures" in out.stdout
    assert "Started training" not in out.stdout
    assert "is not in list" not in out.stdout


def test_elements_of_test_dir_hdf5_files_are_checked(tmp_path):
    """--test_dir holds HDF5 files of mace's preprocess_data, read after training: their atomic
    numbers are read at start (nothing else) and a structure with an unknown element is named
    by its index in mace's HDF5 dataset."""
    import h5py
    from mace.data import KeySpecification
    from mace.data.utils import config_from_atoms_list, save_configurations_as_HDF5

    from cfm_plugins_adapters.mace.data_checks import check_elements, hdf5_unknown_elements

    make_tiny_set(tmp_path, n_train=2, n_valid=4)
    frames = read(tmp_path / "valid.xyz", index=":")
    frames[3].symbols[0] = "Au"
    configs = config_from_atoms_list(frames, key_specification=KeySpecification())
    folder = tmp_path / "tests"
    folder.mkdir()
    with h5py.File(folder / "gold_test.h5", "w") as h5:
        save_configurations_as_HDF5(configs, 0, h5)
    path = str(folder / "gold_test.h5")
    assert hdf5_unknown_elements(path, {28, 29}) == [((path, 3), [79])]
    with pytest.raises(ValueError, match=rf"structure 3 of {path}: Au \(Z=79\)"):
        check_elements([], [28, 29], test_dir=str(folder))
    check_elements([], [28, 29, 79], test_dir=str(folder))  # known: nothing to say


# ------------------------------------------------------------- HDF5 and LMDB (read lazily by mace)
# mace reads these files one structure at a time while it trains; the data checks happen where
# binpack's loaders read their sizes (each rank its share), see adapters/mace/sizes.py.

KEYS = {"energy": "REF_energy", "stress": "REF_stress"}


def _frames(folder, n_train, n_valid):
    """The tiny CuNi set's frames (no isolated atoms) and mace's E0s for them (from those)."""
    make_tiny_set(folder, n_train=n_train, n_valid=n_valid)
    train = read(folder / "train.xyz", index=":")
    e0s = {int(a.numbers[0]): float(a.info["REF_energy"]) for a in train[:2]}
    return train[2:], read(folder / "valid.xyz", index=":"), e0s


def write_h5(folder, frames, shards=1):
    """A folder of mace HDF5 shards, written by mace's own writer (as mace_prepare_data does)."""
    import h5py
    from mace.data import KeySpecification
    from mace.data.utils import config_from_atoms_list, save_configurations_as_HDF5

    keys = KeySpecification(info_keys=dict(KEYS), arrays_keys={"forces": "REF_forces"})
    folder.mkdir(parents=True)
    parts = np.array_split(np.arange(len(frames)), shards)
    for k, idx in enumerate(parts):
        configs = config_from_atoms_list([frames[i] for i in idx], key_specification=keys)
        with h5py.File(folder / f"part_{k}.h5", "w") as h5:
            h5.attrs["drop_last"] = False
            save_configurations_as_HDF5(configs, 0, h5)
    return folder


def write_lmdb(folder, frames):
    """A folder of mace's LMDB (fairchem's ASE-LMDB) with the labels as a calculator's results."""
    from ase.calculators.singlepoint import SinglePointCalculator
    from mace.tools.fairchem_dataset.lmdb_dataset_tools import LMDBDatabase

    folder.mkdir(parents=True)
    db = LMDBDatabase(folder / "data.aselmdb")
    for a in frames:
        b = a.copy()
        b.calc = SinglePointCalculator(
            b,
            energy=a.info["REF_energy"],
            forces=a.arrays["REF_forces"],
            stress=a.info["REF_stress"],
        )
        db.write(b, data={})  # mace's LMDBDatabase adds to ASE's shared default `data` otherwise
    db.close()
    return folder


def lazy_args(folder, train, valid, e0s, name="lazy"):
    """tiny_args for data that mace reads lazily: its files, E0s and atomic numbers given."""
    from tests.helpers.mace_runs import tiny_args

    drop = ("--train_file", "--valid_file", "--E0s", "--energy_key", "--forces_key", "--stress_key")
    return [a for a in tiny_args(folder, name, epochs=1) if not a.startswith(drop)] + [
        f"--train_file={train}",
        f"--valid_file={valid}",
        f"--E0s={e0s}",
        f"--atomic_numbers={sorted(e0s)}",
    ]


def run_lazy(folder, args):
    """``mpirun -np 2 cfm-run --enable mace,binpack -o cost=edges -- mace_run_train ARGS`` in
    ``folder``."""
    from tests.helpers import run_mpi
    from tests.helpers.mace_runs import CFM_RUN

    cmd = [CFM_RUN, "--enable", "mace,binpack", "-o", "cost=edges", "--", "mace_run_train", *args]
    return run_mpi(cmd, timeout=570, cwd=folder)


def _cached_edges(folder, path, r_max=4.0):
    """The edges the sizes cache in ``folder`` holds for the file ``path``."""
    from cfm_plugins.plan import cache

    hit = cache.load(str(folder), cache.key(str(path), "h5", r_max))
    assert hit is not None and hit["checks"] is not None, f"no cache entry for {path}"
    return hit["edges"].tolist()


def test_mace_run_train_mpirun_nan_in_an_hdf5_shard_stops_at_start(tmp_path):
    """A NaN energy in the second HDF5 shard of the training folder, on 2 ranks: mace alone meets
    it at its statistics or at step 1; under cfm-run every rank stops at start, before training,
    and the message (said once) names the shard and the structure's index in it."""
    frames, valid, e0s = _frames(tmp_path, n_train=12, n_valid=4)
    frames[9].info["REF_energy"] = np.nan  # shard part_1.h5 holds structures 6..11: its 3rd
    train = write_h5(tmp_path / "h5" / "train", frames, shards=2)
    vfolder = write_h5(tmp_path / "h5" / "valid", valid)
    out = run_lazy(tmp_path, lazy_args(tmp_path, train, vfolder, e0s))
    assert out.returncode != 0, out.stdout[-3000:]
    want = f"structure 3 of {train / 'part_1.h5'}: energy not finite"
    assert out.stdout.count(want) == 1, out.stdout[-3000:]
    assert "1 training structure(s) hold values that are not finite" in out.stdout
    assert "Started training" not in out.stdout
    assert not (tmp_path / "checkpoints").exists()


def test_mace_run_train_mpirun_nan_in_lmdb_stops_at_start(tmp_path):
    """A NaN force in mace's LMDB training data, on 2 ranks: stopped at start, naming the database
    file, the structure's index in it and its LMDB row id (the key). (A NaN energy does not reach
    mace from LMDB: the database stores it as null, a missing energy.)"""
    frames, valid, e0s = _frames(tmp_path, n_train=10, n_valid=4)
    frames[6].arrays["REF_forces"][2, 1] = np.nan
    train = write_lmdb(tmp_path / "train_lmdb", frames)
    vfolder = write_lmdb(tmp_path / "valid_lmdb", valid)
    out = run_lazy(tmp_path, lazy_args(tmp_path, train, vfolder, e0s))
    assert out.returncode != 0, out.stdout[-3000:]
    want = f"structure 6 of {train / 'data.aselmdb'}: forces not finite (LMDB row id 7)"
    assert out.stdout.count(want) == 1, out.stdout[-3000:]
    assert "Started training" not in out.stdout


def test_mace_run_train_mpirun_hdf5_edges_are_maces_and_cached(tmp_path):
    """A 2-rank binpack run (cost=edges) on a sharded HDF5 set: the edge counts it uses (kept in
    the sizes cache it writes) are those of mace's own graphs; a second run reads them from the
    cache, and stops at start on gold in its validation data (an element the model does not
    know), naming the file and the index."""
    from mace.data.hdf5_dataset import dataset_from_sharded_hdf5
    from mace.tools.utils import AtomicNumberTable

    frames, valid, e0s = _frames(tmp_path, n_train=12, n_valid=4)
    train = write_h5(tmp_path / "h5" / "train", frames, shards=2)
    vfolder = write_h5(tmp_path / "h5" / "valid", valid)
    args = lazy_args(tmp_path, train, vfolder, e0s)
    first = run_lazy(tmp_path, args)
    assert first.returncode == 0, first.stdout[-3000:]
    assert "sizes of the train data (2 file(s)" in first.stdout
    assert "edges of 2 file(s) counted with cfm::count_edges" in first.stdout
    dataset = dataset_from_sharded_hdf5(str(train), z_table=AtomicNumberTable([28, 29]), r_max=4.0)
    for leaf in dataset.datasets:
        mace_edges = [int(leaf[i].edge_index.shape[1]) for i in range(len(leaf))]
        assert _cached_edges(tmp_path, leaf.file_path) == mace_edges

    gold = [a.copy() for a in valid]
    gold[2].symbols[1] = "Au"
    bad_valid = write_h5(tmp_path / "h5" / "gold_valid", gold)
    second = run_lazy(tmp_path, lazy_args(tmp_path, train, bad_valid, e0s))
    assert second.returncode != 0, second.stdout[-3000:]
    line = next(x for x in second.stdout.splitlines() if "sizes of the train data" in x)
    assert "edges of 2 file(s) from the sizes cache" in line and ", 0 read)" in line, line
    want = f"structure 2 of {bad_valid / 'part_0.h5'}: Au (Z=79)"
    assert second.stdout.count(want) == 1, second.stdout[-3000:]
    assert "Started training" not in second.stdout
