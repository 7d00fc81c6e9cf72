"""e3nn's normalized SiLU in the radial MLPs of MACE's interaction blocks, with a lean double
backward.

A MACE interaction block computes its conv TP's per-edge weights with an e3nn ``FullyConnectedNet``
(``conv_tp_weights``: three SiLU layers of [edges, 64]) whose activation is
``normalize2mom(silu)``: ``silu(x) * cst``. In force training torch differentiates SiLU's backward
as a chain of elementwise ops and keeps four of their outputs per layer for the second backward.
:class:`LeanSiLU` computes the same ``silu(x) * cst`` through the ``cfm::silu`` operator, whose
backward keeps only (grad, x), so the train step's memory peak loses those tensors. It is not a
kernel of the kernel table: the ``conv_tp`` kernel's MACE-block form swaps the block's
radial-MLP activations when it fuses the block (:func:`swap_radial_silu`) and puts e3nn's modules
back when it restores it (:func:`restore_radial_silu`).
"""

import torch

from cfm_plugins.ops import _backend


def is_normalized_silu(m) -> bool:
    """e3nn's ``normalize2mom`` of ``torch.nn.functional.silu`` (whatever e3nn version: by
    layout)."""
    return (
        isinstance(m, torch.nn.Module)
        and getattr(m, "f", None) is torch.nn.functional.silu
        and hasattr(m, "cst")
        and hasattr(m, "_is_id")
    )


class LeanSiLU(torch.nn.Module):
    """``silu(x) * cst`` like the e3nn ``normalize2mom(silu)`` it replaces, through
    ``cfm::silu``.

    The operator (``cuda/silu/silu_ops.cpp``) has a backward that is one operator keeping only
    (grad, x): the values are torch's own silu kernels, the first derivative matches torch's to
    round-off, and the train step's memory peak loses the tensors torch's chain keeps
    (docs/benchmarks.md, ``tools/memory_peak.py``). Without the compiled library (or with
    ``CFM_PLUGINS_FORCE_TORCH=1``) it calls ``torch.nn.functional.silu``, as stock does."""

    cst: float
    scaled: bool
    use_op: bool

    def __init__(self, stock: torch.nn.Module) -> None:
        super().__init__()
        self.scaled = not bool(stock._is_id)
        self.cst = float(stock.cst)
        self.use_op = _backend.operators_available() and not _backend.disabled()

    def extra_repr(self) -> str:
        return f"cst={self.cst:.6f}, operator={'cfm::silu' if self.use_op else 'torch silu'}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.cfm.silu(x) if self.use_op else torch.nn.functional.silu(x)
        return y.mul(self.cst) if self.scaled else y


def _radial_layers(block: torch.nn.Module) -> list:
    """The layers of ``block.conv_tp_weights`` (MACE's radial MLP) that have an activation slot."""
    mlp = getattr(block, "conv_tp_weights", None)
    return (
        [layer for layer in mlp.children() if hasattr(layer, "act")]
        if isinstance(mlp, torch.nn.Module)
        else []
    )


def swap_radial_silu(block: torch.nn.Module) -> int:
    """Give the layers of ``block.conv_tp_weights`` (MACE's radial MLP) :class:`LeanSiLU`
    activations in place of e3nn's normalized SiLU; how many were swapped."""
    stock = [layer for layer in _radial_layers(block) if is_normalized_silu(layer.act)]
    for layer in stock:
        layer.act = LeanSiLU(layer.act)
    return len(stock)


def restore_radial_silu(block: torch.nn.Module) -> int:
    """Undo :func:`swap_radial_silu`: e3nn's ``normalize2mom(silu)`` again, one module shared by the
    MLP's layers as e3nn builds it, with the constant the layers had."""
    lean = [layer for layer in _radial_layers(block) if isinstance(layer.act, LeanSiLU)]
    if lean:
        from e3nn.math import normalize2mom

        stock = normalize2mom(torch.nn.functional.silu)
        stock.cst, stock._is_id = lean[0].act.cst, not lean[0].act.scaled
        for layer in lean:
            layer.act = stock
    return len(lean)
