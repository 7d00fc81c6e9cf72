"""benchmarks/workload.py: the MACE paper's graph-size mix (Table 3)."""

from __future__ import annotations

from benchmarks.workload import PAPER_MIX, paper_mix


def test_paper_mix_matches_table3():
    a, lab = paper_mix(None, seed=0, return_labels=True)
    assert len(a) == sum(v[0] for v in PAPER_MIX.values()) == 2_650_823
    for k, (name, (count, lo, hi)) in enumerate(PAPER_MIX.items()):
        x = a[lab == k]
        assert len(x) == count and x.min() >= lo and x.max() <= hi, name
