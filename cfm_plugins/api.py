"""The declared API for trainer adapters: every name of the core an adapter may use.

An adapter (those in ``cfm_plugins_adapters`` or a third party's) imports the core only from here,
e.g. ``from cfm_plugins.api import Session, hookimpl``; import-linter's contract "the adapters
import the core only through cfm_plugins.api" (pyproject.toml) keeps ours to it. Each name is the
object of the module that owns it (:data:`_SOURCES`), imported when first asked for, so that
``import cfm_plugins.api`` imports neither torch nor a trainer, and an adapter that imports a name
inside a function imports its module only when that function runs.
"""

from __future__ import annotations

import importlib

#: public name -> (the module that owns it, its name there; None: the module itself)
_SOURCES: dict[str, tuple[str, str | None]] = {
    # plugins, sessions, options
    "hookimpl": ("cfm_plugins.hookspec", "hookimpl"),
    "Session": ("cfm_plugins.manager", "Session"),
    "Option": ("cfm_plugins.options", "Option"),
    "TrainerSettings": ("cfm_plugins.options", "TrainerSettings"),
    "UsageError": ("cfm_plugins.options", "UsageError"),
    "argv_value": ("cfm_plugins.config", "argv_value"),
    "mpi_world_mismatch": ("cfm_plugins.distributed", "mpi_world_mismatch"),
    # sizes and the batch sampler
    "GraphSizes": ("cfm_plugins.graph_sizes", "GraphSizes"),
    "shard_indices": ("cfm_plugins.graph_sizes", "shard_indices"),
    "BatchSamplerWrapper": ("cfm_plugins.sampler.batch_sampler", "BatchSamplerWrapper"),
    # step times and step logs
    "SamplerStateFile": ("cfm_plugins.step_timer", "SamplerStateFile"),
    "StepTimer": ("cfm_plugins.step_timer", "StepTimer"),
    "batch_totals": ("cfm_plugins.step_timer", "batch_totals"),
    "hand_over": ("cfm_plugins.step_timer", "hand_over"),
    "wants_step_times": ("cfm_plugins.step_timer", "wants_step_times"),
    "StepLogWriter": ("cfm_plugins.steplog", "StepLogWriter"),
    # non-finite losses and labels
    "LossGuard": ("cfm_plugins.nonfinite", "LossGuard"),
    "agree_not_finite": ("cfm_plugins.nonfinite", "agree_not_finite"),
    "dataset_source": ("cfm_plugins.nonfinite", "dataset_source"),
    "name_structures": ("cfm_plugins.nonfinite", "name_structures"),
    # the fused kernels
    "FusedConvTP": ("cfm_plugins.ops.conv_tp", "FusedConvTP"),
    "is_uvu_conv_tp": ("cfm_plugins.ops.conv_tp", "is_uvu_conv_tp"),
    "Form": ("cfm_plugins.ops.kernel_table", "Form"),
    "add_form": ("cfm_plugins.ops.kernel_table", "add_form"),
    "patch_model": ("cfm_plugins.ops.patching", "patch_model"),
    "unpatch_model": ("cfm_plugins.ops.patching", "unpatch_model"),
    "is_patched": ("cfm_plugins.ops.patching", "is_patched"),
    "declare_operators": ("cfm_plugins.ops._backend", "declare_operators"),
    "tracing": ("cfm_plugins.ops._backend", "tracing"),
    # static shapes (mace's padding)
    "installed_static_forward": ("cfm_plugins.static_shapes.forward", "installed"),
    "MACE_SPEC": ("cfm_plugins.static_shapes.mace", "MACE_SPEC"),
    "PaddingCollater": ("cfm_plugins.static_shapes.mace", "PaddingCollater"),
    "e3nn_codegen_off": ("cfm_plugins.static_shapes.mace", "e3nn_codegen_off"),
    "without_torchscript": ("cfm_plugins.static_shapes.mace", "without_torchscript"),
    # cfm-plan's readers, edge counts and cache of sizes
    "Block": ("cfm_plugins.plan.readers", "Block"),
    "h5_read": ("cfm_plugins.plan.readers", "h5_read"),
    "not_finite": ("cfm_plugins.plan.readers", "not_finite"),
    "FileSizes": ("cfm_plugins.plan.sizes", "FileSizes"),
    "count_block": ("cfm_plugins.plan.sizes", "_count_block"),
    "neighbour_counter": ("cfm_plugins.plan.neighbours", "backend"),
    "plan_cache": ("cfm_plugins.plan.cache", None),
}

__all__ = list(_SOURCES)


def __getattr__(name: str):
    # looked up at every import (not kept here): a test that replaces a name in its module is seen
    try:
        module, attr = _SOURCES[name]
    except KeyError:
        raise AttributeError(f"module 'cfm_plugins.api' has no attribute {name!r}") from None
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SOURCES))
