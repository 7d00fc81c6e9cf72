"""ASE calculators that evaluate stock model files with the cfm-plugins fused kernels.

- :class:`CFMCalculator` (``mace_calculator.py``): mace's ``MACECalculator`` with the fused
  symmetric contraction and conv tensor product swapped in, plus batched evaluation.
- ``loading.py``: loading and checking MACE model files.
- :func:`time_md` (``md.py``): seconds per MD step with any ASE calculator.

Lazy: importing this package does not import mace (or e3nn); the first use of
``CFMCalculator`` does.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CFMCalculator": "cfm_plugins.calculators.mace_calculator",
    "load_mace_models": "cfm_plugins.calculators.loading",
    "load_mace_weights": "cfm_plugins.calculators.loading",
    "time_md": "cfm_plugins.calculators.md",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cfm_plugins.calculators' has no attribute {name!r}")
