"""fused: swap the equivariant tensor operations for compiled fused kernels.

Replaces the symmetric contractions (MACE product basis) and the conv tensor products with
scatter (message construction) by :mod:`cfm_plugins.ops` kernels, in place and state_dict
compatible. Every trainer adapter asks for the swap through the ``cfm_patch_model`` hook, which
walks the model with the kernel table (:mod:`cfm_plugins.ops.kernel_table`).

Options (declared here, read only here): ``fused_kernels``, which kernels (``auto``: every kernel
the model has a module for, except the opt-in ``conv_tp_radial``); ``fused_backend``, which
kernels the operators run on CUDA tensors; ``fused_tiles`` and ``fused_autotune``, how the Triton
kernels launch.
They are checked at start (:func:`cfm_configure`, a bad value is a usage error before any work)
and handed to :func:`cfm_plugins.ops.configure` there, once, in the process that runs the model:
no kernel reads the environment.
"""

from __future__ import annotations

import logging
import weakref

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.fused")

_REPORTED = weakref.WeakSet()  # models reported once: nequip patches its model at every setup

#: the ``fused_kernels`` value that means every kernel the model has a module for
AUTO = "auto"


@hookimpl
def cfm_declare_options():
    from cfm_plugins.options import Option

    return [
        Option(
            "fused_kernels",
            str,
            AUTO,
            "comma list of the kernels to swap in: symmetric_contraction, conv_tp, "
            "conv_tp_radial, skip_tp (or a registered one); auto: every kernel the model has a "
            "module for except conv_tp_radial, which runs only when named with conv_tp (a kernel "
            "named here that the model lacks is reported with a warning; skip_tp runs its GPU "
            "kernel only when named, since no GPU has timed it)",
        ),
        Option(
            "fused_backend",
            str,
            "auto",
            "kernels of the fused operators on CUDA tensors: auto (Triton where it imports, else "
            "the C++ CUDA kernels), triton (Triton kernels generated from the descriptors, NVIDIA "
            "and AMD), cuda (the C++ CUDA kernels, built with CFM_PLUGINS_CUDA=1). CPU tensors "
            "always run the C++ CPU kernels",
            ("auto", "cuda", "triton"),
        ),
        Option(
            "fused_tiles",
            str,
            "",
            "Triton tiles to pin instead of the built-in per-kernel, per-dtype defaults: "
            "KERNEL[:DTYPE]=TILE entries, comma separated, e.g. "
            "tp_segment=8x32/w8,tp_edge:float64=4x32/w4 (docs/gpu.md, Tuning); empty: "
            "the defaults",
        ),
        Option(
            "fused_autotune",
            bool,
            False,
            "time the Triton tile alternatives at the first launch of each kernel, dtype and size "
            "on the GPU and keep the fastest (pinned tiles are not timed)",
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

    Args:
        kernels: the kernels asked for (``None``: every kernel, as ``fused_kernels=auto``).
        enable_cueq, enable_oeq: mace's own swaps asked for.
        remedy: what the message tells the user to do.

    Raises:
        UsageError: both are asked for (a ValueError: cfm-run prints it once and exits 2).
    """
    from cfm_plugins.options import UsageError

    if (kernels is None or kernels) and (enable_cueq or enable_oeq):
        raise UsageError(
            "the fused kernels and mace's enable_cueq/enable_oeq replace the same modules: "
            f"{remedy}"
        )


def kernels_option(config) -> tuple[str, ...] | None:
    """The kernels named by ``fused_kernels``, validated against the kernel table; ``None`` for
    ``auto`` (every kernel the model has a module for)."""
    from cfm_plugins.config import split_names
    from cfm_plugins.ops.kernel_table import check_kernels

    names = split_names(config.get("fused_kernels"))
    if names == [AUTO]:
        return None
    if AUTO in names:
        raise ValueError(
            f"option fused_kernels={config.get('fused_kernels')!r}: auto means every kernel the "
            "model has and stands alone; name the kernels instead, or write auto"
        )
    return check_kernels(names, "option fused_kernels")


def launch_settings(config) -> dict:
    """The options of the Triton launches and the GPU backend as
    :func:`cfm_plugins.ops.configure`'s arguments; a bad ``fused_tiles`` is a ``ValueError``
    naming the option, the value, the entry and what is allowed."""
    from cfm_plugins.ops.triton import configs

    tiles = config.get("fused_tiles") or ""
    try:
        configs.parse_tiles(tiles)
    except ValueError as exc:
        raise ValueError(
            f"cfm-plugins option fused_tiles={tiles!r}: {exc}; expected {configs.TILES_SYNTAX}"
        ) from None
    return {
        "backend": config.get("fused_backend") or "auto",
        "tiles": tiles,
        "autotune": bool(config.get("fused_autotune")),
    }


@hookimpl
def cfm_configure(config):
    kernels_option(config)
    from cfm_plugins.ops import configure
    from cfm_plugins.plugins.static import resolve_device

    settings = launch_settings(config)
    configure(**settings)  # once, before ranks and trainer exist (same process)
    if settings["backend"] != "auto" and resolve_device(config) == "cpu":
        config.warnings.append(
            f"fused_backend={settings['backend']}: this run is on the CPU, where the fused "
            "operators run their C++ CPU kernels; the option chooses the kernels of CUDA tensors "
            "(GPU runs) and changes nothing here"
        )


@hookimpl
def cfm_trainer_settings(config, trainer):
    swaps = set(trainer.kernel_swaps)
    refuse_other_kernels(kernels_option(config), "cueq" in swaps, "oeq" in swaps)


def _report(model, report, kernels) -> None:
    """Once per model: what was swapped (by module name), and every kernel named in
    ``fused_kernels`` that found no module in it (never dropped silently). Under ``auto``
    (``kernels`` None) a kernel the model lacks is no news; a model with nothing to swap is."""
    if model in _REPORTED:
        return
    _REPORTED.add(model)
    name = type(model).__name__
    if report.total:  # under auto, only the kernels the model has
        log.info("fused kernels swapped in %s: %s", name, report.describe(kernels is not None))
    nothing = report.total == 0 and not any(report.already.values())
    if kernels is None:
        if nothing:
            log.warning(
                "fused: the model (%s) has no module that a fused kernel (%s) replaces; nothing "
                "was swapped and training goes on with its own layers",
                name,
                ", ".join(report.swapped),
            )
    elif report.missing:
        log.warning(
            "fused: the model (%s) has no module for %s of fused_kernels=%s; %s",
            name,
            ", ".join(report.missing),
            ",".join(kernels),
            "nothing was swapped and training goes on with its own layers"
            if report.total == 0
            else "those stay stock",
        )


@hookimpl
def cfm_patch_model(model, config):
    from cfm_plugins.ops.patching import patch_model

    kernels = kernels_option(config)
    report = patch_model(model, kernels)
    _report(model, report, kernels)
    return report


@hookimpl
def cfm_unpatch_model(model, config):
    from cfm_plugins.ops.patching import unpatch_model

    return unpatch_model(model, kernels_option(config))
