"""The conv TP's per-edge weight gradients on the CPU take their memory from a pool of freed blocks
(cuda/conv_tp/conv_tp_pool_cpu.cpp): a block freed is handed to the next gradient of its size,
one still in use never is, and the values do not depend on where the memory came from."""

from __future__ import annotations

import torch

from cfm_plugins.ops.conv_tp import FusedConvTP, _graph_tensors
from cfm_plugins.testing import mace_conv_tp


def _weight_grad_case(edges: int):
    torch.manual_seed(0)
    tp = mace_conv_tp("4x0e+4x1o", 2, 4, torch.float32)
    m = FusedConvTP.from_e3nn(tp)
    N = 40
    ei = torch.randint(0, N, (2, edges))
    x = torch.randn(N, tp.irreps_in1.dim).index_select(1, m._cl_perm_in).contiguous()
    y = torch.randn(edges, tp.irreps_in2.dim)
    w = torch.randn(edges, tp.weight_numel)
    tables = (_graph_tensors(ei, N), [m._tp_ints, m._tp_coef], [m._tp_ints_t, m._tp_coef_t])
    g = torch.randn(N, m._tp_meta[1])

    def weight_grad():
        return torch.ops.cfm.conv_tp_bwd(g, x, y, w, *tables, m._tp_meta, False, False, True)[2]

    return w, weight_grad


def test_a_freed_weight_gradient_block_is_reused_and_a_live_one_is_not():
    w, weight_grad = _weight_grad_case(edges=80_000)
    assert w.numel() * w.element_size() >= 8 << 20  # large enough for the pool
    first = weight_grad()
    ref, ptr = first.clone(), first.data_ptr()
    del first
    again = weight_grad()
    assert again.data_ptr() == ptr  # the freed block, its pages already touched
    other = weight_grad()
    assert other.data_ptr() != again.data_ptr()  # never a block in use
    torch.testing.assert_close(again, ref, rtol=0, atol=0)
    torch.testing.assert_close(other, ref, rtol=0, atol=0)
