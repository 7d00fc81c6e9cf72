"""Triton kernels of the ``cfm::`` operators, generated from the descriptors (NVIDIA and AMD GPUs).

The operators are declared once, in C++, with their Meta kernels and C++ autograd; :func:`register`
makes the launchers here their **CUDA kernels** (called by :func:`cfm_plugins.ops._backend.choose`
when the GPU backend resolves to ``triton``, the default where Triton imports: docs/gpu.md), so
schemas, autograd, torch.compile and exported models stay one. A C++ host (LAMMPS, AOTInductor)
keeps the C++ CUDA kernels. Submodules: :mod:`.symmetric_contraction` (a depth-first walk of the
monomial tree from an int32 table), :mod:`.conv_tp` (segmented, atomic-free gather, product and
scatter; :mod:`.conv_tp_radial`: weights from the radial MLP's last layer), :mod:`.skip_tp`
(``tl.dot`` tiles per element), :mod:`.configs` (tile sizes, autotuning, launch settings),
:mod:`.aot` (compiles for sm_80/sm_90/gfx90a/gfx942 without a GPU: ``make triton-check``),
:mod:`._codegen` (generated source in cached ``.py`` files). Without a GPU the tests run the same
launchers in Triton's interpreter (``TRITON_INTERPRET=1``) as the operators' *CPU* kernels
(``register("CPU")``). Call :func:`cfm_plugins.ops._backend.prepare_kernels` before a step is
compiled or captured.
"""

from __future__ import annotations

import importlib.util
import warnings

__all__ = ["available", "register", "unregister", "registered", "OPERATORS"]

#: operator name (in the cfm namespace) -> (launcher module, function)
OPERATORS = {
    "symmetric_contraction_fwd": ("symmetric_contraction", "fwd"),
    "symmetric_contraction_bwd": ("symmetric_contraction", "bwd"),
    "symmetric_contraction_bwd2": ("symmetric_contraction", "bwd2"),
    "conv_tp_fwd": ("conv_tp", "fwd"),
    "conv_tp_bwd": ("conv_tp", "bwd"),
    "conv_tp_radial_fwd": ("conv_tp_radial", "fwd"),
    "conv_tp_radial_bwd": ("conv_tp_radial", "bwd"),
    "skip_tp_fwd": ("skip_tp", "fwd"),
    "skip_tp_bwd": ("skip_tp", "bwd"),
}

_LIBS: dict[str, object] = {}


def available() -> tuple[bool, str]:
    """(whether Triton can be imported, why not)."""
    if importlib.util.find_spec("triton") is None:
        return False, (
            "triton is not installed (it comes with torch's CUDA and ROCm wheels; or pip "
            "install 'cfm-plugins[test]' on Linux)"
        )
    try:
        import triton  # noqa: F401
    except Exception as exc:  # a broken install: say so, never fall back silently
        return False, f"import triton failed: {exc}"
    return True, ""


def registered(dispatch_key: str = "CUDA") -> bool:
    """Whether the Triton launchers are the operators' kernels for ``dispatch_key``."""
    return dispatch_key in _LIBS


def register(dispatch_key: str = "CUDA") -> None:
    """Make the Triton launchers the kernels of every ``cfm::`` operator for ``dispatch_key``
    ("CUDA" on a GPU; "CPU" in the interpreter tests). The operators must be declared (the C++
    library loaded, :func:`cfm_plugins.ops._library.load`). Registering over the C++ kernels of the
    same key is intended: torch's "overriding a previously registered kernel" warning is silenced
    here; :func:`unregister` restores them. The launch settings are those of
    :func:`cfm_plugins.ops.configure`; a bad debug switch (``CFM_PLUGINS_TRITON_UNFILLED``) fails
    here, at set-up, not at a first launch.

    Only the kernels change: the schemas, fake kernels, autograd (forces, force training),
    torch.compile and the names a scripted or exported model calls stay the C++ declarations.
    :mod:`cfm_plugins.ops._backend` imports this package, never the other way. A C++ host
    loads only the C++ libraries (the skip connection has no C++ CUDA kernel: e3nn's module runs
    there). Generated source is imported from a cached file (:mod:`._codegen`): Triton refuses
    source that is not in a file, outside the interpreter."""
    if dispatch_key in _LIBS:
        return
    import torch

    from cfm_plugins.ops import _debug, _library

    ok, why = available()
    if not ok:
        raise RuntimeError(f"cfm_plugins: the Triton kernels cannot be used: {why}")
    _debug.unfilled()
    if not _library.load("cpu"):
        raise RuntimeError(
            "cfm_plugins: the Triton kernels register under the cfm:: operators, which the "
            f"compiled CPU library declares, and it is missing: {_library.BUILD_HINT}"
        )
    if dispatch_key == "CUDA" and torch.cuda.is_available():
        _library.load("cuda")  # the C++ CUDA kernels first, so that ours are the newest
    lib = torch.library.Library("cfm", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*overrid.*previously registered kernel")
        for op, (module, fn) in OPERATORS.items():
            if not hasattr(torch.ops.cfm, op):  # a library built before this operator existed
                continue
            mod = importlib.import_module(f"cfm_plugins.ops.triton.{module}")
            lib.impl(op, getattr(mod, fn), dispatch_key)
    _LIBS[dispatch_key] = lib


def unregister(dispatch_key: str = "CUDA") -> None:
    """Remove the Triton kernels for ``dispatch_key``; the C++ kernels (if loaded) run again."""
    lib = _LIBS.pop(dispatch_key, None)
    if lib is not None:
        lib._destroy()
