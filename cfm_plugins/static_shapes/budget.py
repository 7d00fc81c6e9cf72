"""Budgets of padded batches: how many atoms, edges and graphs every batch of a loader is padded to.

Pure numpy (no torch here), like the packer whose plans it reads.

A bin-packed batch holds at most ``capacity`` atoms (or cost units) and usually nearly that many,
so padding every batch of a loader to one :class:`Budget` costs a few percent and gives the model
one shape: ``torch.compile`` compiles once, a CUDA graph is captured once. The budget is fixed
before the epoch starts, from the bins of the plan (:func:`budget_from_plan`, which says how each
count is set). A batch that does not fit (a later epoch's plan, a batch built by hand) never
crashes and is never truncated: :class:`BudgetTracker` raises the budget to cover it, with
headroom, and says so in one log line (the model then compiles once more, for the new shape).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

log = logging.getLogger("cfm_plugins.static_shapes")

#: default headroom over the fullest planned bin, for edges and graphs (and atoms when the cost is
# not atoms)
DEFAULT_HEADROOM = 0.05
#: edge budgets are rounded up to a multiple of this (fewer distinct shapes when a budget grows)
EDGE_MULTIPLE = 64


@dataclass(frozen=True)
class Budget:
    """The shape of a padded batch: ``atoms`` atoms, ``edges`` edges and ``graphs`` graphs in all,
    pad included. A batch of ``a`` atoms, ``e`` edges and ``g`` graphs fits when at least one pad
    atom and one pad graph remain (``a < atoms``, ``e <= edges``, ``g < graphs``)."""

    atoms: int
    edges: int
    graphs: int

    def __post_init__(self):
        for name in ("atoms", "edges", "graphs"):
            value = getattr(self, name)
            if int(value) != value or value < (
                0 if name == "edges" else 2 if name == "graphs" else 1
            ):
                raise ValueError(
                    f"Budget.{name}={value!r}: expected an integer, at least "
                    f"{0 if name == 'edges' else 2 if name == 'graphs' else 1}"
                )

    def fits(self, atoms: int, edges: int, graphs: int) -> bool:
        return atoms < self.atoms and edges <= self.edges and graphs < self.graphs

    def padding(self, atoms: int, edges: int, graphs: int) -> tuple[int, int, int]:
        """Pad atoms, pad edges and pad graphs that fill a batch of that size up to the budget."""
        if not self.fits(atoms, edges, graphs):
            raise ValueError(
                f"a batch of {atoms} atoms, {edges} edges and {graphs} graphs does not fit {self}"
            )
        return self.atoms - atoms, self.edges - edges, self.graphs - graphs

    def __str__(self) -> str:
        return f"{self.atoms} atoms, {self.edges} edges, {self.graphs} graphs"


def _round_up(x: float, multiple: int) -> int:
    return int(math.ceil(x / multiple) * multiple) if x > 0 else 0


def budget_for(
    atoms: float,
    edges: float,
    graphs: float,
    headroom: float = DEFAULT_HEADROOM,
    atoms_exact: bool = False,
    edges_exact: bool = False,
) -> Budget:
    """The budget of batches of at most ``atoms``/``edges``/``graphs`` (real, no pad), with
    ``headroom`` on each (not on atoms when ``atoms_exact``, nor on edges when ``edges_exact``: a
    capacity bounds them)."""
    if headroom < 0:
        raise ValueError(f"headroom={headroom!r} must be >= 0")
    a = int(math.ceil(atoms)) if atoms_exact else int(math.ceil(atoms * (1 + headroom)))
    e = edges if edges_exact else edges * (1 + headroom)
    return Budget(
        atoms=a + 1,
        edges=_round_up(e, EDGE_MULTIPLE),
        graphs=int(math.ceil(graphs * (1 + headroom))) + 1,
    )


def bin_sizes(
    packing, atoms: np.ndarray, edges: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Atoms, edges and graphs of every bin of a :class:`~cfm_plugins.sampler.Packing`
    (``atoms``/``edges`` indexed like the costs the plan was packed from)."""
    ids, n = packing.bin_ids(), len(packing)
    a = np.bincount(ids, weights=np.asarray(atoms, np.float64)[packing.indices], minlength=n)
    e = np.bincount(ids, weights=np.asarray(edges, np.float64)[packing.indices], minlength=n)
    return a.astype(np.int64), e.astype(np.int64), packing.bin_sizes().astype(np.int64)


