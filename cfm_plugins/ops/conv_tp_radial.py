"""The radial MLP's last layer fused into the conv TP's weight read (kernel ``conv_tp_radial``).

A MACE interaction block makes its conv TP's per-edge weights with e3nn's ``FullyConnectedNet``
(``conv_tp_weights``), whose last layer is linear: ``w = h @ (W / norm)`` with ``h`` [E, K] the
last hidden layer. With this kernel the block's ``conv_tp_weights`` stops at ``h``
(:class:`RadialHidden`, the same layers under the same names: the state_dict is unchanged) and its
fused conv TP (:meth:`~cfm_plugins.ops.conv_tp.FusedConvTP.use_radial`) calls
``cfm::conv_tp_radial_fwd`` / ``_bwd``, which make each block of edges' weights in a thread-local
buffer and never store ``w`` or its gradient (``cuda/conv_tp``: C++ on CPUs, Triton on GPUs).
It needs the ``conv_tp`` kernel in the same block and runs only where named
(``fused_kernels=symmetric_contraction,conv_tp,conv_tp_radial,skip_tp``): on CPUs the recomputed
weights cost more than they save (docs/benchmarks.md), and no GPU has timed it.
"""

from collections import OrderedDict

import torch

from cfm_plugins.ops.conv_tp import CONV_FUSION, FusedConvTP, is_uvu_conv_tp
from cfm_plugins.ops.kernel_types import Form, Kernel

__all__ = ["KERNEL", "RadialHidden", "is_radial_mlp"]


def _is_linear_e3nn_layer(layer) -> bool:
    """e3nn's ``FullyConnectedNet`` layer without activation (by layout, whatever e3nn version)."""
    w = getattr(layer, "weight", None)
    return (
        isinstance(layer, torch.nn.Module)
        and isinstance(w, torch.Tensor)
        and w.dim() == 2
        and getattr(layer, "act", 0) is None
        and all(hasattr(layer, a) for a in ("h_in", "var_in", "var_out"))
    )


def is_radial_mlp(m, weight_numel: int) -> bool:
    """An e3nn ``FullyConnectedNet`` (a Sequential of layers) whose last layer is linear and makes
    ``weight_numel`` weights per edge."""
    if not isinstance(m, torch.nn.Sequential) or isinstance(m, RadialHidden) or len(m) < 2:
        return False
    last = m[len(m) - 1]
    return _is_linear_e3nn_layer(last) and last.weight.shape[1] == weight_numel


class RadialHidden(torch.nn.Sequential):
    """The layers of a radial MLP, under the same names, with a forward that stops before the last
    (linear) layer: it returns ``h``, which the fused conv TP multiplies by the last layer's
    weight inside its kernels. Holds the stock MLP (``self.__dict__["_stock"]``) for
    :func:`restore`."""

    n_hidden: int

    def __init__(self, mlp: torch.nn.Sequential):
        super().__init__(OrderedDict(mlp._modules))
        self.n_hidden = len(mlp) - 1
        self.__dict__["_stock"] = mlp
        self.gpu = False

    @torch.jit.unused
    def last_layer(self) -> torch.nn.Module:
        """The linear layer the fused conv TP applies inside its kernels."""
        return self[self.n_hidden]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self):
            if i < self.n_hidden:
                x = layer(x)
        return x


def _recognise(m, parent, attr) -> bool:
    if attr != "conv_tp_weights" or parent is None:
        return False
    tp = getattr(parent, "conv_tp", None)
    fused = isinstance(tp, FusedConvTP) and getattr(parent, "conv_fusion", None) == CONV_FUSION
    if not (fused or is_uvu_conv_tp(tp)) or not hasattr(type(parent), "forward"):
        return False
    return is_radial_mlp(m, int(tp.weight_numel))


def _make(mlp, block, attr) -> RadialHidden:
    tp = block.conv_tp
    if not (isinstance(tp, FusedConvTP) and getattr(block, "conv_fusion", None) == CONV_FUSION):
        raise ValueError(
            "the radial fusion runs inside the block's fused conv TP: fuse conv_tp too "
            "(fused_kernels=auto, or name conv_tp with conv_tp_radial)"
        )
    if tp.radial:
        raise ValueError("the block's fused conv TP already takes a radial layer")
    return RadialHidden(mlp)


def _install(block, attr, hidden: RadialHidden) -> None:
    setattr(block, attr, hidden)
    block.conv_tp.use_radial(hidden.last_layer(), gpu=hidden.gpu)


def restore(hidden: RadialHidden, block, attr: str = "conv_tp_weights") -> None:
    """Put the stock radial MLP back and let the block's fused conv TP take ``tp_weights`` again."""
    setattr(block, attr, hidden.__dict__["_stock"])
    tp = getattr(block, "conv_tp", None)
    if isinstance(tp, FusedConvTP):
        tp.use_radial(None)


def _named(hidden: RadialHidden) -> None:
    hidden.gpu = True


KERNEL = Kernel(
    "conv_tp_radial",
    "the radial MLP's last layer, made inside the fused conv TP's weight read",
    (
        Form(
            "MACE block radial MLP with a fused conv_tp",
            recognise=_recognise,
            make=_make,
            install=_install,
            is_fused=lambda m, parent, attr: isinstance(m, RadialHidden),
            restore=restore,
            named=_named,
        ),
    ),
    auto=False,
)
