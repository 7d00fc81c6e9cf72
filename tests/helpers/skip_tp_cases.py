"""Skip connections built as mace builds them (``mace.modules.wrapper_ops.
FullyConnectedTensorProduct`` of node features with the ``Ex0e`` one-hot of the elements), their
inputs, the operators' static arguments, and MACE's training pattern through one of them: what the
skip-connection tests share."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import torch
from e3nn import o3
from mace.modules.wrapper_ops import FullyConnectedTensorProduct

from cfm_plugins.ops.skip_tp import element_groups

#: (node features, output) irreps of the forms mace 0.3.16 builds: a residual block's (node
#: features -> hidden), the first layer's (embedding scalars -> hidden), a non-residual block's
#: (message -> target, l <= 3), and a mixed one (repeated irreps, several paths into one output)
FORMS = [
    ("8x0e+8x1o", "8x0e+8x1o"),
    ("8x0e", "8x0e+8x1o"),
    ("4x0e+4x1o+4x2e+4x3o", "4x0e+4x1o+4x2e+4x3o"),
    ("3x0e+5x1o+2x0e+4x2e", "6x0e+2x2e+3x1o+1x3o"),
]


def mace_skip_tp(
    irreps_in: str, irreps_out: str, elements: int, dtype=torch.float64, seed: int = 0
) -> torch.nn.Module:
    """mace's skip_tp (``FullyConnectedTensorProduct(irreps_in, Ex0e, irreps_out)``, no
    cuEquivariance) in ``dtype``, its weights drawn from a normal distribution."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        tp = FullyConnectedTensorProduct(
            o3.Irreps(irreps_in), o3.Irreps(f"{elements}x0e"), o3.Irreps(irreps_out)
        )
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        tp.weight.copy_(torch.randn(tp.weight.shape, generator=torch.Generator().manual_seed(seed)))
    return tp


def node_inputs(tp, nodes: int, dtype=torch.float64, seed: int = 1, absent=(1,)):
    """Node features ``[nodes, dim_in]`` and the one-hot of random elements (none of ``absent``,
    every other one where there are nodes enough; the first three nodes of element 0)."""
    gen = torch.Generator().manual_seed(seed)
    E = tp.irreps_in2.dim
    allowed = torch.tensor([e for e in range(E) if e not in absent] or [0])
    idx = allowed[torch.randint(0, allowed.numel(), (nodes,), generator=gen)]
    idx[: min(3, nodes)] = allowed[0]
    x = torch.randn(nodes, tp.irreps_in1.dim, generator=gen, dtype=torch.float64).to(dtype)
    return x, torch.nn.functional.one_hot(idx, E).to(dtype)


def op_args(fused, y: torch.Tensor):
    """The static arguments of the ``cfm::skip_tp_*`` operators for a fused module and a one-hot
    ``y``: ``(order, elem_ptr, desc, desc_t, meta)``."""
    order, elem_ptr = element_groups(y, fused.num_elements)
    return order, elem_ptr, *fused.operator_tables()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def training_pattern(module, weight, x, y):
    """MACE's force training through one module: its output, the gradients of an energy in the
    node features and the weights (create_graph), then the gradients of a loss on those (double
    backward), all detached."""
    x = x.clone().requires_grad_()
    out = module(x, y)
    energy = (out**2).sum() + out.sum()
    gx, gw = torch.autograd.grad(energy, (x, weight), create_graph=True)
    second = torch.autograd.grad((gx**2).sum() + 0.5 * (gw**2).sum(), (x, weight))
    return (out.detach(), gx.detach(), gw.detach()) + second
