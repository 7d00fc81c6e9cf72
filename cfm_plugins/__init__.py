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

__version__ = "0.2.0"

__all__ = ["__version__", "library_paths", "load_library"]


def library_paths(cuda: bool = False) -> list[str]:
    """The compiled ``cfm::`` operator libraries a C++ program (LAMMPS, an AOTInductor runner) must
    load before it runs a scripted or exported fused model.

    A scripted model calls our operators by name, and only a loaded library declares them: a
    process without it fails at ``torch.jit.load`` with "Unknown builtin op: cfm::...".

    Args:
        cuda: also the CUDA library (built with ``CFM_PLUGINS_CUDA=1``).

    Returns:
        The paths: the CPU library (it declares every operator) first, then the CUDA one.

    Raises:
        RuntimeError: a library asked for is not built; the message says how to build it.
    """
    from cfm_plugins.ops import _library

    return _library.library_paths(cuda=cuda)


def load_library(cuda: bool | None = None) -> list[str]:
    """Load the ``cfm::`` operators into this process (``torch.ops.load_library``), e.g. before
    ``torch.jit.load`` of a fused model, without importing the fused modules, e3nn or mace.

    Args:
        cuda: also the CUDA library: ``True`` always, ``False`` never, ``None`` (default) where it
            is built and a GPU is visible. The CPU library is always loaded (it declares every
            operator).

    Returns:
        The paths loaded, as :func:`library_paths` gives them.

    Raises:
        RuntimeError: a library asked for is missing or does not load (e.g. built against
            another torch); the message says why and how to build it.
    """
    from cfm_plugins.ops import _library

    if cuda is None:
        import torch

        cuda = _library.library_file("cuda") is not None and torch.cuda.is_available()
    paths = _library.library_paths(cuda=cuda)  # raises with the build hint if one is not built
    for kind in ["cpu"] + (["cuda"] if cuda else []):
        if not _library.load(kind):
            raise RuntimeError(
                f"the compiled {kind.upper()} operator library does not load "
                f"({_library.why_not_loaded(kind)}): {_library.BUILD_HINT}"
            )
    return paths
