"""tools/autocost_sim.py: the cost=auto simulation runs, and shows what it is there to show."""

from __future__ import annotations

import numpy as np

from tools.autocost_sim import TRUTHS, VARIANTS, main, one_run


def test_levels_and_outlier_rule_give_better_plans_than_one_capacity():
    """On the HydraGNN-like sizes with an edge-only step time (the example's), the plans made with
    fits of calibration steps at several capacities, outliers left out, are closer to balanced
    under the true step time than those of one-capacity calibration steps with outliers kept."""

    def mean_lif(variant):
        levels, cutoff = VARIANTS[variant]
        return np.mean(
            [one_run("clusters", TRUTHS["egnn"], levels, cutoff, s, 0.02, 0.05) for s in range(4)]
        )

    new, old = mean_lif("cost=auto (levels)"), mean_lif("one capacity, outliers kept")
    assert new < old and new < 1.005, (new, old)


def test_main_prints_one_row_per_truth(capsys):
    assert main(["--seeds", "1", "--sizes", "tests"]) == 0
    rows = [
        ln
        for ln in capsys.readouterr().out.splitlines()
        if ln.startswith("| ") and "truth" not in ln
    ]
    assert [r.split(" | ")[0][2:] for r in rows] == list(TRUTHS)
