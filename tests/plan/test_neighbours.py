"""Edge counts (``cfm_plugins.plan.neighbours``): every backend gives mace's own count
(``mace.data.neighborhood.get_neighborhood``, the graphs mace trains on) on structures of every
kind: periodic in 0, 1, 2 or 3 directions, triclinic, cells smaller than the cutoff (many images),
clusters, one atom."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.plan import neighbours


def structures(seed=1, count=200):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        n = int(rng.integers(1, 50))
        pbc = rng.random(3) < 0.6
        cell = np.diag(rng.uniform(1.5, 12.0, 3))
        if k % 2:
            cell = cell + rng.normal(0, 1.2, (3, 3))  # triclinic
        pos = rng.random((n, 3)) @ cell + rng.normal(0, 4, (1, 3))  # not wrapped into the cell
        out.append((pos, cell, pbc))
    return out


def arrays(structs):
    pos = np.concatenate([s[0] for s in structs])
    off = np.concatenate([[0], np.cumsum([len(s[0]) for s in structs])])
    return pos, off, np.stack([s[1] for s in structs]), np.stack([s[2] for s in structs])


def mace_counts(structs, cutoff):
    from mace.data.neighborhood import get_neighborhood

    return np.array(
        [
            get_neighborhood(p, cutoff, tuple(bool(x) for x in b), c.copy())[0].shape[1]
            for p, c, b in structs
        ]
    )


def test_the_compiled_counter_is_built_where_the_library_is():
    from cfm_plugins.ops import _library

    if not _library.load("cpu"):
        pytest.skip(f"the compiled library is not loaded here: {_library.why_not_loaded('cpu')}")
    assert "cfm" in neighbours.available(), (
        "cfm_plugins/_C loads but has no cfm::count_edges: it was built before cuda/neighbours/ "
        "existed; rebuild it (pip install --no-build-isolation -e .)"
    )
    assert neighbours.backend() == "cfm"


@pytest.mark.parametrize("cutoff", [3.0, 5.0])
def test_every_backend_counts_what_mace_builds(cutoff):
    structs = structures()
    want = mace_counts(structs, cutoff)
    assert want.sum() > 0
    for name in neighbours.available():
        got = neighbours.count_edges(*arrays(structs), cutoff, name)
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_vesin_counts_alike():
    pytest.importorskip("vesin", reason="vesin is not installed (an optional counter)")
    structs = structures(seed=2, count=60)
    got = neighbours.count_edges(*arrays(structs), 4.0, "vesin")
    np.testing.assert_array_equal(got, mace_counts(structs, 4.0))


def test_a_dense_crystal_and_a_tiny_cell():
    from ase.build import bulk

    cu = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((3, 3, 3))  # 108 atoms
    one = bulk("Cu", "fcc", a=3.6)  # 1 atom, cell far smaller than the cutoff
    structs = [(a.positions, a.cell.array, a.pbc) for a in (cu, one)]
    for name in neighbours.available():
        got = neighbours.count_edges(*arrays(structs), 5.0, name)
        # fcc within 5 A: 12 + 6 + 24 + 12 neighbours (2.55, 3.6, 4.41, 5.09 A: the last is out)
        np.testing.assert_array_equal(got, [108 * 42, 42], err_msg=name)


def test_a_degenerate_periodic_cell_is_named_by_its_index():
    structs = structures(count=3)
    pos, off, cells, pbc = arrays(structs)
    cells[1] = 0.0
    pbc[1] = [True, False, False]
    for name in neighbours.available():
        with pytest.raises(neighbours.CountError) as err:
            neighbours.count_edges(pos, off, cells, pbc, 4.0, name)
        assert err.value.index == 1 and "cell" in str(err.value)


def test_an_unknown_or_missing_backend_is_refused():
    with pytest.raises(ValueError, match="expected one of"):
        neighbours.backend("nope")
    missing = [b for b in neighbours.BACKENDS if b not in neighbours.available()]
    for name in missing:
        with pytest.raises(RuntimeError, match="not available"):
            neighbours.backend(name)


def test_the_operator_passes_opcheck():
    """cfm::count_edges: schema, the Meta kernel's shape (fake tensors), no autograd needed."""
    import torch

    if "cfm" not in neighbours.available():
        pytest.skip("the compiled library is not loaded here (see the test above)")
    structs = structures(count=4)
    pos, off, cells, pbc = (torch.from_numpy(np.ascontiguousarray(x)) for x in arrays(structs))
    torch.library.opcheck(torch.ops.cfm.count_edges.default, (pos, off, cells, pbc, 4.0))
    bad = off.clone()
    bad[-1] += 1
    with pytest.raises(RuntimeError, match="offsets must run from 0"):
        torch.ops.cfm.count_edges(pos, bad, cells, pbc, 4.0)
