"""Fused equivariant kernels as torch modules and custom ops.

- :class:`FusedSymmetricContraction` (MACE's product basis) in ``symmetric_contraction.py``
- :class:`FusedConvTP` (channelwise tensor product + scatter) in ``conv_tp.py``

The sparse coefficient lists (*what* is computed) live in ``descriptors/``; the compiled kernels
(*how* it runs) are torch operators built from ``cuda/`` and loaded by ``_backend.py``. The kernel
table (``kernel_table.py``) says which modules each kernel replaces; ``patching.py`` swaps them.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "FusedSymmetricContraction": "cfm_plugins.ops.symmetric_contraction",
    "FusedConvTP": "cfm_plugins.ops.conv_tp",
}

__all__ = list(_EXPORTS)


def __getattr__(name):  # lazy: importing cfm_plugins.ops stays cheap and never imports e3nn
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cfm_plugins.ops' has no attribute {name!r}")
