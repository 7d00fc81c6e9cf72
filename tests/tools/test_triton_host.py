"""tools/triton_host.py: one row per kernel variant a MACE force-training step launches, each
with the host time of both ways and their ratio (a smoke run: timings are not asserted)."""

from __future__ import annotations

import re

from tests.helpers import clean_env, import_triton, run_module


def test_every_variant_gets_a_row_with_both_times():
    import_triton()
    env = clean_env()
    env.pop("TRITON_INTERPRET", None)
    res = run_module("tools.triton_host", "--reps", "2", timeout=570, env=env)
    assert res.returncode == 0, res.stdout[-3000:]
    rows = re.findall(r"^\| (\S+) \| ([\d.]+) ms \| ([\d.]+) ms \| ([\d.]+)x \|$", res.stdout, re.M)
    names = [r[0] for r in rows]
    assert names[:5] == ["tp_segment", "tp_segment[T]", "tp_edge[w,y]", "tp_edge[w]", "tp_edge[y]"]
    assert len(names) == 11 and all(n.startswith("sc_") for n in names[5:])
    assert all(float(before) > 0 and float(now) > 0 for _, before, now, _ in rows)
    assert "--reps 2" in res.stdout and "Mean over the variants" in res.stdout
