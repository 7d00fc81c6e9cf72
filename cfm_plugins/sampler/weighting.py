"""Loss weighting under token batching: scales that make an epoch's gradient the dataset mean.

Pure numpy (no torch import here), computed from the plan (a :class:`~.bins.Packing`), which
every rank knows before the epoch starts.

A trainer's loss averages each term over the batch: the energy term over its graphs, the forces
term over its atoms. With batches filled to a token budget the graph count varies from step to
step, so over an epoch large structures weigh more per graph in the energy term, and the forces
term becomes nearly uniform per atom where stock's weight per atom varies with the batch. Under
``loss_weighting=per_sample`` every batch's graph and atom terms are multiplied by the factors of
:func:`per_sample_scales` (a :class:`LossScale` per batch), so every graph and every atom weighs
the same over the epoch, as with stock batches. :func:`denominators` models the trainer's
reduction over ranks (``reduction``: ``"step"`` or ``"batch"``); :func:`epoch_weights` and
:func:`weight_spread` give each sample's weight over an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bins import Packing

LOSS_WEIGHTINGS = ("stock", "per_sample")
REDUCTIONS = ("step", "batch")


@dataclass(frozen=True)
class LossScale:
    """The factors of one batch: ``graphs`` for per-graph loss terms (energy, stress, virials),
    ``atoms`` for per-atom terms (forces)."""

    graphs: float
    atoms: float


def check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"reduction={reduction!r}: expected one of {', '.join(REDUCTIONS)} (how the trainer "
            "averages its loss: over the whole step on all ranks, or over each rank's batch)"
        )
    return reduction


def check_loss_weighting(weighting: str) -> str:
    if weighting not in LOSS_WEIGHTINGS:
        raise ValueError(
            f"loss_weighting={weighting!r}: expected one of {', '.join(LOSS_WEIGHTINGS)}"
        )
    return weighting


def _atoms(atoms, packing: Packing) -> np.ndarray:
    arr = np.asarray(atoms, dtype=np.float64)
    if arr.ndim != 1 or (len(packing.indices) and arr.size <= int(packing.indices.max())):
        raise ValueError(
            f"atoms has shape {arr.shape}: give one atom count per sample of the packed costs"
        )
    if np.any(arr[packing.indices] <= 0):
        i = int(packing.indices[np.flatnonzero(arr[packing.indices] <= 0)[0]])
        raise ValueError(
            f"sample {i} has {arr[i]:g} atoms: every packed sample needs at least one atom"
        )
    return arr


def denominators(packing: Packing, atoms, reduction: str = "step") -> np.ndarray:
    """``(num_bins, 2)``: what the trainer divides each bin's graph and atom terms by.

    ``"step"``: the graph and atom counts of the bin's step over all ranks; ``"batch"``: the
    bin's own counts times the world size (the rank's mean, then DDP's average over ranks).

    The two ways trainers reduce a loss over ranks (``reduction``):

    - ``"step"``: the mean over every element of the step, all ranks together (mace-torch >=
      0.3.10: ``reduce_loss`` divides each rank's sum by the global element count and multiplies
      by the world size; DDP then averages the gradients over the ranks; NequIP likewise). An
      element of step ``s`` weighs ``1 / D_s``, ``D_s`` the step's element count over all ranks.
    - ``"batch"``: the mean over the rank's own batch, then DDP's average over the ranks
      (HydraGNN, older mace). An element of the batch of rank ``r`` in step ``s`` weighs
      ``1 / (W * D_sr)``.

    Elements are graphs for graph terms (energy, stress, virials) and atoms for atom terms
    (forces).
    """
    check_reduction(reduction)
    atoms = _atoms(atoms, packing)
    w = packing.world_size
    counts = np.stack(
        [
            packing.bin_sizes().astype(np.float64),
            np.bincount(packing.bin_ids(), weights=atoms[packing.indices], minlength=len(packing)),
        ],
        axis=1,
    )
    if reduction == "batch":
        return counts * w
    per_step = counts.reshape(packing.num_steps(w), w, 2).sum(axis=1)
    return np.repeat(per_step, w, axis=0)


def per_sample_scales(packing: Packing, atoms, reduction: str = "step") -> np.ndarray:
    """``(num_bins, 2)`` factors ``[graphs, atoms]`` of every bin under
    ``loss_weighting=per_sample``.

    Every element of a bin is multiplied by ``c = D * S / T`` (``D`` the bin's denominator,
    :func:`denominators`, ``S`` the epoch's steps, ``T`` the elements of the epoch): each graph
    (atom) then weighs ``S / T`` per epoch, whatever batch and rank it lands in, which is stock's
    weight (``1 / (W * b)`` with ``S = T / (W * b)``) whenever stock's batches hold the same
    count. So the epoch's summed gradient is ``S`` times the dataset mean, as with stock batches:
    the learning rate keeps its meaning. A sample that appears in several bins (an evaluation plan
    of a set smaller than the ranks) is counted once per appearance, as the trainer sees it.
    """
    atoms = _atoms(atoms, packing)
    den = denominators(packing, atoms, reduction)
    steps = packing.num_steps(packing.world_size)
    totals = np.array([len(packing.indices), float(atoms[packing.indices].sum())])
    return den * (steps / totals)


def epoch_weights(
    packing: Packing, atoms, reduction: str = "step", scales=None
) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's total weight over the epoch in the graph terms and per atom in the atom terms.

    ``scales``: ``(num_bins, 2)`` factors applied to each bin (``None``: all 1, the trainer's own
    weighting). Returns ``(graph_weight, atom_weight)``, arrays over the samples of the costs
    (0 for a sample in no bin). Under :func:`per_sample_scales` both are constant over the packed
    samples (``S / T``); under stock weighting they show the bias of token batching (what the
    binpack plugin logs, and what the tests and ``docs/benchmarks.md`` measure).
    """
    atoms = _atoms(atoms, packing)
    den = denominators(packing, atoms, reduction)
    factors = np.ones_like(den) if scales is None else np.asarray(scales, dtype=np.float64)
    if factors.shape != den.shape:
        raise ValueError(
            f"scales has shape {factors.shape}, the packing has {len(packing)} bins: expected "
            f"{den.shape}"
        )
    per_bin = factors / den  # what one graph / one atom of the bin weighs
    n = len(atoms)
    bins = packing.bin_ids()
    graph_w = np.bincount(packing.indices, weights=per_bin[bins, 0], minlength=n)
    atom_w = np.bincount(packing.indices, weights=per_bin[bins, 1], minlength=n)
    return graph_w, atom_w


def weight_spread(packing: Packing, atoms, reduction: str = "step") -> tuple[float, float]:
    """``(graphs, atoms)``: max/min of the per-sample epoch weights under the trainer's own
    weighting (1.0: every graph, resp. atom, weighs the same; 20: some graph counts 20x another)."""
    g, a = epoch_weights(packing, atoms, reduction)
    idx = np.unique(packing.indices)
    return float(g[idx].max() / g[idx].min()), float(a[idx].max() / a[idx].min())
