"""MDGraphs: mace's graph of each MD step remade from the last one, equal to mace's from_config
field by field; made again when the configuration changes."""

from __future__ import annotations

import pytest
import torch
from mace import data as mace_data
from mace.tools import torch_tools, utils

from cfm_plugins.calculators.mace_graph import MDGraphs
from tests.helpers.mace_models import random_walk, structures

CUTOFF = 5.0
Z_TABLE = utils.AtomicNumberTable(list(range(1, 90)))


def edge_order(graph) -> list[int]:
    """The graph's edges sorted by (sender, receiver, unit shift): two graphs of the same edges in
    different orders line up."""
    keys = [(i, j, *s) for i, j, s in zip(*graph.edge_index.tolist(), graph.unit_shifts.tolist())]
    return sorted(range(len(keys)), key=keys.__getitem__)


@pytest.mark.parametrize("index", [0, 2, 3], ids=["cubic", "slab", "cluster"])
def test_md_graph_equals_maces_graph_field_by_field(index):
    """Every field of the remade graph equals mace's from_config of the same structure (edges as a
    set; the per-edge fields follow their edges); a field that mace starts to derive from the
    positions would fail here."""
    atoms = structures()[index]
    keyspec = mace_data.KeySpecification(info_keys={}, arrays_keys={})
    graphs = MDGraphs(CUTOFF, 1.0, Z_TABLE, ["Default"])
    with torch_tools.default_dtype("float64"):
        for positions in random_walk(atoms, 4, 0.05, seed=3):
            moved = atoms.copy()
            moved.positions = positions
            config = mace_data.config_from_atoms(moved, key_specification=keyspec)
            ours = graphs.graph(config)
            ref = mace_data.AtomicData.from_config(
                config, z_table=Z_TABLE, cutoff=CUTOFF, heads=["Default"]
            )
            assert set(ours.keys) == set(ref.keys)
            edge_keys = {"edge_index", "shifts", "unit_shifts"}
            for key in set(ref.keys) - edge_keys:
                a, b = ours[key], ref[key]
                assert a.dtype == b.dtype and a.shape == b.shape, key
                torch.testing.assert_close(a, b, rtol=1e-14, atol=0, msg=key)
            mine, theirs = edge_order(ours), edge_order(ref)
            for key in edge_keys:
                a, b = ours[key], ref[key]
                assert a.dtype == b.dtype, key
                a = a[:, mine] if key == "edge_index" else a[mine]
                b = b[:, theirs] if key == "edge_index" else b[theirs]
                torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-14, msg=key)
    assert graphs.neighbours.reuses >= 2


def test_a_changed_configuration_makes_the_graph_again():
    atoms = structures()[0]
    keyspec = mace_data.KeySpecification(info_keys={}, arrays_keys={})
    graphs = MDGraphs(CUTOFF, 1.0, Z_TABLE, ["Default"])
    with torch_tools.default_dtype("float64"):
        first = graphs.graph(mace_data.config_from_atoms(atoms, key_specification=keyspec))
        swapped = atoms.copy()
        swapped.numbers[0] = (
            29 if swapped.numbers[0] != 29 else 28
        )  # another element, same positions
        second = graphs.graph(mace_data.config_from_atoms(swapped, key_specification=keyspec))
    assert not torch.equal(first.node_attrs, second.node_attrs)
    ref = mace_data.AtomicData.from_config(
        mace_data.config_from_atoms(swapped, key_specification=keyspec),
        z_table=Z_TABLE,
        cutoff=CUTOFF,
        heads=["Default"],
    )
    torch.testing.assert_close(second.node_attrs, ref.node_attrs.to(second.node_attrs.dtype))
