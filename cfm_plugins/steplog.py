"""Reading the per-step logs every adapter writes (option ``step_log=PATH``).

Each rank of a run writes ``PATH.rank<r>.jsonl``, one JSON record per step; what a record holds
(forward time, compute time, graphs, atoms, ...) is the adapter's. The load imbalance of the
measured run is :func:`cfm_plugins.sampler.load_imbalance_factor` of one of those fields, the
same quantity the packing plans report.
"""
from __future__ import annotations

import json
from pathlib import Path

from cfm_plugins.sampler.report import load_imbalance_factor


def read_step_logs(path: str) -> list[list[dict]]:
    """The records of every rank (``[rank][step]``) written under ``path``, ordered by rank."""
    files = sorted(Path(path).parent.glob(Path(path).name + ".rank*.jsonl"),
                   key=lambda p: int(p.name.rsplit("rank", 1)[1].split(".")[0]))
    if not files:
        raise FileNotFoundError(f"no step logs {path}.rank*.jsonl (was the run started with step_log={path}?)")
    return [[json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files]


def load_imbalance(ranks: list[list[dict]], key: str = "forward_s", skip: int = 0) -> float:
    """LIF of ``key`` over the steps every rank ran, after the first ``skip`` (warm-up) steps."""
    steps = min((len(r) for r in ranks), default=0)
    if steps <= skip:
        raise ValueError(f"only {steps} steps were logged on every rank (skip={skip}); nothing to measure")
    return load_imbalance_factor([[r[s][key] for r in ranks] for s in range(skip, steps)])


def epoch_imbalance(ranks: list[list[dict]], key: str = "forward_s", skip: int = 0) -> float:
    """The MACE paper's per-epoch form: the largest per-rank total of ``key`` over the mean total."""
    steps = min((len(r) for r in ranks), default=0)
    if steps <= skip:
        raise ValueError(f"only {steps} steps were logged on every rank (skip={skip}); nothing to measure")
    return load_imbalance_factor([[sum(r[s][key] for s in range(skip, steps)) for r in ranks]])
