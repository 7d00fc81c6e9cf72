"""A toy third kernel for the kernel table: it "fuses" every e3nn ``o3.Linear``.

The fused module shares the stock module's parameters, buffers and submodules (so the
state_dict is the stock one, as for the real kernels) and counts its calls before running the
stock module, so a test sees that the swap happened and that the model still computes the same.
MACE (e3nn 0.4.4) and NequIP (e3nn 0.6) both build their linear layers from ``o3.Linear``.
"""

from __future__ import annotations

import contextlib

import torch

from cfm_plugins.ops.kernel_table import Form, Kernel, register_kernel, unregister_kernel

NAME = "toy_linear"


class ToyFusedLinear(torch.nn.Module):
    """Runs the stock ``o3.Linear`` it wraps; ``calls`` counts the forwards of every instance."""

    calls = 0

    def __init__(self, stock: torch.nn.Module):
        super().__init__()
        # shared, not copied: the same keys and tensors as the stock module
        self._parameters, self._buffers, self._modules = (
            stock._parameters,
            stock._buffers,
            stock._modules,
        )
        object.__setattr__(
            self, "stock", stock
        )  # not a submodule: the state_dict stays the stock one

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return self.stock(*args, **kwargs)


def _is_linear(m, parent, attr) -> bool:
    from e3nn import o3

    return isinstance(m, o3.Linear)


TOY_KERNEL = Kernel(
    NAME,
    "e3nn o3.Linear (a toy: runs the stock module)",
    (
        Form(
            "e3nn o3.Linear",
            recognise=_is_linear,
            make=lambda m, parent, attr: ToyFusedLinear(m),
            is_fused=lambda m, parent, attr: isinstance(m, ToyFusedLinear),
            restore=lambda fused, parent, attr: setattr(parent, attr, fused.stock),
        ),
    ),
)


@contextlib.contextmanager
def toy_kernel_registered():
    """The toy kernel in the table for the duration of a ``with`` block."""
    register_kernel(TOY_KERNEL)
    try:
        yield TOY_KERNEL
    finally:
        unregister_kernel(NAME)


def fused_config(adapter: str, kernels: str):
    """A configuration with ``adapter`` and ``fused`` enabled and ``fused_kernels=kernels``, its
    plugin manager made (options checked against the kernel table, as cfm-run does)."""
    from cfm_plugins.config import Config
    from cfm_plugins.manager import create_manager

    config = Config(enabled=[adapter, "fused"], options={"fused_kernels": kernels})
    create_manager(config)
    return config
