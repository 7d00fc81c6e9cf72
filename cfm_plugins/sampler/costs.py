"""Per-graph cost models for the packer: atoms, edges, or ``a*atoms + b*edges`` fitted on the model.

``calibrate_linear_cost`` times the user's own batch function (a training step, a forward
pass) on a few batches and fits ``time ~ a*atoms + b*edges`` by least squares (no intercept:
the fixed cost of a step is paid by every rank alike and does not unbalance them).
``fit_linear_cost`` fits step times already measured (e.g. a run's step logs), with an optional
intercept that keeps the fixed per-step cost out of ``a`` and ``b``. Both fits keep every
coefficient >= 0: the atoms and edges of batches are nearly collinear, and an unconstrained fit
can trade a negative weight on one count for a larger one on the other.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

log = logging.getLogger("cfm_plugins.sampler")

COST_KINDS = ("atoms", "edges", "linear")


def graph_costs(
    num_atoms, num_edges=None, kind: str = "atoms", a: float = 1.0, b: float = 0.0
) -> np.ndarray:
    """Cost of each graph as float64: ``atoms``, ``edges`` or ``linear`` (``a*atoms + b*edges``).

    A graph with atoms but no edges (a single atom, a molecule whose atoms are all farther apart
    than the cutoff) is a legal sample that trainers run: its edge-based cost is floored at one
    edge (``1`` for ``edges``, ``b`` for ``linear`` with ``a = 0``), so it is packed like any
    other graph instead of being refused for a zero cost. A graph without atoms keeps cost 0,
    which the packer refuses, naming it.
    """
    if kind not in COST_KINDS:
        raise ValueError(f"cost kind {kind!r}: expected one of {', '.join(COST_KINDS)}")
    atoms = np.asarray(num_atoms, dtype=np.float64)
    if atoms.ndim != 1:
        raise ValueError(f"num_atoms must be 1-D, got shape {atoms.shape}")
    edges = None
    if num_edges is not None:
        edges = np.asarray(num_edges, dtype=np.float64)
        if edges.shape != atoms.shape:
            raise ValueError(
                f"num_edges has {edges.shape[0]} entries but num_atoms has {atoms.shape[0]}"
            )
    if kind == "atoms":
        return atoms.copy()
    if edges is None and (kind == "edges" or b != 0.0):
        raise ValueError(
            f"cost kind {kind!r} needs num_edges (per-graph edge counts); the dataset gives none: "
            "use cost=atoms (or linear with cost_b=0), or give the graphs their edges"
        )
    if kind == "edges":
        return np.where((edges <= 0) & (atoms > 0), 1.0, edges)
    if not (math.isfinite(a) and math.isfinite(b)) or a < 0 or b < 0 or a + b <= 0:
        raise ValueError(f"linear cost needs finite a, b >= 0, not both 0 (got a={a}, b={b})")
    out = a * atoms
    if b:
        out += b * np.where((edges <= 0) & (atoms > 0) & (a == 0), 1.0, edges)
    return out


class LinearCostFit(tuple):
    """``(a, b)`` of ``time ~ c0 + a*atoms + b*edges [+ g*graphs]``; also ``.c0`` (0 without an
    intercept), ``.g`` (0 without graph counts), ``.r2``, ``.times``, ``.predicted``."""

    def __new__(cls, a, b, r2, times, predicted, c0=0.0, g=0.0):
        self = super().__new__(cls, (float(a), float(b)))
        self.r2, self.times, self.predicted = float(r2), np.asarray(times), np.asarray(predicted)
        self.c0, self.g = float(c0), float(g)
        return self

    a = property(lambda self: self[0])
    b = property(lambda self: self[1])

    def __repr__(self):
        c0 = f"c0={self.c0:.4g}, " if self.c0 else ""
        g = f", g={self.g:.4g}" if self.g else ""
        return f"LinearCostFit({c0}a={self[0]:.4g}, b={self[1]:.4g}{g}, r2={self.r2:.4f})"


def _fit_nonneg(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares ``y ~ x @ coef`` with ``coef >= 0``, exactly: the best unconstrained fit on
    each subset of the (few) columns whose coefficients all come out >= 0."""
    n = x.shape[1]
    best, best_err = np.zeros(n), float(np.sum(y**2))
    for mask in range(1, 2**n):
        cols = [j for j in range(n) if mask >> j & 1]
        sub, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if np.any(sub < 0):
            continue
        coef = np.zeros(n)
        coef[cols] = sub
        err = float(np.sum((x @ coef - y) ** 2))
        if err < best_err - 1e-12 * best_err:
            best, best_err = coef, err
    return best


