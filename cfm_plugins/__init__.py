"""cfm-plugins: fast training of chemistry foundation models inside the users' own trainers.

Features (each a plugin, enabled by name): ``binpack`` (the bin-packing batch sampler, see
:mod:`cfm_plugins.sampler`) and ``fused`` (compiled fused equivariant kernels, see
:mod:`cfm_plugins.ops`). Trainer adapters (``mace``) are plugins too. The hooks are in
:mod:`cfm_plugins.hookspec`; docs/architecture.md describes the layers.

Two public functions for exported models (docs/export.md): :func:`library_paths` names the
compiled operator libraries a C++ program loads, :func:`load_library` loads them into this
process. Both import torch only when called, so ``import cfm_plugins`` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "library_paths", "load_library"]


def library_paths(cuda: bool = False) -> list[str]:
    """The compiled ``cfm::`` operator libraries a C++ program (LAMMPS, an AOTInductor runner) must
    load before a scripted or exported fused model: the CPU library, then with ``cuda=True`` the
    CUDA one. Raises RuntimeError, saying how to build them, when one is not built."""
    from cfm_plugins.ops import _backend

    return _backend.library_paths(cuda=cuda)


def load_library(cuda: bool | None = None) -> list[str]:
    """Load the ``cfm::`` operators into this process with ``torch.ops.load_library``, e.g. before
    ``torch.jit.load`` of a fused model, without importing the fused modules, e3nn or mace.

    The CPU library always (it declares every operator); the CUDA one with ``cuda=True``, or with
    ``cuda=None`` (default) when it is built and a GPU is visible. Returns the paths loaded.
    Raises RuntimeError, saying how to build, when a library asked for is missing or does not load
    (e.g. built against another torch)."""
    from cfm_plugins.ops import _backend

    if cuda is None:
        import torch

        cuda = _backend._library_file("cuda") is not None and torch.cuda.is_available()
    paths = _backend.library_paths(cuda=cuda)  # raises with the build hint if one is not built
    for kind in ["cpu"] + (["cuda"] if cuda else []):
        if not _backend.load(kind):
            raise RuntimeError(
                f"the compiled {kind.upper()} operator library does not load "
                f"({_backend._WHY[kind]}): {_backend.BUILD_HINT}"
            )
    return paths
