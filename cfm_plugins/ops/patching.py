"""Swap a built model's equivariant modules for the fused ones, and back.

``patch_model(model)`` replaces, in place, every mace ``SymmetricContraction`` with
:class:`~cfm_plugins.ops.FusedSymmetricContraction` and every interaction block's ``conv_tp`` with
:class:`~cfm_plugins.ops.FusedConvTP`. The swaps share parameters and keep state_dict keys, so a
checkpoint loads with or without the plugin; ``unpatch_model`` restores the stock modules (do it
before pickling a whole model for users who do not have cfm-plugins). The fused modules are made
on the model's device and dtype and follow ``.to()``; a patched model can be scripted
(``torch.jit.script``, ``mace.cli.create_lammps_model``) or exported (``torch.export``) as long as
the operator library is loaded where it runs (:func:`cfm_plugins.ops._backend.library_paths`).

:data:`KERNELS` is the one list of kernel names: every caller validates names with
:func:`check_kernels`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cfm_plugins.ops.conv_tp import patch_conv_tps, unpatch_conv_tps
from cfm_plugins.ops.symmetric_contraction import patch_symmetric_contractions, unpatch_symmetric_contractions

#: kernel name -> (patch function, unpatch function); each takes the model, returns the swap count
KERNELS = {
    "symmetric_contraction": (patch_symmetric_contractions, unpatch_symmetric_contractions),
    "conv_tp": (patch_conv_tps, unpatch_conv_tps),
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


def check_kernels(names, where: str = "fused kernels") -> tuple[str, ...]:
    """``names`` as a tuple, or a ValueError naming the unknown ones and the known ones."""
    names = tuple(names)
    bad = [n for n in names if n not in KERNELS]
    if bad:
        raise ValueError(f"{where}: unknown fused kernel {', '.join(map(repr, bad))}; known: {', '.join(KERNELS)}")
    return names


def kernels_option(config) -> tuple[str, ...]:
    """The kernels named by the ``fused_kernels`` option (declared by the ``fused`` feature),
    validated: what adapters swap in when ``fused`` is enabled, without importing the feature."""
    from cfm_plugins.config import split_names

    return check_kernels(split_names(config.get("fused_kernels")), "option fused_kernels")


def patch_model(model: torch.nn.Module, kernels=tuple(KERNELS)) -> PatchReport:
    """Swap the modules of ``kernels`` in ``model`` (in place). Returns what was swapped."""
    return PatchReport({k: KERNELS[k][0](model) for k in check_kernels(kernels)})


def unpatch_model(model: torch.nn.Module, kernels=tuple(KERNELS)) -> PatchReport:
    """Undo :func:`patch_model` (in place)."""
    return PatchReport({k: KERNELS[k][1](model) for k in check_kernels(kernels)})
