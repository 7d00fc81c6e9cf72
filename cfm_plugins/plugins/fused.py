"""fused: swap the equivariant tensor operations for compiled fused kernels.

Replaces the symmetric contractions (MACE product basis) and the conv tensor products with
scatter (message construction) by :mod:`cfm_plugins.ops` kernels, in place and state_dict
compatible. Option ``fused_kernels`` (declared in :func:`cfm_declare_options`): which kernels.
"""
from __future__ import annotations

import logging

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.fused")


@hookimpl
def cfm_declare_options():
    from cfm_plugins.options import Option

    return [Option("fused_kernels", str, "symmetric_contraction,conv_tp",
                   "comma list of the kernels to swap in: symmetric_contraction, conv_tp")]


@hookimpl
def cfm_needs_adapter():
    return True  # models are patched where an adapter builds the trainer's model


def refuse_other_kernels(kernels, enable_cueq=False, enable_oeq=False,
                         remedy="use one of them (drop fused from --enable, or the mace flag)") -> None:
    """The fused kernels and mace's cuEquivariance/OpenEquivariance swaps replace the same modules.

    The one check of this conflict: the ``fused`` plugin runs it on the trainer's settings and
    :class:`cfm_plugins.calculators.CFMCalculator` on its arguments.
    """
    if kernels and (enable_cueq or enable_oeq):
        raise ValueError(f"the fused kernels and mace's enable_cueq/enable_oeq replace the same modules: {remedy}")


def kernels(config) -> tuple[str, ...]:
    from cfm_plugins.ops.patching import kernels_option

    return kernels_option(config)


@hookimpl
def cfm_configure(config):
    kernels(config)


@hookimpl
def cfm_trainer_settings(config, trainer):
    swaps = set(trainer.kernel_swaps)
    refuse_other_kernels(kernels(config), "cueq" in swaps, "oeq" in swaps)


@hookimpl
def cfm_patch_model(model, config):
    from cfm_plugins.ops.patching import patch_model

    report = patch_model(model, kernels(config))
    log.info("fused kernels swapped in: %s", report)
    if report.total == 0:
        log.warning("fused: no module of a known kind was found in the model; nothing was swapped")


@hookimpl
def cfm_unpatch_model(model, config):
    from cfm_plugins.ops.patching import unpatch_model

    unpatch_model(model, kernels(config))
