"""fused: swap the equivariant tensor operations for compiled fused kernels.

Replaces the symmetric contractions (MACE product basis) and the conv tensor products with
scatter (message construction) by :mod:`cfm_plugins.ops` kernels, in place and state_dict
compatible. Option ``fused_kernels``: comma list out of ``symmetric_contraction,conv_tp``
(default both).
"""
from __future__ import annotations

import logging

from cfm_plugins.config import split_names
from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.fused")


def kernels(config) -> tuple[str, ...]:
    from cfm_plugins.ops.patching import KERNELS

    names = split_names(config.get("fused_kernels", ",".join(KERNELS)))
    bad = [n for n in names if n not in KERNELS]
    if bad:
        raise ValueError(f"fused option fused_kernels: unknown {', '.join(bad)}; known: {', '.join(KERNELS)}")
    return tuple(names)


@hookimpl
def cfm_configure(config):
    kernels(config)


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