def fit_counts(
    counts, times, intercept: bool = False
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """Non-negative least squares of ``times ~ c0 + sum_k coef_k * counts[k]``.

    ``counts``: a list of 1-D arrays (atoms, edges, graphs, ... of each timed batch), one per
    coefficient. Returns ``(coef, c0, predicted, r2)``, every coefficient and ``c0`` >= 0 (``c0``
    is 0 without ``intercept``). The columns are scaled to unit mean before the fit so that no
    count is favoured by its magnitude.
    """
    t = np.asarray(times, dtype=np.float64)
    cols = [np.asarray(c, dtype=np.float64) for c in counts] + (
        [np.ones_like(t)] if intercept else []
    )
    if t.ndim != 1 or any(c.shape != t.shape for c in cols):
        raise ValueError(
            f"fit_counts needs 1-D counts and times of one length (got shapes "
            f"{[c.shape for c in cols]} and {t.shape})"
        )
    if len(t) < len(cols):
        raise ValueError(
            f"a fit of {len(cols)} coefficients needs at least {len(cols)} timed batches, got "
            f"{len(t)}"
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("the times hold NaN or inf")
    x = np.stack(cols, axis=1)
    scale = np.abs(x).mean(axis=0)
    scale[scale == 0] = 1.0
    coef = _fit_nonneg(x / scale, t) / scale
    pred = x @ coef
    ss_res = float(np.sum((t - pred) ** 2))
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 0.0
    n = len(counts)
    return coef[:n], float(coef[n]) if intercept else 0.0, pred, r2


def fit_linear_cost(
    num_atoms, num_edges, times, intercept: bool = False, num_graphs=None
) -> LinearCostFit:
    """Fit ``times ~ c0 + a*atoms + b*edges [+ g*graphs]`` (``c0`` only with ``intercept``), all >=
    0.

    ``num_atoms``, ``num_edges`` (and ``num_graphs``): totals of each measured batch; ``times``:
    its measured time. ``g`` (on the result) is the cost of a graph beyond its atoms and edges
    (per-graph readout, padding of the batch); 0 without ``num_graphs``.
    """
    atoms = np.asarray(num_atoms, dtype=np.float64)
    edges = np.asarray(num_edges, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if not (atoms.ndim == edges.ndim == t.ndim == 1 and len(atoms) == len(edges) == len(t)):
        raise ValueError(
            f"fit_linear_cost needs 1-D atoms, edges and times of one length "
            f"(got shapes {atoms.shape}, {edges.shape}, {t.shape})"
        )
    counts = [atoms, edges] + ([num_graphs] if num_graphs is not None else [])
    if len(t) < len(counts) + intercept:
        raise ValueError(
            f"fit_linear_cost needs at least {len(counts) + intercept} timed batches, got {len(t)}"
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("fit_linear_cost: the times hold NaN or inf")
    coef, c0, pred, r2 = fit_counts(counts, t, intercept)
    return LinearCostFit(
        coef[0], coef[1], r2, t, pred, c0=c0, g=coef[2] if num_graphs is not None else 0.0
    )


def calibrate_linear_cost(
    run_batch: Callable[[object], object],
    batches: Sequence,
    num_atoms,
    num_edges,
    repeats: int = 3,
    warmup: int = 1,
    normalize: bool = False,
) -> LinearCostFit:
    """Fit ``time ~ a*atoms + b*edges`` from timings of ``run_batch(batch)`` on ``batches``.

    Args:
        run_batch: called with each batch; must finish its work before returning (synchronize
            the device inside it on GPUs).
        batches: a few batches of different sizes and mixes (at least 2; a dozen is better).
        num_atoms, num_edges: the total atoms and edges of each batch.
        repeats: timings per batch; the minimum is used (the least disturbed one).
        warmup: untimed calls of the first batch first (allocation, lazy initialisation).
        normalize: return ``(1, b/a)`` so costs stay in atom units (the capacity stays in atoms).

    Returns a :class:`LinearCostFit`, unpacking as ``(a, b)``, with ``r2`` (coefficient of
    determination of the fit, logged) and the measured ``times``.
    """
    atoms = np.asarray(num_atoms, dtype=np.float64)
    edges = np.asarray(num_edges, dtype=np.float64)
    if len(batches) < 2 or len(atoms) != len(batches) or len(edges) != len(batches):
        raise ValueError(
            f"calibrate_linear_cost needs >= 2 batches with one atom and one edge total each "
            f"(got {len(batches)} batches, {len(atoms)} atom and {len(edges)} edge totals)"
        )
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        run_batch(batches[0])
    times = np.empty(len(batches))
    for i, batch in enumerate(batches):
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            run_batch(batch)
            best = min(best, time.perf_counter() - t0)
        times[i] = best
    fit = fit_linear_cost(atoms, edges, times)
    a, b = fit
    log.info(
        "cost calibration on %d batches: time ~ %.4g*atoms + %.4g*edges (R^2 = %.3f)",
        len(batches),
        a,
        b,
        fit.r2,
    )
    if not normalize:
        return fit
    if a <= 0:
        raise ValueError(
            "calibrate_linear_cost(normalize=True): the fitted atom coefficient is 0; "
            "use normalize=False or batches with more varied atom counts"
        )
    return LinearCostFit(1.0, b / a, fit.r2, times, fit.predicted)
