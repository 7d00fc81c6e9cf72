"""Edge counts of many structures at one cutoff: compiled, never a Python loop over pairs.

The count of a structure is the number of ordered atom pairs ``(i, j)`` closer than the cutoff,
periodic images included, an atom's pair with itself left out but its pairs with its own images
counted: the edge count of mace's graphs (matscipy's neighbour list less the zero-shift self
pairs), of vesin's full list and of NequIP's. Along a non-periodic direction there are no
images (mace stretches the cell there; the same pairs).

Backends (:data:`BACKENDS`; :func:`backend` picks the first there): ``cfm``, our operator
``cfm::count_edges`` (``cuda/neighbours/``, in the compiled library: a cell list that counts pairs
without listing them); ``vesin`` (``pip install vesin``; it lists every pair); ``matscipy``, mace's
own neighbour list (their speeds: docs/benchmarks.md). All three give the same counts
(``tests/plan/test_neighbours.py``); a pair within about 1e-15 of the cutoff may count on one side
in one library and on the other in another.
"""

from __future__ import annotations

import numpy as np

#: the backends in the order they are tried
BACKENDS = ("cfm", "vesin", "matscipy")

_CODES = {
    -1: "its periodic cell vectors span no volume (a cell of zero length along a periodic "
    "direction, or two parallel ones)",
    -2: "its periodic cell is so much thinner than the cutoff that more than 50 million images "
    "would be needed",
}


class CountError(ValueError):
    """A structure whose edges cannot be counted; ``index`` is its position in the batch."""

    def __init__(self, index: int, why: str):
        super().__init__(why)
        self.index = int(index)


def _cfm_op():
    try:
        import torch

        from cfm_plugins.ops import _library
    except ImportError:
        return None
    if not _library.load("cpu"):
        return None
    try:
        return torch.ops.cfm.count_edges
    except (AttributeError, RuntimeError):  # a library built before the operator existed
        return None


def available() -> list[str]:
    """The backends that can count here, in the order they are tried."""
    out = []
    if _cfm_op() is not None:
        out.append("cfm")
    for name in ("vesin", "matscipy"):
        try:
            __import__(name)
            out.append(name)
        except ImportError:
            pass
    return out


def backend(name: str | None = None) -> str:
    """The backend to use: ``name`` if given (it must be available), else the first available.

    Raises:
        RuntimeError: none is available (the message says what to install).
    """
    have = available()
    if name is not None:
        if name not in BACKENDS:
            raise ValueError(f"neighbour counter {name!r}: expected one of {', '.join(BACKENDS)}")
        if name not in have:
            raise RuntimeError(
                f"neighbour counter {name!r} is not available here (available: "
                f"{', '.join(have) or 'none'})"
            )
        return name
    if not have:
        raise RuntimeError(
            "no neighbour counter is available: build cfm-plugins' compiled library "
            "(`pip install --no-build-isolation -e .` with torch installed), or `pip install "
            "vesin` (or matscipy)"
        )
    return have[0]


def count_edges(positions, offsets, cells, pbc, cutoff: float, name: str | None = None):
    """Edge counts of structures ``s = 0..S-1`` at ``cutoff``.

    Args:
        positions: ``[N, 3]`` Cartesian positions of every structure's atoms, one after another.
        offsets: ``S + 1`` offsets: structure ``s`` holds atoms ``offsets[s]:offsets[s+1]``.
        cells: ``[S, 3, 3]`` cells, row ``k`` the lattice vector ``k`` (read only along periodic
            directions).
        pbc: ``[S, 3]`` periodic directions.
        cutoff: the radius (> 0).
        name: the backend (default: the first available, see :data:`BACKENDS`).

    Returns:
        ``int64[S]``.

    Raises:
        CountError: a structure whose edges cannot be counted (degenerate periodic cell, or far
            too many images), with its index.
    """
    pos = np.ascontiguousarray(positions, dtype=np.float64).reshape(-1, 3)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    cell = np.ascontiguousarray(cells, dtype=np.float64).reshape(-1, 3, 3)
    per = np.ascontiguousarray(pbc, dtype=bool).reshape(-1, 3)
    if not (np.isfinite(cutoff) and cutoff > 0):
        raise ValueError(f"the cutoff must be > 0, got {cutoff!r}")
    use = backend(name)
    if use == "cfm":
        import torch

        out = (
            _cfm_op()(
                torch.from_numpy(pos),
                torch.from_numpy(off),
                torch.from_numpy(cell),
                torch.from_numpy(per),
                float(cutoff),
            )
            .numpy()
            .copy()
        )
        bad = np.flatnonzero(out < 0)
        if len(bad):
            raise CountError(int(bad[0]), _CODES.get(int(out[bad[0]]), "it cannot be counted"))
        return out
    counter = _vesin(cutoff) if use == "vesin" else _matscipy(cutoff)
    out = np.empty(len(off) - 1, dtype=np.int64)
    for s in range(len(out)):
        p, c, b = pos[off[s] : off[s + 1]], cell[s], per[s]
        if b.any() and _degenerate(c, b):
            raise CountError(s, _CODES[-1])
        out[s] = counter(p, c, b)
    return out


def _basis(cell, pbc):
    """The periodic rows of ``cell``, completed by unit vectors normal to them (as the operator);
    rows of zeros where the periodic rows leave no normal (a degenerate cell)."""
    a = np.where(pbc[:, None], cell, np.eye(3)).astype(np.float64)
    idx = np.flatnonzero(pbc)
    free = np.flatnonzero(~pbc)

    def unit(v):
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 and np.isfinite(norm) else np.zeros(3)

    if len(idx) == 2:
        a[free[0]] = unit(np.cross(a[idx[0]], a[idx[1]]))
    elif len(idx) == 1:
        u = unit(a[idx[0]])
        t = np.array([0.0, 1.0, 0.0]) if abs(u[0]) > 0.9 else np.array([1.0, 0.0, 0.0])
        v = unit(np.cross(u, t))
        a[free[0]], a[free[1]] = v, np.cross(u, v)
    return a


def _degenerate(cell, pbc) -> bool:
    a = _basis(cell, pbc)
    if not np.isfinite(a).all():
        return True
    scale = float(np.prod(np.linalg.norm(a, axis=1)))
    return not abs(float(np.linalg.det(a))) > 1e-12 * scale


def _vesin(cutoff):
    from vesin import NeighborList

    nl = NeighborList(cutoff=float(cutoff), full_list=True)

    def count(p, c, b):
        if not b.any():
            c = np.zeros((3, 3))
        elif not b.all():
            c = _basis(c, b)
        (i,) = nl.compute(p, c, b, quantities="i", copy=False)
        return len(i)

    return count


def _matscipy(cutoff):
    from matscipy.neighbours import neighbour_list

    def count(p, c, b):
        c = _basis(c, b).copy()
        if not b.all():  # mace's way: the cell stretched far beyond the atoms where not periodic
            far = (np.abs(p).max(initial=0.0) + 1.0) * 5.0 * cutoff
            for k in np.flatnonzero(~b):
                c[k] *= far
        i, j, s = neighbour_list("ijS", positions=p, cell=c, pbc=b, cutoff=float(cutoff))
        return int(len(i) - np.count_nonzero((i == j) & ~s.any(axis=1)))

    return count
