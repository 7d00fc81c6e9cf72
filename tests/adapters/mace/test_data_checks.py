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
