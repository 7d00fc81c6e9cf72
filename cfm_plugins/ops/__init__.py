"""Fused equivariant kernels as torch modules and custom ops.

- :class:`FusedSymmetricContraction` (MACE's product basis) in ``symmetric_contraction.py``
- :class:`FusedConvTP` (channelwise tensor product + scatter) in ``conv_tp.py``
- :class:`FusedSkipTP` (MACE's skip connection, a per-element linear map) in ``skip_tp.py``
- :func:`configure`: the runtime settings of the kernels (GPU backend, Triton tiles, autotuning),
  for a Python user; the ``fused`` plugin calls it at start with its options.

The sparse coefficient lists (*what* is computed) live in ``descriptors/``; the compiled kernels
(*how* it runs) are torch operators built from ``cuda/`` and loaded by ``_library.py``;
``_backend.py`` chooses which runs. The kernel table (``kernel_table.py``) says which modules each
kernel replaces; ``patching.py`` swaps them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "FusedSymmetricContraction": "cfm_plugins.ops.symmetric_contraction",
    "FusedConvTP": "cfm_plugins.ops.conv_tp",
    "FusedSkipTP": "cfm_plugins.ops.skip_tp",
}

__all__ = [*_EXPORTS, "configure", "settings"]


def configure(
    *,
    backend: str | None = None,
    tiles: str | None = None,
    autotune: bool | None = None,
) -> dict:
    """Set the runtime settings of the fused kernels for this process, before they run.

    The ``fused`` plugin calls it at start with its options (``fused_backend``, ``fused_tiles``,
    ``fused_autotune``); a Python user (e.g. of
    :class:`~cfm_plugins.calculators.CFMCalculator`) calls it directly. The kernels read these
    settings at each launch and never the environment. Every argument left ``None`` keeps its
    current value; all are checked before any is set.

    Args:
        backend: the kernels of the ``cfm::`` operators on CUDA tensors: ``"auto"`` (default:
            Triton where it imports, else the C++ CUDA kernels), ``"triton"`` or ``"cuda"``.
        tiles: Triton tiles to pin, ``KERNEL[:DTYPE]=TILE`` entries, comma separated (e.g.
            ``"tp_segment=8x32/w8,tp_edge:float64=4x32/w4"``); ``""`` for the built-in
            per-kernel, per-dtype defaults.
        autotune: time the tile alternatives at the first launch of each shape on the GPU.

    Returns:
        The settings before the call, as keyword arguments: ``configure(**previous)`` restores
        them.

    Raises:
        ValueError: a value is not allowed; the message names it and what is.
    """
    from cfm_plugins.ops.triton import configs

    if backend is not None:
        from cfm_plugins.ops._backend import GPU_BACKENDS

        if backend not in GPU_BACKENDS:
            raise ValueError(f"backend={backend!r}: expected one of {', '.join(GPU_BACKENDS)}")
    if tiles is not None:
        try:
            configs.parse_tiles(tiles)
        except ValueError as exc:
            raise ValueError(f"tiles={tiles!r}: {exc}; expected {configs.TILES_SYNTAX}") from None
    previous = settings()
    if backend is not None:
        from cfm_plugins.ops._backend import set_gpu_backend

        set_gpu_backend(backend)
    if tiles is not None:
        configs.set_tiles(tiles)
    if autotune is not None:
        configs.set_autotune(autotune)
    return previous


def settings() -> dict:
    """The runtime settings in force, as :func:`configure`'s keyword arguments."""
    from cfm_plugins.ops._backend import gpu_backend
    from cfm_plugins.ops.triton import configs

    return {
        "backend": gpu_backend(),
        "tiles": configs.tiles(),
        "autotune": configs.autotuning(),
    }


def __getattr__(name):  # lazy: importing cfm_plugins.ops stays cheap and never imports e3nn
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cfm_plugins.ops' has no attribute {name!r}")
