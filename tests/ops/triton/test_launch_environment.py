"""No kernel launch reads the environment: the settings are set once (``cfm_plugins.ops.configure``,
the ``fused`` plugin's options) and the debug switches read once (``cfm_plugins.ops._debug``).

A warm step of both fused modules (forward, forces, a gradient of the forces: every Triton kernel)
runs in the interpreter with ``os.environ`` replaced by a mapping that fails on any access. The
first step may read the environment (the kernels' cache directory when a source is generated, the
debug switches at their first use); the second must not.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from tests.helpers.conv_tp_cases import graph, inputs
from tests.helpers.mace_models import mace_module, mace_tp

pytestmark = pytest.mark.usefixtures("triton_cpu")


class NoEnvironment(MutableMapping):
    """``os.environ`` that fails on any access, naming the key."""

    def _read(self, key=None, *_):
        raise AssertionError(f"the environment was read during a kernel launch ({key!r})")

    __getitem__ = __setitem__ = __delitem__ = _read

    def __iter__(self):
        self._read()

    def __len__(self):
        self._read()


def step(conv, sc, x, y, w, ei, feats, elements):
    """Energy of one conv TP layer and one contraction, its gradient with create_graph and the
    gradient of that (force training's double backward): every kernel of both modules."""
    out = conv(x, y, w, ei)
    energy = (out**2).sum() + sc(feats, elements).pow(2).sum()
    grads = torch.autograd.grad(energy, (x, y, w, feats), create_graph=True)
    return torch.autograd.grad(sum((g**2).sum() for g in grads), (x, y, w, feats))


def test_a_warm_step_reads_no_environment(monkeypatch, launch_settings):
    launch_settings(tiles="", autotune=False)
    tp = mace_tp("0e+1o", 2, 4)
    conv = FusedConvTP.from_e3nn(tp)
    sc = FusedSymmetricContraction.from_mace(mace_module("0e", 2, 2, 2, True))
    x, y, w = inputs(tp, 6, 15, torch.float64, seed=2, requires_grad=True)
    ei = graph(6, 15, seed=3)
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(6, 2, 16, generator=g, dtype=torch.float64, requires_grad=True)
    elements = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 0, 1, 0]), 2).double()
    args = (conv, sc, x, y, w, ei, feats, elements)

    first = step(*args)  # generates and caches the kernels
    trap = NoEnvironment()
    with pytest.raises(AssertionError, match="'CFM_PLUGINS_TRITON_TILES'"):
        trap.get("CFM_PLUGINS_TRITON_TILES")  # the trap is armed
    monkeypatch.setattr(os, "environ", trap)
    try:
        second = step(*args)
    finally:
        monkeypatch.undo()  # before pytest itself writes to the environment
    for a, b in zip(second, first):
        assert b.abs().max() > 0 and torch.equal(a, b)
