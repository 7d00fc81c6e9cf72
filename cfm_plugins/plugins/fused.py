"""fused: swap the equivariant tensor operations for compiled fused kernels.

Replaces the symmetric contractions (MACE product basis) and the conv tensor products with
scatter (message construction) by :mod:`cfm_plugins.ops` kernels, in place and state_dict
compatible. Every trainer adapter asks for the swap through the ``cfm_patch_model`` hook, which
walks the model with the kernel table (:mod:`cfm_plugins.ops.kernel_table`). Options (declared here,
read only here): ``fused_kernels``, which kernels; ``fused_backend``, which kernels the operators
run on CUDA tensors (the Triton ones generated from the same descriptors, the default where Triton
imports, or the C++ CUDA ones), handed to :func:`cfm_plugins.ops._backend.set_gpu_backend`.
"""

from __future__ import annotations

import logging
import weakref

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.fused")

_REPORTED = (
    weakref.WeakSet()
)  # models reported once: nequip patches its model at every Trainer setup


@hookimpl
def cfm_declare_options():
    from cfm_plugins.options import Option

    return [
        Option(
            "fused_kernels",
            str,
            "symmetric_contraction,conv_tp",
            "comma list of the kernels to swap in: symmetric_contraction, conv_tp (or a registered "
            "one)",
        ),
        Option(
            "fused_backend",
            str,
            None,
            "kernels of the fused operators on CUDA tensors: auto (default, or "
            "CFM_PLUGINS_GPU_BACKEND: "
            "Triton where it imports, else the C++ CUDA kernels), triton (Triton kernels generated "
            "from "
            "the descriptors, NVIDIA and AMD; 2.6-3.1x faster train steps than cuda on an H100), "
            "cuda "
            "(the C++ CUDA kernels). CPU tensors always run the C++ CPU kernels",
            ("auto", "cuda", "triton"),
        ),
    ]


@hookimpl
def cfm_needs_adapter():
    return True  # models are patched where an adapter builds the trainer's model


def refuse_other_kernels(
    kernels,
    enable_cueq=False,
    enable_oeq=False,
    remedy="use one of them (drop fused from --enable, or the mace flag)",
) -> None:
    """The fused kernels and mace's cuEquivariance/OpenEquivariance swaps replace the same modules.

    The one check of this conflict: the ``fused`` plugin runs it on the trainer's settings and
    :class:`cfm_plugins.calculators.CFMCalculator` on its arguments.
    """
    if kernels and (enable_cueq or enable_oeq):
        raise ValueError(
            "the fused kernels and mace's enable_cueq/enable_oeq replace the same modules: "
            f"{remedy}"
        )


def kernels_option(config) -> tuple[str, ...]:
    """The kernels named by the ``fused_kernels`` option, validated against the kernel table."""
    from cfm_plugins.config import split_names
    from cfm_plugins.ops.kernel_table import check_kernels

    return check_kernels(split_names(config.get("fused_kernels")), "option fused_kernels")


@hookimpl
def cfm_configure(config):
    kernels_option(config)


@hookimpl
def cfm_trainer_settings(config, trainer):
    swaps = set(trainer.kernel_swaps)
    refuse_other_kernels(kernels_option(config), "cueq" in swaps, "oeq" in swaps)


def _report(model, report, kernels) -> None:
    """Once per model: what was swapped (by module name), and every kernel asked for that found no
    module in it (never dropped silently)."""
    if model in _REPORTED:
        return
    _REPORTED.add(model)
    name = type(model).__name__
    if report.total:
        log.info("fused kernels swapped in %s: %s", name, report.describe())
    if report.missing:
        what = (
            "nothing was swapped and training goes on with its own layers"
            if report.total == 0
            else "those stay stock"
        )
        log.warning(
            "fused: the model (%s) has no module for %s of fused_kernels=%s; %s",
            name,
            ", ".join(report.missing),
            ",".join(kernels),
            what,
        )


def apply_backend_option(config) -> None:
    """Hand ``fused_backend`` (when set) to the backend chooser of this process."""
    name = config.get("fused_backend")
    if name is not None:
        from cfm_plugins.ops import _backend

        _backend.set_gpu_backend(name)


@hookimpl
def cfm_patch_model(model, config):
    from cfm_plugins.ops.patching import patch_model

    apply_backend_option(config)  # in the process that runs the model (every rank)
    kernels = kernels_option(config)
    report = patch_model(model, kernels)
    _report(model, report, kernels)
    return report


@hookimpl
def cfm_unpatch_model(model, config):
    from cfm_plugins.ops.patching import unpatch_model

    return unpatch_model(model, kernels_option(config))
