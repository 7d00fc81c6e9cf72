"""Swap a built model's equivariant modules for the fused ones, and back.

``patch_model(model)`` replaces, in place, every mace ``SymmetricContraction`` with
:class:`~cfm_plugins.ops.FusedSymmetricContraction` and every interaction block's ``conv_tp`` with
:class:`~cfm_plugins.ops.FusedConvTP`. The swaps share parameters and keep state_dict keys, so a
checkpoint loads with or without the plugin; ``unpatch_model`` restores the stock modules (do it
before pickling a whole model for users who do not have cfm-plugins).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

import torch

#: kernel name -> (module, patch function, unpatch function)
KERNELS = {
    "symmetric_contraction": (
        "cfm_plugins.ops.symmetric_contraction",
        "patch_symmetric_contractions",
        "unpatch_symmetric_contractions",
    ),
    "conv_tp": ("cfm_plugins.ops.conv_tp", "patch_conv_tps", "unpatch_conv_tps"),
}


@dataclass
class PatchReport:
    """How many modules of each kind were swapped."""

    counts: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in self.counts.items()) or "nothing"


def _resolve(kernel: str, which: int):
    if kernel not in KERNELS:
        raise ValueError(f"unknown fused kernel {kernel!r}; known: {', '.join(KERNELS)}")
    modname, *fns = KERNELS[kernel]
    return getattr(importlib.import_module(modname), fns[which])


def patch_model(model: torch.nn.Module, kernels=tuple(KERNELS)) -> PatchReport:
    """Swap the modules of ``kernels`` in ``model`` (in place). Returns what was swapped."""
    return PatchReport({k: _resolve(k, 0)(model) for k in kernels})


def unpatch_model(model: torch.nn.Module, kernels=tuple(KERNELS)) -> PatchReport:
    """Undo :func:`patch_model` (in place)."""
    return PatchReport({k: _resolve(k, 1)(model) for k in kernels})
