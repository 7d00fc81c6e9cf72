"""The Triton interpreter on CPU for the tests of ``cfm_plugins.ops.triton``.

Fixture ``triton_cpu`` (module scope): ``TRITON_INTERPRET=1``, a fresh kernel cache directory, and
the Triton launchers registered as the *CPU* kernels of the ``cfm::`` operators (over the C++ ones,
which come back at the end of the module). Every call of a ``cfm::`` operator on CPU tensors then
runs the generated Triton kernels in the interpreter, through the operators' C++ schemas, C++
autograd and Meta kernels: the path a GPU takes with the ``CUDA`` registration, except the
dispatch key. ``cpp_kernels()`` (a context manager it yields) lets a test call the C++ kernels
for a reference.
"""
from __future__ import annotations

import contextlib
import os

import pytest

from tests.helpers import import_triton


@pytest.fixture(scope="module")
def triton_cpu(tmp_path_factory):
    import_triton()
    from cfm_plugins.ops import _backend
    from cfm_plugins.ops import triton as triton_kernels

    if not _backend.load("cpu"):
        pytest.fail(f"the compiled CPU library declares the cfm:: operators and is missing: {_backend.BUILD_HINT}")
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