def budget_from_plan(
    plans,
    atoms,
    edges,
    capacity_atoms: float | None = None,
    headroom: float = DEFAULT_HEADROOM,
    capacity_edges: float | None = None,
) -> Budget:
    """The budget covering every bin of ``plans`` (one :class:`Packing` or several, e.g. the plans
    of the first epochs), with ``headroom``.

    ``capacity_atoms``: the capacity the bins were dealt to when the cost is atoms (the atom budget
    is then that capacity, plus the pad atom); ``capacity_edges`` the same when the cost is edges
    (the edge budget is then that capacity, rounded up); ``None``: bins packed by another cost.

    - the count the bins were packed by (atoms with ``cost=atoms``, edges with ``cost=edges``):
      the capacity the bins were dealt to (no bin exceeds it; the ``static`` feature packs even
      bins, :func:`~cfm_plugins.sampler.packing.pack_even`, whose capacity is lowered to about the
      mean fill, so that light bins do not pad up to full ones);
    - the other count: the most any planned bin holds, with headroom (its count varies between
      bins packed by the first: the budget must cover the plans of later epochs too); edges
      rounded up;
    - atoms: plus one atom that is always a pad atom (the pad graph needs at least one to hold the
      pad edges, so an exactly full bin still fits);
    - graphs: the most graphs any planned bin holds, with headroom, plus one pad graph.
    """
    plans = [plans] if hasattr(plans, "bin_ids") else list(plans)
    sizes = [bin_sizes(p, atoms, edges) for p in plans]
    max_a = max(int(s[0].max()) for s in sizes)
    max_e = max(int(s[1].max()) for s in sizes)
    max_g = max(int(s[2].max()) for s in sizes)
    return budget_for(
        max_a if capacity_atoms is None else max(capacity_atoms, max_a),
        max_e if capacity_edges is None else max(capacity_edges, max_e),
        max_g,
        headroom,
        atoms_exact=capacity_atoms is not None,
        edges_exact=capacity_edges is not None,
    )


def budget_of_plans(
    plans, costs, atoms, edges, capacity: float, headroom: float = DEFAULT_HEADROOM
) -> Budget:
    """The budget of ``plans`` packed from ``costs`` at ``capacity`` as binpack packs them for
    padded batches: the limits of bins even in atoms and edges (``Packing.limits``: cost, atoms,
    edges), else the capacity the bins were dealt to, in atoms or edges where the cost is one of
    them, and the fullest bin + ``headroom`` for the rest."""
    plans = [plans] if hasattr(plans, "bin_ids") else list(plans)
    if all(p.limits is not None for p in plans):  # no bin exceeds the limits: they are the budget
        limit_a, limit_e = np.max([p.limits[1:3] for p in plans], axis=0)
        return budget_from_plan(plans, atoms, edges, limit_a, headroom, capacity_edges=limit_e)
    dealt = max(p.capacity or capacity for p in plans)  # no bin exceeds it, in the packing's cost
    by_atoms, by_edges = np.array_equal(costs, atoms), np.array_equal(costs, edges)
    return budget_from_plan(
        plans,
        atoms,
        edges,
        dealt if by_atoms else None,
        headroom,
        capacity_edges=dealt if by_edges and not by_atoms else None,
    )


@dataclass(frozen=True)
class PaddingOverhead:
    """Pad atoms and pad edges of a plan padded to one budget, as fractions of the real ones."""

    atoms: float
    edges: float
    batches: int

    def __str__(self) -> str:
        atoms, edges = 100 * self.atoms, 100 * self.edges
        return f"{atoms:.2f}% atoms, {edges:.2f}% edges over {self.batches} batches"


def padding_overhead(plans, atoms, edges, budget: Budget) -> PaddingOverhead:
    """How much padding ``budget`` adds to the batches of ``plans`` (the pad atom and pad edges of
    every batch, relative to its real atoms and edges)."""
    plans = [plans] if hasattr(plans, "bin_ids") else list(plans)
    real_a = real_e = 0
    n = 0
    for p in plans:
        a, e, _ = bin_sizes(p, atoms, edges)
        real_a, real_e, n = real_a + int(a.sum()), real_e + int(e.sum()), n + len(a)
    return PaddingOverhead(
        atoms=(n * budget.atoms - real_a) / max(real_a, 1),
        edges=(n * budget.edges - real_e) / max(real_e, 1),
        batches=n,
    )


class BudgetTracker:
    """The budget of one loader, raised when a batch does not fit (never truncated, never an error).

    :meth:`fit` returns the budget a batch is padded to. A batch over the budget raises it to that
    batch's size plus ``headroom`` (each dimension that overflowed), with one log line naming the
    batch, the old and the new budget: the model sees a new shape and compiles once more.
    ``raises`` counts them. ``name`` says which loader in the log (``train``, ``valid``, ``MD``).
    """

    def __init__(self, budget: Budget, headroom: float = DEFAULT_HEADROOM, name: str = "batches"):
        self.budget, self.headroom, self.name = budget, float(headroom), name
        self.raises = 0

    def fit(self, atoms: int, edges: int, graphs: int) -> Budget:
        b = self.budget
        if b.fits(atoms, edges, graphs):
            return b
        grown = budget_for(atoms, edges, graphs, self.headroom)
        new = Budget(
            atoms=max(b.atoms, grown.atoms) if atoms >= b.atoms else b.atoms,
            edges=max(b.edges, grown.edges) if edges > b.edges else b.edges,
            graphs=max(b.graphs, grown.graphs) if graphs >= b.graphs else b.graphs,
        )
        self.budget = new
        self.raises += 1
        log.info(
            "static shapes (%s): a batch of %d atoms, %d edges, %d graphs is over the budget "
            "(%s); raised to %s (one more compilation for the new shape)",
            self.name,
            atoms,
            edges,
            graphs,
            b,
            new,
        )
        return new

    def __repr__(self) -> str:
        return (
            f"BudgetTracker({self.name}: {self.budget}, headroom {self.headroom:g}, "
            f"raised {self.raises}x)"
        )
