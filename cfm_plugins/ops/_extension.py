"""Loading of the compiled kernel extensions, with a clear message when one is missing.

The compiled modules are ``cfm_plugins._C_<kernel>`` (CPU, pybind11) and
``cfm_plugins._C_<kernel>_cuda`` (optional CUDA build). They take raw data pointers
(``tensor.data_ptr()``) and sizes, never torch objects, so they build without torch headers.

``load(kernel)`` returns the module or ``None``; the first miss logs (once) how to build it.
Callers fall back to the pure-torch implementation of the same math.
"""
from __future__ import annotations

import importlib
import logging
import os

log = logging.getLogger("cfm_plugins.ops")

_CACHE: dict[str, object] = {}
_WARNED: set[str] = set()

BUILD_HINT = (
    "build it with `pip install -e .` from the cfm-plugins checkout (needs a C++17 compiler and "
    "pybind11; add CFM_PLUGINS_CUDA=1 for the CUDA kernels), or `python setup.py build_ext --inplace`"
)


def disabled() -> bool:
    """``CFM_PLUGINS_FORCE_TORCH=1`` forces the pure-torch fallback (for debugging and tests)."""
    return os.environ.get("CFM_PLUGINS_FORCE_TORCH", "") == "1"


def load(kernel: str, cuda: bool = False):
    """Return the compiled module for ``kernel`` (e.g. ``"symmetric_contraction"``) or None."""
    name = f"cfm_plugins._C_{kernel}" + ("_cuda" if cuda else "")
    if disabled():
        return None
    if name not in _CACHE:
        try:
            _CACHE[name] = importlib.import_module(name)
        except ImportError as exc:
            _CACHE[name] = None
            if name not in _WARNED:
                _WARNED.add(name)
                log.warning(
                    "compiled kernel %s is not available (%s); using the pure-torch fallback. To %s",
                    name, exc, BUILD_HINT,
                )
    return _CACHE[name]


def require(kernel: str, cuda: bool = False):
    """Like :func:`load` but raise a clear error instead of returning None."""
    mod = load(kernel, cuda=cuda)
    if mod is None:
        where = "CUDA" if cuda else "CPU"
        raise RuntimeError(f"the {where} kernel cfm_plugins._C_{kernel} is not built: {BUILD_HINT}")
    return mod
