"""Synthetic atom counts shaped like the MACE paper's 2.65M-graph training mix (Table 3).

Counts and atom ranges per dataset are the paper's. Inside each range the paper gives no
distribution, so (seeded, documented choice):

- MPtrj (1-444 atoms): log-normal skewed to small cells, median 20 atoms, sigma 0.8
  (mean about 28), rounded and clipped to 1-444;
- every other dataset: uniform integers over its range (a single value where the range is one).
"""

from __future__ import annotations

import numpy as np

#: name -> (number of graphs, min atoms, max atoms), from Table 3 of the MACE paper
PAPER_MIX = {
    "Al-HCl(aq)": (884, 281, 281),
    "CuNi": (74335, 492, 500),
    "HEA": (25628, 36, 48),
    "Liquid water": (190267, 768, 768),
    "MPtrj": (1580312, 1, 444),
    "TMD": (219627, 16, 96),
    "Water clusters": (460000, 9, 75),
    "Zeolite": (99770, 203, 408),
}
MPTRJ_MEDIAN, MPTRJ_SIGMA = 20.0, 0.8


def paper_mix(num_graphs: int | None = None, seed: int = 0, return_labels: bool = False):
    """Atom counts (int64, dataset order shuffled) of the paper's mix, scaled to ``num_graphs``.

    ``num_graphs=None`` gives the full 2,650,823 graphs; a smaller number keeps the proportions.
    With ``return_labels`` also returns the dataset name index of each graph.
    """
    rng = np.random.default_rng(seed)
    full = sum(v[0] for v in PAPER_MIX.values())
    scale = 1.0 if num_graphs is None else num_graphs / full
    parts, labels = [], []
    for k, (name, (count, lo, hi)) in enumerate(PAPER_MIX.items()):
        m = max(1, round(count * scale))
        if name == "MPtrj":
            x = np.rint(rng.lognormal(np.log(MPTRJ_MEDIAN), MPTRJ_SIGMA, m))
            x = np.clip(x, lo, hi).astype(np.int64)
        else:
            x = rng.integers(lo, hi + 1, m, dtype=np.int64)
        parts.append(x)
        labels.append(np.full(m, k, np.int64))
    atoms = np.concatenate(parts)
    lab = np.concatenate(labels)
    p = rng.permutation(len(atoms))
    return (atoms[p], lab[p]) if return_labels else atoms[p]
