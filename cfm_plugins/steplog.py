"""The per-step logs every adapter writes (option ``step_log=PATH``): one writer, one reader.

Each rank of a run writes ``PATH.rank<r>.jsonl`` (:class:`StepLogWriter`), one JSON record per
step; what a record holds (forward time, compute time, graphs, atoms, ...) is the adapter's. With
``cost=auto`` every record also names the cost its batch was planned with (``"cost"``:
``initial`` or ``auto-<k>``) and each fit is one line ``{"event": "calibration", ...}`` before
the first step it planned; :func:`read_step_logs` returns the steps, :func:`read_step_events`
the events. The load imbalance of the measured run is
:func:`cfm_plugins.sampler.load_imbalance_factor` of one of the fields, the same quantity the
packing plans report.
"""

from __future__ import annotations

import json
from pathlib import Path

from cfm_plugins.sampler.balance import load_imbalance_factor


class StepLogWriter:
    """One rank's step log ``PATH.rank<r>.jsonl`` (emptied at creation unless ``append``)."""

    def __init__(self, path: str, rank: int, append: bool = False):
        self.path = Path(f"{path}.rank{rank}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not append:
            self.path.write_text("")
        self._events = 0

    def write(self, record: dict, sampler=None) -> None:
        """Append one step's record (with the ``epoch`` of the training ``sampler`` if it has none);
        with a ``cost=auto`` sampler first the fits it made since the last record, then the record
        with the cost its batch was planned with."""
        lines = []
        if getattr(sampler, "epoch", None) is not None and "epoch" not in record:
            record = {**record, "epoch": sampler.epoch}
        calibrations = getattr(sampler, "calibrations", None)
        if calibrations is not None:
            for cal in calibrations[self._events :]:
                lines.append({"event": "calibration", **cal.to_dict()})
            self._events = len(calibrations)
            record = {**record, "cost": sampler.cost_label}
        lines.append(record)
        with open(self.path, "a") as fh:
            fh.write("".join(json.dumps(x) + "\n" for x in lines))


def _read(path: str) -> list[list[dict]]:
    files = sorted(
        Path(path).parent.glob(Path(path).name + ".rank*.jsonl"),
        key=lambda p: int(p.name.rsplit("rank", 1)[1].split(".")[0]),
    )
    if not files:
        raise FileNotFoundError(
            f"no step logs {path}.rank*.jsonl (was the run started with step_log={path}?)"
        )
    return [
        [json.loads(line) for line in f.read_text().splitlines() if line.strip()] for f in files
    ]


def read_step_logs(path: str) -> list[list[dict]]:
    """The step records of every rank (``[rank][step]``) written under ``path``, ordered by rank."""
    return [[r for r in rank if "event" not in r] for rank in _read(path)]


def read_step_events(path: str, kind: str = "calibration") -> list[list[dict]]:
    """The event lines of every rank (``[rank][event]``), e.g. the ``cost=auto`` fits."""
    return [[r for r in rank if r.get("event") == kind] for rank in _read(path)]


def records_from_epoch(ranks: list[list[dict]], epoch: int) -> list[list[dict]]:
    """Every rank's records of ``epoch`` and later (``cost=auto`` plans with its fit from the epoch
    after the calibration on: its LIF is that of these steps)."""
    return [[r for r in rank if r.get("epoch", 0) >= epoch] for rank in ranks]


def load_imbalance(ranks: list[list[dict]], key: str = "forward_s", skip: int = 0) -> float:
    """LIF of ``key`` over the steps every rank ran, after the first ``skip`` (warm-up) steps."""
    steps = min((len(r) for r in ranks), default=0)
    if steps <= skip:
        raise ValueError(
            f"only {steps} steps were logged on every rank (skip={skip}); nothing to measure"
        )
    return load_imbalance_factor([[r[s][key] for r in ranks] for s in range(skip, steps)])


def epoch_imbalance(ranks: list[list[dict]], key: str = "forward_s", skip: int = 0) -> float:
    """The MACE paper's per-epoch form: the largest per-rank total of ``key`` over the mean
    total."""
    steps = min((len(r) for r in ranks), default=0)
    if steps <= skip:
        raise ValueError(
            f"only {steps} steps were logged on every rank (skip={skip}); nothing to measure"
        )
    return load_imbalance_factor([[sum(r[s][key] for s in range(skip, steps)) for r in ranks]])
