"""The one backend chooser of the fused kernels: compiled CPU, compiled CUDA (C++ or Triton), or
pure torch.

The compiled kernels are torch operators ``cfm::<kernel>_<pass>`` declared in C++ (``cuda/``):
the library ``cfm_plugins/_C*.so`` registers every operator with its CPU and Meta kernels and its
C++ autograd; ``cfm_plugins/_C_cuda*.so`` (optional, ``CFM_PLUGINS_CUDA=1``) adds the CUDA kernels.
They are loaded with ``torch.ops.load_library``, never imported as Python modules, so the same
files serve a C++ program (LAMMPS) that loads them: :func:`library_paths` lists them.

:func:`choose` tells a module which path runs for tensors on a device. Where a library is missing
(not built, built against another torch, or ``CFM_PLUGINS_FORCE_TORCH=1``) the modules run their
pure-torch evaluation of the same descriptor; the first time that happens for a device kind, one
warning says why and how to build.

On CUDA tensors the operators' kernels are the Triton kernels generated from the descriptors
(:mod:`cfm_plugins.ops.triton`, registered as the operators' CUDA kernels, so the modules, autograd
and compiled graphs do not change) or the C++ CUDA ones. ``auto`` (the default) takes Triton where
it imports (torch's CUDA and ROCm wheels bring it) and the C++ CUDA kernels otherwise: measured on
an H100, the Triton kernels made the MACE-MP-medium-like train step 2.6-3.1x faster than the C++
CUDA ones and a ``mace_run_train`` epoch 2.9x faster (docs/benchmarks.md). ``cuda`` and ``triton``
ask for one of them; they are chosen with :func:`set_gpu_backend` (the ``fused`` plugin's
``fused_backend`` option calls it) or ``CFM_PLUGINS_GPU_BACKEND`` for any Python host. Asking for
one where it cannot run is an error, never a silent fallback.

:func:`prepare_kernels` does, before a model is compiled or captured, what the first launch of each
fused module would do inside the step (register the Triton kernels, copy the descriptors to the
host, keep device tables): a CUDA graph must not own such allocations nor make such copies.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import is_fake

log = logging.getLogger("cfm_plugins.ops")

BUILD_HINT = (
    "build them with `pip install --no-build-isolation -e .` from the cfm-plugins checkout after "
    "torch is "
    "installed (needs a C++20 compiler; add CFM_PLUGINS_CUDA=1 and nvcc for the CUDA kernels), or "
    "`python setup.py build_ext --inplace`"
)

_LIBS = {"cpu": "cfm_plugins._C", "cuda": "cfm_plugins._C_cuda"}
_LOADED: dict[str, bool] = {}
_WHY: dict[str, str] = {}
_WARNED: set[str] = set()


def disabled() -> bool:
    """``CFM_PLUGINS_FORCE_TORCH=1`` forces the pure-torch fallback (for debugging and tests)."""
    return os.environ.get("CFM_PLUGINS_FORCE_TORCH", "") == "1"


#: GPU backends: ``auto`` (Triton where it imports, else the C++ CUDA kernels), ``cuda`` (the C++
#: CUDA kernels), ``triton`` (the generated Triton kernels as the operators' CUDA kernels)
GPU_BACKENDS = ("auto", "cuda", "triton")
_GPU_BACKEND: list = [None]  # set_gpu_backend's choice (None: the environment decides)
_AUTO: dict[str, str] = {}  # what ``auto`` resolved to in this process ("triton" or "cuda")


def gpu_backend() -> str:
    """The GPU backend in force: :func:`set_gpu_backend`'s choice, else ``CFM_PLUGINS_GPU_BACKEND``,
    else ``auto``."""
    name = (
        _GPU_BACKEND[0] or os.environ.get("CFM_PLUGINS_GPU_BACKEND", "").strip().lower() or "auto"
    )
    if name not in GPU_BACKENDS:
        raise ValueError(
            f"cfm_plugins: unknown GPU backend {name!r} (CFM_PLUGINS_GPU_BACKEND or "
            "fused_backend); "
            f"choose one of {', '.join(GPU_BACKENDS)}"
        )
    return name


def set_gpu_backend(name: str | None) -> None:
    """Choose the kernels of the ``cfm::`` operators on CUDA tensors for this process (``None``:
    back to the environment). Leaving ``triton`` restores the C++ CUDA kernels."""
    if name is not None and name not in GPU_BACKENDS:
        raise ValueError(
            f"cfm_plugins: unknown GPU backend {name!r}; choose one of {', '.join(GPU_BACKENDS)}"
        )
    _GPU_BACKEND[0] = name
    effective = (
        name or os.environ.get("CFM_PLUGINS_GPU_BACKEND", "").strip().lower() or "auto"
    )  # checked when used
    if effective == "auto":
        effective = _AUTO.get("auto", "triton")  # not resolved yet: nothing was registered for it
    if effective != "triton":
        from cfm_plugins.ops import triton as triton_kernels

        triton_kernels.unregister("CUDA")


def resolved_gpu_backend() -> str:
    """``"triton"`` or ``"cuda"``: the kernels that run on CUDA tensors, ``auto`` resolved."""
    name = gpu_backend()
    return _auto_backend() if name == "auto" else name


def _auto_backend() -> str:
    """What ``auto`` means here: Triton where it imports (checked once per process), else the C++
    CUDA kernels. Reads no environment, so it cannot fail."""
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
    device tables kept for later launches), outside the compiled region. The number of modules."""
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
    in its cache, which later runs (and other ranks) load. Measured on an H200
    (docs/benchmarks.md)."""
    from triton import knobs

    return (
        f"each compiles at its first launch, and is kept in Triton's cache ({knobs.cache.dir}; "
        "TRITON_CACHE_DIR moves it, e.g. to a shared file system for a cluster's nodes): on an "
        "H200 the first validation pass of a two-layer MACE took 16.8 s with nothing cached, "
        "4.2 s with the kernels cached"
    )


def _library_file(kind: str) -> Path | None:
    spec = importlib.util.find_spec(_LIBS[kind])
    return Path(spec.origin) if spec is not None and spec.origin else None


def library_paths(cuda: bool = False) -> list[str]:
    """Files a C++ program must load (``dlopen``, or ``torch.ops.load_library``) before it runs a
    scripted or AOT-compiled model that calls ``cfm::`` operators: the CPU library, then the CUDA
    one."""
    kinds = ["cpu"] + (["cuda"] if cuda else [])
    paths = [_library_file(k) for k in kinds]
    missing = [k for k, p in zip(kinds, paths) if p is None]
    if missing:
        raise RuntimeError(
            f"the compiled {'/'.join(missing)} operator library is not built: {BUILD_HINT}"
        )
    return [str(p) for p in paths]


def load(kind: str = "cpu") -> bool:
    """Load the operator library of ``kind`` ("cpu" or "cuda") once; whether it is available."""
    if kind not in _LOADED:
        ok, why = False, ""
        if kind == "cuda" and not load("cpu"):
            why = "the CPU library (which declares the operators) is missing"
        else:
            path = _library_file(kind)
            if path is None:
                why = f"{_LIBS[kind]} is not built"
            else:
                try:
                    torch.ops.load_library(str(path))
                    ok = True
                except OSError as exc:  # built against another torch, or a missing runtime
                    why = (
                        f"{path.name} does not load ({exc}); "
                        f"rebuild it against torch {torch.__version__}"
                    )
        _LOADED[kind], _WHY[kind] = ok, why
    return _LOADED[kind]


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
    """Give a fused module about to be scripted the note :func:`operator_note` as its attribute
    ``cfm_plugins_operators`` (the fused modules call this from ``__prepare_scriptable__``, which
    ``torch.jit.script`` runs on every module first, also inside e3nn's and mace's scripting). The
    scripted model keeps it, and the saved archive holds it in its ``data.pkl``."""
    module.cfm_plugins_operators = operator_note(kernel)
    return module


def operator_note(kernel: str) -> str:
    """What a scripted model holding a fused ``kernel`` needs, as the sentence it carries.

    A scripted fused module calls ``cfm::<kernel>_*`` operators; ``torch.jit.load`` of it in a
    process without our library fails with torch's "Unknown builtin op: cfm::..." and nothing
    more: the note names the library, the torch it was built against and how to load it.
    """
    from cfm_plugins import __version__

    files = [
        p.name
        for p in (_library_file("cpu"), _library_file("cuda") if _LOADED.get("cuda") else None)
        if p
    ]
    return (
        f"cfm-plugins {__version__}: this model calls the cfm::{kernel}_* operators of the "
        "compiled library "
        f"{' and '.join(files) or 'cfm_plugins/_C'} (cfm_plugins.library_paths()), built against "
        "torch "
        f"{torch.__version__}. Load it before torch.jit.load, in a process with that torch "
        "version: "
        "cfm_plugins.load_library() in Python; a C++ program (LAMMPS) loads the files of "
        "cfm_plugins.library_paths() first (e.g. LD_PRELOAD)."
    )


def operators_available() -> bool:
    """Whether the ``cfm::`` operators are declared (the CPU library is loaded)."""
    return load("cpu")


def choose(device: torch.device) -> str:
    """ "cpu", "cuda" or "torch": which implementation runs for tensors on ``device``."""
    kind = device.type
    if kind not in _LIBS or disabled():
        return "torch"
    if kind == "cuda" and resolved_gpu_backend() == "triton":
        _triton_on_cuda()
        return kind
    if load(kind):
        return kind
    if kind not in _WARNED:
        _WARNED.add(kind)
        msg = (
            f"cfm_plugins: the compiled {kind.upper()} kernels are not available ({_WHY[kind]}); "
            "the fused "
            f"modules run their pure-torch fallback on {kind} (exact, slower). To use them, "
            f"{BUILD_HINT}."
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
