"""The conv TP descriptor (ops/descriptors/conv_tp.py): CG tables of e3nn's instructions, transpose,
channel-last permutation."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import torch
from e3nn import o3

from cfm_plugins.ops.descriptors import conv_tp as desc_mod
from tests.helpers.mace_models import mace_tp


def test_descriptor_tables_and_transpose():
    tp = mace_tp("0e+1o", 3, 128)
    d, paths = desc_mod.from_e3nn(tp)
    assert d.num_paths == len(tp.instructions) == 10 and d.weight_numel == tp.weight_numel == 1280
    assert d.dim_in == tp.irreps_in1.dim and d.dim_out == tp.irreps_out.dim and d.dim_edge == 16
    # every CG entry is a nonzero of e3nn's wigner_3j times the path weight
    for p, ins in zip(paths, tp.instructions):
        w3j = o3.wigner_3j(p.l_in1, p.l_in2, p.l_out, dtype=torch.float64) * ins.path_weight
        assert len(p.entries) == int((w3j.abs() > 1e-12).sum())
        for i, j, k, c in p.entries:
            assert abs(w3j[int(i), int(j), int(k)].item() - c) < 1e-15
    t = d.transpose()
    assert (t.dim_in, t.dim_out) == (d.dim_out, d.dim_in) and t.transpose().key() == d.key()
    assert (t.pair_in == d.pair_out).all() and t.key() != d.key()


def test_channel_last_permutation_round_trip():
    irreps = [(3, 1), (2, 5), (4, 3)]
    perm = torch.as_tensor(desc_mod.channel_last_permutation(irreps))
    x = torch.arange(sum(m * d for m, d in irreps))
    assert torch.equal(x[perm][torch.argsort(perm)], x)
    # block 2 (2x l=2): channel-last row m holds component m of both channels
    assert x[perm][3:5].tolist() == [3, 8]
