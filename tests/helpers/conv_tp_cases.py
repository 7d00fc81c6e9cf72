"""Random graphs and inputs for the conv TP + scatter tests of every backend (C++ and Triton), and
the reference they are checked against: e3nn's TensorProduct on gathered senders +
``scatter_sum``."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import torch
from mace.tools.scatter import scatter_sum


def graph(num_nodes: int, num_edges: int, seed: int = 0, isolated=()) -> torch.Tensor:
    """A random ``[2, num_edges]`` edge index over ``num_nodes`` nodes; the nodes in ``isolated``
    have no edge (their sums must come out zero)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([n for n in range(num_nodes) if n not in set(isolated)])
    return allowed[torch.randint(0, len(allowed), (2, num_edges), generator=g)]


def inputs(tp, num_nodes: int, num_edges: int, dtype, seed: int = 1, requires_grad: bool = False):
    """Node features ``x``, edge attributes ``y`` and per-edge weights ``w`` for ``tp``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, tp.irreps_in1.dim, generator=g, dtype=dtype)
    y = torch.randn(num_edges, tp.irreps_in2.dim, generator=g, dtype=dtype)
    w = torch.randn(num_edges, tp.weight_numel, generator=g, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (x, y, w)]


def reference(tp, x, y, w, edge_index):
    """The stock path: e3nn's TensorProduct on gathered sender features, summed at the receivers."""
    return scatter_sum(tp(x[edge_index[0]], y, w), edge_index[1], dim=0, dim_size=x.shape[0])


def op_args(fused, x, edge_index):
    """The ``cfm::conv_tp_*`` operator arguments the module builds: channel-last x, the CSR graph,
    the tables."""
    from cfm_plugins.ops.conv_tp import edge_csr

    csr = edge_csr(edge_index, x.shape[0])
    graph_t = [csr.sender, csr.receiver, csr.rperm, csr.rptr, csr.sperm, csr.sptr]
    xc = x if fused._identity_in else x.index_select(1, fused._cl_perm_in)
    return xc.detach().contiguous(), graph_t, *fused.operator_tables()


def edge_gradients(g, xc, y, w, g_t, desc, desc_t, meta, subsets) -> list:
    """What ``cfm::conv_tp_bwd`` returns for each ``(need_x, need_y, need_w)`` of ``subsets``: the
    gradients asked for, in order (each subset launches its own kernel variant)."""
    import torch

    return [
        t
        for need in subsets
        for t, wanted in zip(
            torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, *need), need
        )
        if wanted
    ]


def rel_err(a, b) -> float:
    """Largest absolute difference relative to the largest reference entry."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()
