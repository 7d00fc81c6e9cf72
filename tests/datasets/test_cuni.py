"""cfm_plugins.datasets.cuni: real EMT labels under MACE's keys, size diversity, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from ase.calculators.emt import EMT
from ase.io import read

from cfm_plugins.datasets import cuni


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuni")
    paths = cuni.make_dataset(out, n_train=40, n_valid=6, n_test=5, seed=3, max_atoms=300)
    return paths


def test_files_read_back_with_mace_keys(dataset):
    assert set(dataset) == {"train", "valid", "test", "cell512"}
    train = read(dataset["train"], index=":")
    assert len(train) == 40 + 2 and len(read(dataset["valid"], index=":")) == 6
    assert len(read(dataset["test"], index=":")) == 5
    iso = [a for a in train if a.info.get("config_type") == "IsolatedAtom"]
    assert sorted(a.get_chemical_symbols()[0] for a in iso) == ["Cu", "Ni"]
    assert all(len(a) == 1 and "REF_energy" in a.info for a in iso)
    for a in train:
        assert isinstance(a.info["REF_energy"], float)
        assert a.arrays["REF_forces"].shape == (len(a), 3)
        assert "energy" not in a.info and "forces" not in a.arrays  # names mace refuses
        assert ("REF_stress" in a.info) == bool(a.pbc.all())
        if a.pbc.all():
            assert np.shape(a.info["REF_stress"]) == (6,)


def test_kinds_and_sizes_span_small_to_large(dataset):
    frames = [
        a for a in read(dataset["train"], index=":") if a.info["config_type"] != "IsolatedAtom"
    ]
    sizes = np.array([len(a) for a in frames])
    assert sizes.min() <= 16 and sizes.max() >= 150 and sizes.max() <= 300
    assert len(np.unique(sizes)) >= 15
    kinds = {a.info["config_type"].split("_")[0].rstrip("0123456789") for a in frames}
    assert kinds == {"bulk", "slab", "cluster"}
    assert any(not a.pbc.any() for a in frames)  # clusters are not periodic
    assert any(a.pbc.tolist() == [True, True, False] for a in frames)  # slabs
    for a in frames:  # both elements occur overall
        assert set(a.get_chemical_symbols()) <= {"Cu", "Ni"}
    assert {"Cu", "Ni"} <= {s for a in frames for s in a.get_chemical_symbols()}


def test_labels_equal_emt_recomputed(dataset):
    frames = read(dataset["train"], index=":")[:14] + read(dataset["cell512"], index=":")
    for a in frames:
        ref_e, ref_f = a.info["REF_energy"], a.arrays["REF_forces"].copy()
        ref_s = a.info.get("REF_stress")
        a.calc = EMT()
        # positions are written with 8 decimals: allow for that rounding only
        assert abs(a.get_potential_energy() - ref_e) < 1e-5, a.info["config_type"]
        np.testing.assert_allclose(a.get_forces(), ref_f, atol=1e-5)
        if ref_s is not None:
            np.testing.assert_allclose(a.get_stress(voigt=True), ref_s, atol=1e-6)
    cell = read(dataset["cell512"])
    assert len(cell) == 512 and cell.pbc.all() and {"Cu", "Ni"} == set(cell.get_chemical_symbols())


def test_deterministic_for_a_seed():
    def fingerprint(frames):
        return [
            (a.get_chemical_formula(), a.positions.round(10).tobytes(), a.info["REF_energy"])
            for a in frames
        ]

    a = fingerprint(cuni.make_structures(12, seed=5, max_atoms=200))
    b = fingerprint(cuni.make_structures(12, seed=5, max_atoms=200))
    c = fingerprint(cuni.make_structures(12, seed=6, max_atoms=200))
    assert a == b
    assert a != c
