"""benchmarks/efficiency.py: the FLOP and byte counts of each kernel against a hand count on a tiny
descriptor, and a smoke run that checks the table's structure (no speed is asserted)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import efficiency
from tests.helpers import ROOT, clean_env
from tests.helpers.records import check_record, rows_of


def _one_path_descriptor():
    """2x1o (x) 1o -> 2x0e, one uvu path: the 3j symbol of (1, 1, 0) is diagonal, so three
    entries (i = j, k = 0), each its own pair (i, k); two channels per pair."""
    from cfm_plugins.ops.descriptors.conv_tp import build

    desc, _ = build(
        [(2, 1)],
        [(1, 1)],
        [(2, 0)],
        [(0, 0, 0, "uvu", True, 1.0)],
        lambda a, b, c: np.eye(3).reshape(3, 3, 1) / math.sqrt(3),
    )
    return desc


def test_conv_tp_counts_of_one_path_equal_a_hand_count():
    desc = _one_path_descriptor()
    assert (desc.num_entries, desc.num_pairs, desc.dim_in, desc.dim_out) == (3, 3, 6, 2)
    nodes, edges = 4, 5
    costs = efficiency.conv_tp_costs(desc, nodes, edges, itemsize=4)
    # per edge and pass: 3 entries x multiply-add + 3 pairs x 2 channels x (multiply, multiply-add)
    per_pass = 3 * 2 + 3 * 2 * 3
    assert costs["forward"].flops == edges * per_pass == 120
    assert costs["backward"].flops == 3 * 120  # transposed pass + edge pass of gy and gw
    assert costs["double backward"].flops == 9 * 120
    x, y, w, out = nodes * 6, edges * 3, edges * 2, nodes * 2  # elements of each tensor
    index = 2 * edges * 8  # sender and receiver, int64
    assert costs["forward"].bytes == 4 * (x + y + w + out) + index == 308
    assert costs["backward"].bytes == 4 * (out + 2 * (x + y + w)) + index == 504
    assert costs["double backward"].bytes == 4 * (2 * out + 3 * (x + y + w)) + index == 732
    assert costs["forward"].intensity == pytest.approx(120 / 308)


def test_conv_tp_radial_counts_add_the_weight_gemms_to_the_conv_tp_passes():
    desc = _one_path_descriptor()
    nodes, edges, hidden = 4, 5, 3
    costs = efficiency.conv_tp_radial_costs(desc, nodes, edges, hidden, itemsize=4)
    u, G = 120, 2 * edges * hidden * 2  # the conv TP's pass (above); h [5, 3] @ wr [3, 2]
    assert costs["forward"].flops == u + G
    assert costs["backward"].flops == 3 * u + 3 * G
    assert costs["double backward"].flops == 10 * u + 12 * G
    x, y, h, wr, out = nodes * 6, edges * 3, edges * hidden, hidden * 2, nodes * 2
    assert costs["forward"].bytes == 4 * (x + y + h + wr + out) + 2 * edges * 8


def test_symmetric_contraction_counts_of_a_two_monomial_descriptor_equal_a_hand_count():
    import torch

    from cfm_plugins.ops.descriptors.symmetric_contraction import build_descriptor

    # one scalar output irrep, two components of x (num_ell 2), correlation 2 with one weight
    # each: U_1 keeps x[0], U_2 keeps x[0] x[1]; the monomials are x0 and x0*x1 (parent x0)
    u1 = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    u2 = torch.zeros(2, 2, 1, dtype=torch.float64)
    u2[0, 1, 0] = 1.0
    channels, nodes, elements = 4, 3, 2
    desc = build_descriptor([[u1, u2]], channels)
    assert desc.monomials == [(0,), (0, 1)] and desc.num_rows == 2 and desc.num_slots == 1
    costs = efficiency.symmetric_contraction_costs(desc, nodes, elements, itemsize=8)
    fold = 2 * channels * elements * (1 * 1 + 1 * 1)  # two blocks of 1 row x 1 weight
    assert efficiency.symmetric_contraction_fold_flops(desc, elements) == fold == 32
    lanes = nodes * channels
    # forward: x0*x1 (1) + two terms (2 each)
    assert costs["forward"].flops == lanes * (1 + 2 * 2) + fold == 92
    # backward: two term seeds (2 each), x0's add (1), x0*x1's two multiply-adds (4)
    assert costs["backward"].flops == lanes * (2 * 2 + 1 + 4) == 108
    # double backward: x0*x1 and its tangent (1 + 3), per term 2 + 2 forward and 2 back, x0's
    # add (1), x0*x1's three updates back (2 + 4 + 4); and the unfold of the coefficient gradient
    assert costs["double backward"].flops == lanes * (4 + 2 * 6 + 1 + 10) + fold == 356
    x, out, weights = nodes * channels * 2, nodes * channels, elements * channels * 2
    index = nodes * 8
    assert costs["forward"].bytes == 8 * (x + weights + out) + index == 440
    assert costs["backward"].bytes == 8 * (out + x + weights + x) + index == 632
    assert costs["double backward"].bytes == 8 * (3 * x + 2 * out + 2 * weights) + index == 1048


def test_skip_tp_counts_of_one_path_equal_a_hand_count():
    from cfm_plugins.ops.descriptors.skip_tp import SkipTPDescriptor

    # 2x0e -> 3x0e per element, 2 elements: W[u, e, w] of 2 x 2 x 3
    desc = SkipTPDescriptor(
        dim_in=2,
        dim_out=3,
        num_elements=2,
        weight_numel=12,
        in_blocks=((0, 2, 1),),
        out_blocks=((0, 3, 1),),
        path_io=((0, 2, 0, 3, 1),),
        coef=(1.0,),
        woff=(0,),
    )
    nodes, elements = 5, 2
    costs = efficiency.skip_tp_costs(desc, nodes, elements, itemsize=4)
    # per node: 2 x 3 multiply-adds of the product, 3 of the coefficient (outputs)
    assert costs["forward"].flops == nodes * (2 * 2 * 3 + 2 * 3) == 90
    assert costs["backward"].flops == nodes * (2 * 2 * 3 + 2 * 2) == 80  # 2 inputs
    # double backward: a forward and the weight gradient (a multiply-add per node and weight,
    # a multiply per weight of a present element)
    assert costs["double backward"].flops == 90 + (2 * nodes * 2 * 3 + elements * 2 * 3) == 162
    x, out, weights, index = nodes * 2, nodes * 3, elements * 6, nodes * 8
    assert costs["forward"].bytes == 4 * (x + weights + out) + index == 188
    assert costs["backward"].bytes == costs["forward"].bytes
    assert costs["double backward"].bytes == 4 * (x + 2 * out + 2 * weights) + index == 296


def test_a_kernel_without_an_efficiency_entry_is_named_not_measured():
    measured, missing = efficiency.measured_kernels(["skip_tp", "radial_fusion", "conv_tp"])
    # the table's order, then an entry of no kernel in the table (here: the contraction)
    assert measured == ["skip_tp", "conv_tp", "symmetric_contraction", "conv_tp_radial"]
    assert missing == ["radial_fusion"]


def test_rows_below_a_tenth_of_both_limits_are_named():
    cost = efficiency.Cost(flops=10**9, bytes=10**8)
    # 1 GFLOP and 0.1 GB in 0.1 s: 10 GFLOP/s and 1 GB/s against limits of 200 and 20
    low = efficiency.row("k", "forward", "float32", cost, 0.1, 200e9, 20e9)
    assert low[3:] == ["1", "100", "10", "100", "10", "1", "5.0", "5.0"]
    high = efficiency.row("k", "backward", "float32", cost, 0.1, 200e9, 5e9)
    assert high[-1] == "20.0"  # of 5 GB/s
    assert efficiency.low_rows([low, high]) == ["k forward (float32)"]


def test_efficiency_smoke_run_records_every_kernel_and_direction_with_the_limits(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.efficiency", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=ROOT,
        timeout=570,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rec = check_record(tmp_path, "kernel_efficiency_quick", "benchmarks.efficiency")
    (limit,) = rows_of(rec, "limits")
    assert limit[0] == "float32" and limit[1] > 0 and limit[2] == 256 and limit[3] > 0
    assert limit[4] >= 1  # threads
    rows = rows_of(rec, "kernels")
    titles = [spec.title for spec in efficiency.SPECS.values()]
    assert [r[:3] for r in rows] == [
        [t, d, "float32"] for t in titles for d in efficiency.DIRECTIONS
    ]
    columns = rec["tables"][1]["columns"]
    assert columns == efficiency.COLUMNS
    at = {c: i for i, c in enumerate(columns)}
    for r in rows:
        gflop, mb, ms = r[at["GFLOP per call"]], r[at["MB per call"]], r[at["ms (best)"]]
        assert gflop > 0 and mb > 0 and ms > 0, r
        # the rates are the counts over the time, and their fractions are of this run's limits
        assert r[at["GFLOP/s"]] == pytest.approx(gflop / ms * 1e3, rel=0.05, abs=0.1), r
        assert r[at["% of FLOP/s limit"]] == pytest.approx(
            100 * r[at["GFLOP/s"]] / limit[1], rel=0.05, abs=0.1
        ), r
        assert r[at["% of bytes/s limit"]] == pytest.approx(
            100 * r[at["GB/s"]] / limit[3], rel=0.05, abs=0.1
        ), r
    assert any("Timed through the fused modules" in n for n in rec["notes"])
