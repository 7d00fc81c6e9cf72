"""cfm-plugins: fast training of chemistry foundation models inside the users' own trainers.

Features (each a plugin, enabled by name): ``binpack`` (the bin-packing batch sampler, see
:mod:`cfm_plugins.sampler`) and ``fused`` (compiled fused equivariant kernels, see
:mod:`cfm_plugins.ops`). Trainer adapters (``mace``) are plugins too. The hooks are in
:mod:`cfm_plugins.hookspec`; docs/architecture.md describes the layers.
"""
__version__ = "0.1.0"
