"""Triton kernels of the ``cfm::`` operators, generated from the descriptors (NVIDIA and AMD GPUs).

Where this sits in the one kernel pattern (docs/architecture.md): the operators
``cfm::symmetric_contraction_{fwd,bwd,bwd2}``, ``cfm::conv_tp_{fwd,bwd}`` and
``cfm::skip_tp_{fwd,bwd}`` are declared once, in C++, with their Meta kernels and their C++
autograd. The Triton launchers here take exactly the operators' arguments and are registered as
the operators' **CUDA kernels** in a Python process that runs them (:func:`register`, called by
:func:`cfm_plugins.ops._backend.choose` when the GPU backend resolves to ``triton``; the chooser
imports this package, never the other way): the schemas, fake kernels, autograd (forces, force
training), torch.compile and the names a scripted or exported model calls stay one. A C++ host
(LAMMPS, an AOTInductor runner) loads the C++ libraries and keeps the C++ CUDA kernels (the skip
connection has none: e3nn's module runs there).

- :mod:`.symmetric_contraction`: the monomial tree of the descriptor as straight-line tile code,
  forward, backward, double backward; weight gradients reduced per element (:mod:`._reduce`).
- :mod:`.conv_tp`: the channelwise tensor product with its gather and scatter: a segmented,
  atomic-free sum over the edges of each receiver (forward) or sender (node-feature gradient,
  transposed tables), and a per-edge kernel for the edge-attribute and weight gradients.
- :mod:`.skip_tp`: the skip connection (a per-element linear map), one ``tl.dot`` GEMM tile per
  group of nodes of one element; the weight gradient per element, without atomics.
- :mod:`.configs`: tile sizes (default per kernel and dtype, autotuning alternatives) and the
  launch settings (pinned tiles, autotuning, deterministic weight gradients) that
  :func:`cfm_plugins.ops.configure` sets.
- :mod:`.aot`: ahead-of-time compilation for sm_80, sm_90, gfx90a and gfx942 without a GPU
  (``make triton-check``): compile errors, registers and spills.
- :mod:`._codegen`: generated source goes to a cached ``.py`` file and is imported (Triton refuses
  source that is not in a file, outside the interpreter).

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors: the
tests register the same launchers as the operators' *CPU* kernels there (:func:`register` with
``"CPU"``), so the path through the C++ schemas, autograd and Meta kernels is the one a GPU takes.

The default on CUDA tensors where Triton imports (``fused_backend=auto``; ``cuda`` asks for the C++
CUDA kernels): on an H100 they made the MACE-MP-medium-like train step 2.6-3.1x faster than the
C++ CUDA kernels (docs/benchmarks.md). :func:`cfm_plugins.ops._backend.prepare_kernels` builds their
tables before a step is compiled or captured.
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
    here, at set-up, not at a first launch."""
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
