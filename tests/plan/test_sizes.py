"""Checks of every structure (``cfm_plugins.plan.sizes``): what cannot be trained on is named by
file and index and kept out of the counts; the progress bar."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.plan.readers import Block, DataError
from cfm_plugins.plan.sizes import Progress, check_block, read_sizes


@pytest.fixture()
def bad_xyz(tmp_path):
    from ase import Atoms
    from ase.io import write

    good = Atoms("Cu2", positions=[[0, 0, 0], [1.5, 1.5, 0]], cell=[4, 4, 4], pbc=True)
    frames = [
        good,
        Atoms("Cu2", positions=[[0, 0, 0], [1, 1, np.nan]]),  # 1: non-finite
        Atoms(),  # 2: no atoms
        Atoms("Cu", pbc=True),  # 3: periodic, no cell
        good,
    ]
    path = tmp_path / "bad.xyz"
    write(path, frames)
    return path


def test_bad_structures_are_named_by_index_and_not_counted(bad_xyz):
    (f,) = read_sizes([(str(bad_xyz), "xyz")], 4.0, show_progress=False)
    assert sorted(f.bad) == [1, 2, 3]
    assert "non-finite position (atom 1)" in f.bad[1]
    assert "no atoms" in f.bad[2]
    assert "no cell given" in f.bad[3]
    assert f.edges[[1, 2, 3]].tolist() == [-1, -1, -1]
    assert f.edges[0] == f.edges[4] > 0


def test_check_block_degenerate_cell():
    block = Block(
        10,
        np.array([1, 1]),
        np.zeros((2, 3)),
        np.array([np.eye(3), [[1, 0, 0], [2, 0, 0], [0, 0, 1]]], dtype=float),
        np.ones((2, 3), bool),
    )
    bad = check_block(block)
    assert list(bad) == [11] and "degenerate" in bad[11]


def test_a_cell_far_thinner_than_the_cutoff_is_named(tmp_path):
    from ase import Atoms
    from ase.io import write

    write(tmp_path / "thin.xyz", [Atoms("Cu", cell=[1e-3, 1e-3, 1e-3], pbc=True)])
    (f,) = read_sizes([(str(tmp_path / "thin.xyz"), "xyz")], 5.0, show_progress=False)
    assert list(f.bad) == [0] and "images" in f.bad[0]


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="nothere.xyz: no such file"):
        read_sizes([(str(tmp_path / "nothere.xyz"), "xyz")], 4.0, show_progress=False)


def test_progress_shows_rate_and_time_left(capsys):
    bar = Progress(100, enabled=True)
    for _ in range(4):
        bar.update(25)
    bar.close()
    err = capsys.readouterr().err
    assert "100/100" in err and "structures/s" in err.replace(" structures/s", "structures/s")
