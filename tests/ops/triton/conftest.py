"""The Triton interpreter on CPU for the tests of ``cfm_plugins.ops.triton``.

Fixture ``triton_cpu`` (module scope): ``TRITON_INTERPRET=1``, a fresh kernel cache directory, and
the Triton launchers registered as the *CPU* kernels of the ``cfm::`` operators (over the C++ ones,
which come back at the end of the module). Every call of a ``cfm::`` operator on CPU tensors then
runs the generated Triton kernels in the interpreter, through the operators' C++ schemas, C++
autograd and Meta kernels: the path a GPU takes with the ``CUDA`` registration, except the
dispatch key. ``cpp_kernels()`` (a context manager it yields) lets a test call the C++ kernels
for a reference.

The interpreter of triton before 3.7 reads a loop bound loaded from memory (``tp_segment``'s
``range(lo, hi, ...)``) with ``int()`` of a one-element array, which NumPy 2.5 refuses: the
fixture skips there, saying so (the GPU image of an H100 session had triton 3.6.0 and NumPy 2.5;
CI runs these tests with triton 3.7.1).
"""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest

from tests.helpers import import_triton


def interpreter_cannot_loop(triton_version: str) -> str | None:
    """Why this triton's interpreter cannot run a loop over bounds loaded from memory with the
    NumPy here, or None where it can (see the module docstring)."""
    import numpy as np

    release = tuple(int(p) for p in triton_version.split("+")[0].split(".")[:2] if p.isdigit())
    if release >= (3, 7):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            int(np.array([1]))
        except TypeError:
            return (
                f"the Triton {triton_version} interpreter converts a loaded loop bound with int() "
                f"of a one-element array, which NumPy {np.__version__} refuses (fixed in triton "
                "3.7): the interpreter tests need triton >= 3.7 or numpy < 2.5"
            )
    return None


@pytest.fixture(scope="module")
def triton_cpu(tmp_path_factory):
    triton = import_triton()
    why = interpreter_cannot_loop(triton.__version__)
    if why:
        pytest.skip(why)
    from cfm_plugins.ops import _library
    from cfm_plugins.ops import triton as triton_kernels

    if not _library.load("cpu"):
        pytest.fail(
            "the compiled CPU library declares the cfm:: operators and is missing: "
            f"{_library.BUILD_HINT}"
        )
    saved = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "CFM_PLUGINS_TRITON_CACHE")}
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["CFM_PLUGINS_TRITON_CACHE"] = str(tmp_path_factory.mktemp("triton_cache"))
    triton_kernels.register("CPU")

    @contextlib.contextmanager
    def cpp_kernels():
        triton_kernels.unregister("CPU")
        try:
            yield
        finally:
            triton_kernels.register("CPU")

    try:
        yield cpp_kernels
    finally:
        triton_kernels.unregister("CPU")
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
