"""The one backend chooser of the fused kernels: compiled CPU, compiled CUDA (C++ or Triton), or
pure torch.

The compiled kernels are the ``cfm::`` torch operators of the C++ libraries, which
:mod:`cfm_plugins.ops._library` finds and loads. :func:`choose` tells a module which path runs for
tensors on a device. Where a library is missing (not built, built against another torch, or the
debug switch ``CFM_PLUGINS_FORCE_TORCH=1``) the modules run their pure-torch evaluation of the same
descriptor; the first time that happens for a device kind, one warning says why and how to build.

On CUDA tensors the operators' kernels are the Triton kernels (:mod:`cfm_plugins.ops.triton`,
registered as the operators' CUDA kernels) or the C++ CUDA ones. ``auto`` (the default) takes
Triton where it imports (torch's CUDA and ROCm wheels bring it; the faster: docs/gpu.md), else the
C++ CUDA kernels; ``cuda`` and ``triton`` ask for one (:func:`set_gpu_backend`, option
``fused_backend``), and asking for one where it cannot run is an error, never a silent fallback.
:func:`prepare_kernels` does before a model is compiled or captured what a first launch would.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch._subclasses.fake_tensor import is_fake

from cfm_plugins.ops import _debug, _library
from cfm_plugins.ops._library import BUILD_HINT, library_paths, load, operators_available

__all__ = [
    "GPU_BACKENDS",
    "BUILD_HINT",
    "choose",
    "declare_operators",
    "disabled",
    "gpu_backend",
    "library_paths",
    "load",
    "operators_available",
    "prepare_kernels",
    "resolved_gpu_backend",
    "runs_triton",
    "set_gpu_backend",
    "tracing",
]

log = logging.getLogger("cfm_plugins.ops")

_WARNED: set[str] = set()


def disabled() -> bool:
    """Whether the debug switch ``CFM_PLUGINS_FORCE_TORCH=1`` forces the pure-torch fallback (read
    once per process: :func:`cfm_plugins.ops._debug.reread`)."""
    return _debug.force_torch()


#: GPU backends: ``auto`` (Triton where it imports, else the C++ CUDA kernels), ``cuda`` (the C++
#: CUDA kernels), ``triton`` (the generated Triton kernels as the operators' CUDA kernels)
GPU_BACKENDS = ("auto", "cuda", "triton")
_GPU_BACKEND: list = ["auto"]  # set_gpu_backend's choice
_AUTO: dict[str, str] = {}  # what ``auto`` resolved to in this process ("triton" or "cuda")


def gpu_backend() -> str:
    """The GPU backend in force (:func:`set_gpu_backend`'s choice; ``auto`` until then)."""
    return _GPU_BACKEND[0]


def set_gpu_backend(name: str | None) -> None:
    """Choose the kernels of the ``cfm::`` operators on CUDA tensors for this process.

    Args:
        name: one of :data:`GPU_BACKENDS`; ``None`` is ``auto``. Leaving ``triton`` restores the
            C++ CUDA kernels.

    Raises:
        ValueError: ``name`` is none of them.
    """
    name = "auto" if name is None else name
    if name not in GPU_BACKENDS:
        raise ValueError(
            f"cfm_plugins: unknown GPU backend {name!r}; choose one of {', '.join(GPU_BACKENDS)}"
        )
    _GPU_BACKEND[0] = name
    effective = _AUTO.get("auto", "triton") if name == "auto" else name  # auto not resolved yet:
    if effective != "triton":  # nothing was registered for it
        from cfm_plugins.ops import triton as triton_kernels

        triton_kernels.unregister("CUDA")


def resolved_gpu_backend() -> str:
    """``"triton"`` or ``"cuda"``: the kernels that run on CUDA tensors, ``auto`` resolved."""
    name = gpu_backend()
    return _auto_backend() if name == "auto" else name


def _auto_backend() -> str:
    """What ``auto`` means here: Triton where it imports (checked once per process), else the C++
    CUDA kernels. It cannot fail."""
    if "auto" not in _AUTO:
        from cfm_plugins.ops import triton as triton_kernels

        ok, why = triton_kernels.available()
        _AUTO["auto"] = "triton" if ok else "cuda"
        if not ok:
            log.info(
                "cfm_plugins: the fused operators use the C++ CUDA kernels on GPUs (Triton: %s)",
                why,
            )
    return _AUTO["auto"]


def runs_triton(device: torch.device) -> bool:
    """Whether the operators run (:func:`choose`, which registers Triton's kernels where they are
    chosen) and run the Triton kernels for tensors on ``device`` (on CUDA as chosen; on CPU only in
    the interpreter tests, which register them for the CPU key). What a fused module's
    ``prepare_kernels`` asks first."""
    if choose(device) == "torch":
        return False
    from cfm_plugins.ops import triton as triton_kernels

    return triton_kernels.registered("CUDA" if device.type == "cuda" else "CPU")


def prepare_kernels(model: torch.nn.Module) -> int:
    """Call ``prepare_kernels()`` of every fused module of ``model`` (the static path does it before
    compiling or capturing the step): choose and register their kernels for the device of their
    buffers and build the tables a first launch would (a device-to-host copy of the descriptors,
    device tables kept for later launches), outside the compiled region: a CUDA graph must not
    own such allocations nor make such copies. The number of modules."""
    n = 0
    with torch.no_grad():
        for module in model.modules():
            prepare = getattr(type(module), "prepare_kernels", None)
            if callable(prepare):
                prepare(module)
                n += 1
    return n


def _triton_on_cuda() -> None:
    """Register the Triton kernels as the operators' CUDA kernels (once); an error says why not."""
    from cfm_plugins.ops import triton as triton_kernels

    if not triton_kernels.registered("CUDA"):
        triton_kernels.register("CUDA")
        log.info(
            "cfm_plugins: the cfm:: operators run their Triton kernels on CUDA tensors; %s",
            _first_use_note(),
        )


def _first_use_note() -> str:
    """What a first run on a GPU pays: Triton compiles each kernel at its first launch and keeps it
    in its cache, which later runs (and other ranks) load (docs/gpu.md)."""
    from triton import knobs

    return (
        f"each compiles at its first launch, and is kept in Triton's cache ({knobs.cache.dir}; "
        "TRITON_CACHE_DIR moves it, e.g. to a shared file system for a cluster's nodes; what a "
        "first run pays: docs/gpu.md)"
    )


def declare_operators() -> bool:
    """Load what is built (CPU library; the CUDA one where a GPU is visible) so the ``cfm::``
    operators exist before a model is scripted, exported or unpickled. Called on import of the
    fused modules; silent (``choose`` warns when a missing library is actually needed)."""
    ok = load("cpu")
    if ok and torch.cuda.is_available():
        load("cuda")
        _auto_backend()  # resolve ``auto`` here, never first inside a traced forward
    return ok


def carry_operator_note(module: torch.nn.Module, kernel: str) -> torch.nn.Module:
    """Give a fused module about to be scripted the note :func:`~._library.operator_note` as its
    attribute ``cfm_plugins_operators`` (the fused modules call this from
    ``__prepare_scriptable__``, which ``torch.jit.script`` runs on every module first, also inside
    e3nn's and mace's scripting). The scripted model keeps it, and the saved archive holds it in
    its ``data.pkl``."""
    module.cfm_plugins_operators = _library.operator_note(kernel)
    return module


def choose(device: torch.device) -> str:
    """ "cpu", "cuda" or "torch": which implementation runs for tensors on ``device``."""
    kind = device.type
    if kind not in ("cpu", "cuda") or disabled():
        return "torch"
    if kind == "cuda" and resolved_gpu_backend() == "triton":
        _triton_on_cuda()
        return kind
    if load(kind):
        return kind
    if kind not in _WARNED:
        _WARNED.add(kind)
        msg = (
            f"cfm_plugins: the compiled {kind.upper()} kernels are not available "
            f"({_library.why_not_loaded(kind)}); the fused modules run their pure-torch fallback "
            f"on {kind} (exact, slower). To use them, {BUILD_HINT}."
        )
        if kind == "cuda":
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
        else:
            log.warning(msg)
    return "torch"


def tracing(t: torch.Tensor) -> bool:
    """Whether ``t`` is being traced (torch.compile, torch.export, or ``make_fx`` with fake tensors,
    as nequip-compile and energy+forces export do): the modules then skip data-dependent input
    checks and caches keyed on storage. Called on every forward: no import here."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or is_fake(t)
