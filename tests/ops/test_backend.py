"""The backend chooser's GPU backend (``cfm_plugins.ops._backend``): the Triton kernels by default
where Triton imports (``auto``), else the C++ CUDA kernels; either when asked (``set_gpu_backend``,
``cfm_plugins.ops.configure``, the ``fused`` plugin's ``fused_backend`` option). Triton's are
registered as the operators' CUDA kernels and removed again. The library loading lives in a leaf
module of its own (``_library``), which the Triton package imports instead of the chooser.

Registering a CUDA kernel is a dispatcher entry: it needs no GPU, so this runs on any machine;
what it registers runs only on a GPU (tests/ops/triton run the same launchers on CPU tensors in the
Triton interpreter).
"""

from __future__ import annotations

import logging

import pytest
import torch

from cfm_plugins.config import Config
from cfm_plugins.manager import create_manager
from cfm_plugins.ops import _backend, configure, settings
from cfm_plugins.ops import triton as triton_kernels
from tests.helpers import import_triton

OPS = (
    "symmetric_contraction_fwd",
    "symmetric_contraction_bwd",
    "symmetric_contraction_bwd2",
    "conv_tp_fwd",
    "conv_tp_bwd",
)
needs_ops = pytest.mark.skipif(
    not _backend.operators_available(), reason="the compiled cfm:: operator library is not built"
)


def cuda_kernel_is_triton(op: str) -> bool:
    """Whether the CUDA kernel of cfm::<op> is registered from cfm_plugins/ops/triton."""
    dump = torch._C._dispatch_dump(f"cfm::{op}")
    line = next((ln for ln in dump.splitlines() if ln.startswith("CUDA")), "")
    return "cfm_plugins/ops/triton" in line


@pytest.fixture
def clean_backend():
    _backend._AUTO.clear()
    _backend.set_gpu_backend(None)
    yield
    _backend.set_gpu_backend(None)
    triton_kernels.unregister("CUDA")
    _backend._AUTO.clear()


def test_gpu_backend_is_the_setters_choice(clean_backend):
    """The backend is set (the ``fused_backend`` option, ``configure``); a bad name changes
    nothing."""
    assert _backend.gpu_backend() == "auto"
    _backend.set_gpu_backend("cuda")
    assert _backend.gpu_backend() == "cuda"
    with pytest.raises(ValueError, match="unknown GPU backend 'rocm'; choose one of auto, cuda"):
        _backend.set_gpu_backend("rocm")
    assert _backend.gpu_backend() == "cuda"  # a refused value changes nothing
    _backend.set_gpu_backend(None)
    assert _backend.gpu_backend() == "auto"
    with pytest.raises(ValueError, match="backend='hip': expected one of auto, cuda, triton"):
        configure(backend="hip", tiles="tp_edge=8x32/w8")
    assert settings()["tiles"] == ""  # checked before anything is set


@needs_ops
def test_triton_backend_becomes_the_operators_cuda_kernels_and_goes_away(clean_backend):
    import_triton()
    _backend.set_gpu_backend("triton")
    assert _backend.choose(torch.device("cuda")) == "cuda"
    assert all(cuda_kernel_is_triton(op) for op in OPS)
    assert _backend.choose(torch.device("cpu")) == "cpu"  # CPU tensors keep the C++ CPU kernels
    assert "cfm_plugins/ops/triton" not in next(
        ln
        for ln in torch._C._dispatch_dump("cfm::conv_tp_fwd").splitlines()
        if ln.startswith("CPU")
    )
    _backend.set_gpu_backend("cuda")  # leaving triton restores whatever CUDA kernels were there
    assert not any(cuda_kernel_is_triton(op) for op in OPS)


@needs_ops
def test_the_triton_backend_says_once_that_kernels_compile_at_first_launch_and_where_kept(
    clean_backend, monkeypatch, caplog, tmp_path
):
    """A first run on a GPU compiles every kernel (an H200's first validation pass took 4x as long):
    the log says so once, with the cache later runs load them from, as TRITON_CACHE_DIR sets it."""
    import_triton()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "kernels"))
    with caplog.at_level(logging.INFO, logger="cfm_plugins.ops"):
        _backend.set_gpu_backend("triton")
        _backend.choose(torch.device("cuda"))
        _backend.choose(torch.device("cuda"))
    said = [
        r.getMessage() for r in caplog.records if "Triton kernels on CUDA tensors" in r.getMessage()
    ]
    assert len(said) == 1, said
    assert "first launch" in said[0] and f"({tmp_path / 'kernels'};" in said[0]


@needs_ops
def test_auto_is_triton_where_it_imports_else_the_cpp_cuda_kernels(clean_backend, monkeypatch):
    import_triton()
    assert _backend.gpu_backend() == "auto" and _backend.resolved_gpu_backend() == "triton"
    assert _backend.choose(torch.device("cuda")) == "cuda" and all(
        cuda_kernel_is_triton(op) for op in OPS
    )
    _backend.set_gpu_backend("auto")  # still triton: stays registered
    assert all(cuda_kernel_is_triton(op) for op in OPS)
    _backend.set_gpu_backend("cuda")
    assert not any(cuda_kernel_is_triton(op) for op in OPS)
    _backend._AUTO.clear()
    monkeypatch.setattr(
        triton_kernels, "available", lambda: (False, "triton is not installed (test)")
    )
    _backend.set_gpu_backend(None)
    assert _backend.resolved_gpu_backend() == "cuda"  # resolved once per process, no error
    _backend.choose(torch.device("cuda"))
    assert not any(cuda_kernel_is_triton(op) for op in OPS)


@needs_ops
def test_triton_asked_for_but_unusable_is_an_error_not_a_fallback(clean_backend, monkeypatch):
    monkeypatch.setattr(
        triton_kernels, "available", lambda: (False, "triton is not installed (test)")
    )
    _backend.set_gpu_backend("triton")
    with pytest.raises(
        RuntimeError, match="Triton kernels cannot be used: triton is not installed"
    ):
        _backend.choose(torch.device("cuda"))


@needs_ops
def test_fused_backend_option_reaches_the_chooser_at_start(clean_backend):
    import_triton()
    with pytest.raises(ValueError, match="fused_backend"):
        create_manager(Config(enabled=["fused"], options={"fused_backend": "opencl"}))
    assert _backend.gpu_backend() == "auto"
    config = Config(
        enabled=["fused"], options={"fused_backend": "triton", "fused_kernels": "conv_tp"}
    )
    pm = create_manager(config)  # cfm_configure hands the options to cfm_plugins.ops.configure
    assert _backend.gpu_backend() == "triton"
    pm.hook.cfm_patch_model(model=torch.nn.Linear(2, 2), config=config)
    assert _backend.choose(torch.device("cuda")) == "cuda" and cuda_kernel_is_triton("conv_tp_fwd")
