"""The compiled ``cfm::`` operator libraries: where they are, loading them once, what a scripted
model that calls them must say.

The compiled kernels are torch operators ``cfm::<kernel>_<pass>`` declared in C++ (``cuda/``):
``cfm_plugins/_C*.so`` registers every operator with its CPU and Meta kernels and its C++
autograd; ``cfm_plugins/_C_cuda*.so`` (optional, built with ``CFM_PLUGINS_CUDA=1``) adds the CUDA
kernels. They are loaded with ``torch.ops.load_library``, never imported as Python modules, so the
same files serve a C++ program (LAMMPS, an AOTInductor runner) that loads them:
:func:`library_paths` lists them.

A leaf of :mod:`cfm_plugins.ops`: it imports nothing else of the package, so the backend chooser
(:mod:`._backend`), the Triton kernels (:mod:`.triton`) and :mod:`.patching` can all load the
library without importing each other.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

__all__ = [
    "BUILD_HINT",
    "library_file",
    "library_paths",
    "load",
    "loaded",
    "why_not_loaded",
    "operators_available",
    "operator_note",
]

BUILD_HINT = (
    "build them with `pip install --no-build-isolation -e .` from the cfm-plugins checkout after "
    "torch is installed (needs a C++20 compiler; add CFM_PLUGINS_CUDA=1 and nvcc for the CUDA "
    "kernels), or `python setup.py build_ext --inplace`"
)

_LIBS = {"cpu": "cfm_plugins._C", "cuda": "cfm_plugins._C_cuda"}
_LOADED: dict[str, bool] = {}
_WHY: dict[str, str] = {}


def library_file(kind: str) -> Path | None:
    """The built library of ``kind`` ("cpu" or "cuda"), or None where it is not built."""
    spec = importlib.util.find_spec(_LIBS[kind])
    return Path(spec.origin) if spec is not None and spec.origin else None


def library_paths(cuda: bool = False) -> list[str]:
    """The files a C++ program loads (``dlopen``, or ``torch.ops.load_library``) before it runs a
    scripted or AOT-compiled model that calls ``cfm::`` operators.

    Args:
        cuda: also the CUDA library (built with ``CFM_PLUGINS_CUDA=1``).

    Returns:
        Their paths: the CPU library (which declares every operator) first, then the CUDA one.

    Raises:
        RuntimeError: a library asked for is not built (the message says how to build it).
    """
    kinds = ["cpu"] + (["cuda"] if cuda else [])
    paths = [library_file(k) for k in kinds]
    missing = [k for k, p in zip(kinds, paths) if p is None]
    if missing:
        raise RuntimeError(
            f"the compiled {'/'.join(missing)} operator library is not built: {BUILD_HINT}"
        )
    return [str(p) for p in paths]


def load(kind: str = "cpu") -> bool:
    """Load the library of ``kind`` ("cpu" or "cuda") into this process, once; whether it is
    loaded. Never raises: :func:`why_not_loaded` says why not (not built, or built against
    another torch)."""
    if kind not in _LOADED:
        ok, why = False, ""
        if kind == "cuda" and not load("cpu"):
            why = "the CPU library (which declares the operators) is missing"
        else:
            path = library_file(kind)
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


def loaded(kind: str) -> bool:
    """Whether the library of ``kind`` was loaded (without trying to load it)."""
    return _LOADED.get(kind, False)


def why_not_loaded(kind: str) -> str:
    """Why :func:`load` of ``kind`` failed ("" where it did not, or was not tried)."""
    return _WHY.get(kind, "")


def operators_available() -> bool:
    """Whether the ``cfm::`` operators are declared (the CPU library is loaded)."""
    return load("cpu")


def operator_note(kernel: str) -> str:
    """What a scripted model holding a fused ``kernel`` needs, as the sentence it carries.

    A scripted fused module calls ``cfm::<kernel>_*`` operators; ``torch.jit.load`` of it in a
    process without our library fails with torch's "Unknown builtin op: cfm::..." and nothing
    more: the note names the library, the torch it was built against and how to load it.
    """
    from cfm_plugins import __version__

    files = [
        p.name for p in (library_file("cpu"), library_file("cuda") if loaded("cuda") else None) if p
    ]
    return (
        f"cfm-plugins {__version__}: this model calls the cfm::{kernel}_* operators of the "
        f"compiled library {' and '.join(files) or 'cfm_plugins/_C'} "
        f"(cfm_plugins.library_paths()), built against torch {torch.__version__}. Load it before "
        "torch.jit.load, in a process with that torch version: cfm_plugins.load_library() in "
        "Python; a C++ program (LAMMPS) loads the files of cfm_plugins.library_paths() first "
        "(e.g. LD_PRELOAD)."
    )
