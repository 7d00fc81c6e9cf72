"""mace's graph of one structure in MD, made again from the last one where only positions changed.

``CFMCalculator(skin=...)`` evaluates a trajectory: every step, mace's ``AtomicData.from_config``
would build the neighbour list from scratch and every other field of the graph again (one-hot
node attributes, weights, cell tensors, empty labels). :class:`MDGraphs` keeps the graph of the
last structure whose configuration (atomic numbers, cell, periodicity, head, weights, properties)
was the same, and replaces only what depends on positions: the positions, the edges and their
shifts (:class:`~cfm_plugins.calculators.skin_list.SkinNeighbourList`), and the cell tensors mace
derives from the cell its neighbour list returns (which, in a non-periodic direction, depends on the
positions). Any other change of the configuration makes the graph again with ``from_config``.
``tests/calculators/test_mace_graph.py`` compares every field with ``from_config``'s.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from cfm_plugins.calculators.skin_list import SkinNeighbourList

__all__ = ["MDGraphs", "mace_cell"]


def mace_cell(positions: np.ndarray, cutoff: float, pbc, cell) -> np.ndarray:
    """The cell mace's ``get_neighborhood(positions, cutoff, pbc, cell)`` returns (and its graph
    stores): the given one (the identity if it is all zero), each non-periodic direction replaced
    by a box ``5 * cutoff`` times wider than the farthest coordinate plus one."""
    cell = np.identity(3) if cell is None or not np.any(cell) else np.array(cell, dtype=float)
    wide = (np.max(np.absolute(positions)) + 1) * 5 * cutoff
    for k in range(3):
        if not pbc[k]:
            cell[k, :] = wide * np.identity(3)[k]
    return cell


def _signature(config) -> tuple:
    """Everything of a mace ``Configuration`` but its positions, comparable with ``==``."""

    def frozen(value):
        if value is None or isinstance(value, (str, bytes, bool, int, float)):
            return value
        a = np.asarray(value)
        return (a.dtype.str, a.shape, a.tobytes())

    return (
        frozen(config.atomic_numbers),
        frozen(config.cell),
        tuple(bool(p) for p in config.pbc),
        frozen(config.weight),
        config.config_type,
        config.head,
        tuple(sorted((k, frozen(v)) for k, v in config.properties.items())),
        tuple(sorted((k, frozen(v)) for k, v in config.property_weights.items())),
    )


class MDGraphs:
    """mace graphs of successive structures of one trajectory (see the module docstring).

    Args:
        cutoff: the model's cutoff (``r_max``).
        skin: the neighbour list's margin (Angstrom; 0: a new list at every step).
        z_table, heads: what mace's ``from_config`` takes.
    """

    def __init__(self, cutoff: float, skin: float, z_table, heads):
        self.cutoff = float(cutoff)
        self.neighbours = SkinNeighbourList(cutoff, skin)
        self.z_table, self.heads = z_table, heads
        self._signature = None
        self._graph = None

    def graph(self, config):
        """The ``AtomicData`` of ``config`` (a mace ``Configuration``), equal to
        ``AtomicData.from_config(config, z_table, cutoff, heads)`` up to the order of the edges.
        Tensors in torch's default dtype, as there: call it inside mace's ``default_dtype``."""
        from mace import data as mace_data

        signature = _signature(config)
        if signature != self._signature:
            self._graph = mace_data.AtomicData.from_config(
                config, z_table=self.z_table, cutoff=self.cutoff, heads=self.heads
            )
            self._signature = signature
        dtype = torch.get_default_dtype()
        edge_index, shifts, unit_shifts = self.neighbours.edges(
            config.positions, config.pbc, config.cell, dtype
        )
        cell = torch.tensor(
            mace_cell(config.positions, self.cutoff, config.pbc, config.cell), dtype=dtype
        )
        volume = torch.linalg.det(cell)
        # a new set of fields (AtomicData has no usable clone); the kept tensors are shared, not
        # written
        graph = copy.copy(self._graph)
        graph.edge_index = edge_index
        graph.positions = torch.tensor(config.positions, dtype=dtype)
        graph.shifts = shifts
        graph.unit_shifts = unit_shifts
        graph.cell = cell
        graph.volume = volume
        graph.rcell = (
            2 * torch.pi * torch.linalg.inv(cell.mT)
            if torch.abs(volume) > 0
            else torch.zeros(3, 3, dtype=dtype)
        )
        return graph
