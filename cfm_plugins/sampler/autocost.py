"""``cost=auto``: a per-graph cost fitted on the run's own step times.

Bin packing balances the ranks only as well as its cost predicts a step's time, and the right
cost depends on the model, its size, the dtype and the hardware (docs/mace.md). The first epoch
(or the first ``calibrate_steps`` steps) is planned with a plain cost (atoms) and packed at several
capacities (:data:`CostCalibration.levels`, :func:`~cfm_plugins.sampler.packing.pack_levels`), so
that the atom count varies between steps and is not confounded with the constant per-step time;
every rank records each step's compute time with its atoms, edges and graphs, and from the next
epoch on the plans use the fitted cost. Numpy only (the batch sampler gathers the records over the
ranks and calls these): :func:`align_records` (the records as ``(steps, ranks)`` matrices),
:func:`fit_step_times` (``t = c0 + a*atoms + b*edges + g*graphs``, every coefficient >= 0, for each
subset of the counts, after :func:`outlier_steps`; kept: the lowest cross-validated error of the
per-step maximum over ranks, ties the fewer counts), :class:`StepCost` (the kept fit; per-graph
cost ``a*atoms + b*edges + g``: ``c0`` cannot unbalance the ranks), :class:`CostCalibration` (the
schedule of one run, its fits and the state saved for resume).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from .balance import load_imbalance_factor
from .costs import fit_counts
from .packing import CALIBRATION_LEVELS, check_levels

log = logging.getLogger("cfm_plugins.sampler")

TERMS = ("atoms", "edges", "graphs")
CLOCKS = ("cpu", "wall")
STATE_VERSION = 1
#: the first steps a process runs pay one-off costs (allocation, lazy initialisation, DDP's
#: buckets): neither fitted nor counted in the measured balance
WARMUP_STEPS = 3
#: a step whose time is off the fit by more than this many robust standard deviations is left out
OUTLIER_CUTOFF = 4.0
#: a fitted cost never falls below this fraction of the mean cost (a graph whose counts the fit
#: prices at 0, e.g. an isolated atom without edges under an edge-only fit, still takes a slot)
MIN_COST_FRACTION = 1e-3


# --------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class StepCost:
    """A fitted step time ``c0 + a*atoms + b*edges + g*graphs`` (seconds) and how it was chosen.

    ``terms``: the counts of the model kept (a count's coefficient may still come out 0: the
    fit is non-negative); ``r2``: its coefficient of determination on every
    record; ``cv_rms``: its cross-validated RMS error of the per-step maximum over ranks;
    ``cv_table``: ``(terms, cv_rms)`` of every candidate, best first; ``clock``: which time was
    fitted (``cpu``: thread CPU time, ``wall``: wall-clock time); ``steps``: the steps fitted,
    ``outliers``: the steps left out before (:func:`outlier_steps`).
    """

    c0: float
    a: float
    b: float
    g: float
    terms: tuple = ()
    r2: float = 0.0
    cv_rms: float = 0.0
    steps: int = 0
    ranks: int = 0
    clock: str = "cpu"
    cv_table: tuple = ()
    outliers: int = 0

    def predict(self, atoms, edges, graphs) -> np.ndarray:
        """Predicted step time of batches with these totals."""
        return (
            self.c0
            + self.a * np.asarray(atoms, np.float64)
            + self.b * np.asarray(edges, np.float64)
            + self.g * np.asarray(graphs, np.float64)
        )

    def graph_costs(self, atoms, edges) -> np.ndarray:
        """The cost of each graph: ``a*atoms + b*edges + g`` (seconds)."""
        atoms = np.asarray(atoms, np.float64)
        return self.a * atoms + self.b * np.asarray(edges, np.float64) + self.g

    @property
    def explains(self) -> bool:
        """Whether any count adds time (else the fit says nothing about the batches)."""
        return self.a > 0 or self.b > 0 or self.g > 0

    def formula(self) -> str:
        parts = [f"{_seconds(self.c0)}"] + [
            f"{_seconds(v)}/{n}"
            for n, v in (("atom", self.a), ("edge", self.b), ("graph", self.g))
            if v > 0
        ]
        return " + ".join(parts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["terms"] = list(self.terms)
        d["cv_table"] = [[list(t), e] for t, e in self.cv_table]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> StepCost:
        d = dict(d)
        d["terms"] = tuple(d.get("terms", ()))
        d["cv_table"] = tuple((tuple(t), float(e)) for t, e in d.get("cv_table", ()))
        return cls(**d)


def _seconds(x: float) -> str:
    if x == 0:
        return "0 s"
    for unit, f in (("s", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
        if abs(x) * f >= 0.9995:
            return f"{x * f:.3g} {unit}"
    return f"{x * 1e9:.3g} ns"


def _counts(atoms, edges, graphs, terms) -> list[np.ndarray]:
    cols = {"atoms": atoms, "edges": edges, "graphs": graphs}
    return [cols[t] for t in terms]


def _fit_terms(times, atoms, edges, graphs, terms):
    """``(coef by term, c0, r2)`` of the non-negative fit of ``times`` on ``terms`` (flat
    arrays)."""
    coef, c0, _, r2 = fit_counts(_counts(atoms, edges, graphs, terms), times, intercept=True)
    return dict(zip(terms, (float(c) for c in coef))), c0, r2


def _predict(coef: dict, c0: float, atoms, edges, graphs) -> np.ndarray:
    return (
        c0
        + coef.get("atoms", 0.0) * atoms
        + coef.get("edges", 0.0) * edges
        + coef.get("graphs", 0.0) * graphs
    )


def outlier_steps(times, atoms, edges, graphs, cutoff: float = OUTLIER_CUTOFF) -> np.ndarray:
    """The steps (a boolean mask) holding a record whose time is off the fit of every record by more
    than ``cutoff`` robust standard deviations, relative to its predicted time.

    Why. A CPU rank shares its cores and caches: now and then a step takes 10-50 % longer for
    reasons unrelated to its batch (measured on the HydraGNN example: relative residuals of a
    median 1.7 %, the largest 12 %; 44 % on stock batches). Least squares gives such a step the
    pull of a hundred ordinary ones. The residuals are taken relative to the prediction (the jitter
    grows with the step), their spread as 1.4826 x their median absolute deviation (which the
    outliers hardly move). At most a quarter of the steps is flagged, the worst first; none when
    the fit is exact (no spread to measure).
    """
    t, na, ne, ng = (np.asarray(x, dtype=np.float64) for x in (times, atoms, edges, graphs))
    coef, c0, _ = _fit_terms(t.ravel(), na.ravel(), ne.ravel(), ng.ravel(), TERMS)
    pred = _predict(coef, c0, na, ne, ng)
    rel = t / np.maximum(pred, 1e-12 * max(float(np.abs(t).max()), 1e-300)) - 1.0
    dev = np.abs(rel - np.median(rel))
    spread = 1.4826 * float(np.median(dev))
    if spread <= 1e-9:
        return np.zeros(len(t), dtype=bool)
    worst = dev.max(axis=1) / spread
    flagged = worst > cutoff
    limit = len(t) // 4
    if flagged.sum() > limit:
        flagged = np.zeros(len(t), dtype=bool)
        flagged[np.argsort(-worst, kind="stable")[:limit]] = True
    return flagged


def too_few_steps(steps: int, ranks: int, folds: int = 5) -> bool:
    """Whether ``steps`` timed steps of ``ranks`` ranks are too few for :func:`fit_step_times`:
    it needs 4 steps, and in each cross-validation fold as many training records as its largest
    model has coefficients (4: a constant and three counts), so one rank needs 5 steps."""
    if steps < 4:
        return True
    k = min(max(folds, 2), steps)
    return (steps - -(-steps // k)) * ranks < 4


def min_fit_steps(ranks: int, folds: int = 5) -> int:
    """The fewest timed steps :func:`fit_step_times` fits on ``ranks`` ranks."""
    steps = 4
    while too_few_steps(steps, ranks, folds):
        steps += 1
    return steps


def fit_step_times(
    times,
    atoms,
    edges,
    graphs,
    folds: int = 5,
    clock: str = "cpu",
    outlier_cutoff: float | None = OUTLIER_CUTOFF,
) -> StepCost:
    """Fit step times of ``S`` steps on ``R`` ranks (four ``(S, R)`` arrays).

    Steps with an outlying record (:func:`outlier_steps`; ``outlier_cutoff=None``: none) are left
    out first (only where at least 8 steps were timed). Every subset of atoms, edges and graphs
    (plus a constant) is fitted with non-negative coefficients and scored by ``folds``-fold
    cross-validation over the steps (step ``s`` is in fold ``s % k``, ``k = folds`` clipped to
    ``2..S``): fitted on the other steps' records of every rank, it predicts each rank's time of
    the held-out steps, and the error is that of the per-step maximum over ranks, the time a
    synchronous step lasts. Model selection does not look at the coefficients: the batches'
    atom and edge counts are nearly collinear (a batch's edges grow with its atoms), so the
    coefficients of a fit are ill-determined while its predictions are not; what is scored is
    the prediction that matters.

    The kept model has the lowest cross-validated mean squared error of the per-step maximum;
    among the models within a rounding margin of it (a count whose coefficient came out 0 predicts
    the same), the one with the fewest counts. It is refitted on every record kept.
    """
    t, na, ne, ng = (np.asarray(x, dtype=np.float64) for x in (times, atoms, edges, graphs))
    if t.ndim != 2 or not (t.shape == na.shape == ne.shape == ng.shape):
        raise ValueError(
            f"fit_step_times needs four (steps, ranks) arrays of one shape, got "
            f"{t.shape}, {na.shape}, {ne.shape}, {ng.shape}"
        )
    if too_few_steps(t.shape[0], t.shape[1], folds):
        raise ValueError(
            f"fit_step_times needs at least {min_fit_steps(t.shape[1], folds)} timed steps on "
            f"{t.shape[1]} rank(s), got {t.shape[0]}: calibrate on more steps (calibrate_steps, "
            "or a larger data set / smaller max_tokens)"
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("fit_step_times: the step times hold NaN or inf")
    dropped = 0
    if outlier_cutoff is not None and t.shape[0] >= 8:
        out = outlier_steps(t, na, ne, ng, outlier_cutoff)
        dropped = int(out.sum())
        t, na, ne, ng = (x[~out] for x in (t, na, ne, ng))
    steps, ranks = t.shape
    k = int(min(max(folds, 2), steps))
    fold = np.arange(steps) % k
    measured_max = t.max(axis=1)
    scored = []
    for r in range(1, len(TERMS) + 1):
        for terms in itertools.combinations(TERMS, r):
            sq = np.empty(steps)
            for f in range(k):
                train, test = fold != f, fold == f
                coef, c0, _ = _fit_terms(
                    t[train].ravel(), na[train].ravel(), ne[train].ravel(), ng[train].ravel(), terms
                )
                pred = _predict(coef, c0, na[test], ne[test], ng[test])
                sq[test] = (pred.max(axis=1) - measured_max[test]) ** 2
            scored.append((terms, float(sq.mean())))
    best = min(scored, key=lambda s: s[1])
    # the equals of the best (a count whose coefficient came out 0 predicts the same)
    margin = 1e-9 * best[1] + (1e-9 * float(measured_max.mean())) ** 2
    eligible = [s for s in scored if s[1] <= best[1] + margin]
    terms, mse = min(eligible, key=lambda s: (len(s[0]), s[1]))
    coef, c0, r2 = _fit_terms(t.ravel(), na.ravel(), ne.ravel(), ng.ravel(), terms)
    table = tuple((s[0], float(np.sqrt(s[1]))) for s in sorted(scored, key=lambda s: s[1]))
    return StepCost(
        c0=c0,
        a=coef.get("atoms", 0.0),
        b=coef.get("edges", 0.0),
        g=coef.get("graphs", 0.0),
        terms=terms,
        r2=r2,
        cv_rms=float(np.sqrt(mse)),
        steps=steps,
        ranks=ranks,
        clock=clock,
        cv_table=table,
        outliers=dropped,
    )


def predicted_lif(fit: StepCost, packing, atoms, edges, world_size: int) -> float:
    """The LIF the fitted step time predicts for ``packing`` (bins of global sample indices)."""
    bins = [packing.bin_costs(x) for x in (atoms, edges, np.ones(len(atoms)))]
    per_bin = fit.predict(*bins)
    return load_imbalance_factor(per_bin.reshape(-1, int(world_size)))


def fitted_costs(fit: StepCost, atoms, edges, reference) -> np.ndarray:
    """Per-graph costs of ``fit``, scaled so that their total is that of ``reference`` (the costs
    the calibration planned with): a capacity in those units keeps its meaning and the epoch
    about as many bins. None falls below ``MIN_COST_FRACTION`` of the mean."""
    raw = fit.graph_costs(atoms, edges)
    total = float(raw.sum())
    if total <= 0:
        raise ValueError("the fitted cost is 0 for every graph")
    out = raw * (float(np.sum(reference)) / total)
    return np.maximum(out, MIN_COST_FRACTION * float(out.mean()))


# --------------------------------------------------------------------------------------------
# Records of the calibration steps


@dataclass
class StepRecord:
    """One training step of one rank: the batch's totals and its compute time (``None`` where
    the adapter could not take that clock)."""

    epoch: int
    atoms: int
    edges: int
    graphs: int
    wall_s: float | None
    cpu_s: float | None
    warmup: bool = False


def align_records(parts: list[list[StepRecord]], clock: str):
    """Every rank's records (``parts[rank]``, in step order) as ``(steps, ranks)`` matrices of
    times, atoms, edges and graphs, and the clock used.

    Step ``i`` of epoch ``e`` is the ``i``-th record of that epoch on every rank (all ranks run
    the same number of steps in the same order). Warm-up steps (the first steps a process runs,
    with one-off costs) are left out. ``clock`` falls back to the other one when some record lacks
    it. Returns ``None`` when there is no common step.
    """
    if not parts or any(not p for p in parts):
        return None
    use = (
        clock
        if all(getattr(r, f"{clock}_s") is not None for p in parts for r in p)
        else next(c for c in CLOCKS if c != clock)
    )
    if any(getattr(r, f"{use}_s") is None for p in parts for r in p):
        return None
    epochs = sorted({r.epoch for p in parts for r in p})
    rows = []
    for e in epochs:
        per_rank = [[r for r in p if r.epoch == e] for p in parts]
        n = min(len(x) for x in per_rank)
        if any(len(x) != n for x in per_rank):
            log.warning(
                "cost=auto: epoch %d has %s step records on the ranks; the first %d are used",
                e,
                [len(x) for x in per_rank],
                n,
            )
        for i in range(n):
            step = [x[i] for x in per_rank]
            if not any(r.warmup for r in step):
                rows.append(step)
    if not rows:
        return None
    mat = {
        k: np.array([[getattr(r, k) for r in row] for row in rows], dtype=np.float64)
        for k in ("atoms", "edges", "graphs", f"{use}_s")
    }
    return mat[f"{use}_s"], mat["atoms"], mat["edges"], mat["graphs"], use


def only_warmup(parts: list[list[StepRecord]]) -> bool:
    """Whether every rank has records and every step they share holds a warm-up record: nothing
    to fit yet, though later steps will be (not "no common step")."""
    if not parts or any(not p for p in parts):
        return False
    shared = 0
    for e in sorted({r.epoch for p in parts for r in p}):
        per_rank = [[r for r in p if r.epoch == e] for p in parts]
        for i in range(min(len(x) for x in per_rank)):
            if not any(x[i].warmup for x in per_rank):
                return False
            shared += 1
    return shared > 0


# --------------------------------------------------------------------------------------------
# The schedule and memory of one run


@dataclass
class Calibration:
    """A fit in force from epoch ``from_epoch`` on, with the LIF measured in the steps it was
    fitted on and the LIF it predicts for the first plan made with it."""

    from_epoch: int
    fit: StepCost
    lif_measured: float
    lif_predicted: float
    lif_predicted_before: float = float("nan")  # the fit's prediction for the calibration plan

    def to_dict(self) -> dict:
        return {
            "from_epoch": self.from_epoch,
            "fit": self.fit.to_dict(),
            "lif_measured": self.lif_measured,
            "lif_predicted": self.lif_predicted,
            "lif_predicted_before": self.lif_predicted_before,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        return cls(
            int(d["from_epoch"]),
            StepCost.from_dict(d["fit"]),
            float(d["lif_measured"]),
            float(d["lif_predicted"]),
            float(d.get("lif_predicted_before", float("nan"))),
        )


def data_digest(atoms, edges) -> str:
    """Identifies the training set a saved calibration belongs to (its graphs' sizes, in order)."""
    h = hashlib.blake2b(digest_size=12)
    for x in (atoms, edges):
        h.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())
    return h.hexdigest()


@dataclass
class CostCalibration:
    """When ``cost=auto`` fits, on which steps, and the fits made; rank-local, numpy only.

    ``calibrate_steps``: steps to time before the first fit (0: one epoch). The fit is made at
    the start of the first epoch after that many steps were planned (plans change only between
    epochs). ``recalibrate_every``: refit every that many epochs after a fit, on the steps since
    (0: never). The decision whether a fit is due depends only on the epoch and on the plans'
    lengths, registered where the sampler selects an epoch at the trainer's call (construction,
    ``set_epoch``), never where a rank iterates: the same on every rank, so every rank takes part
    in the gather.
    ``levels``: the capacities, as fractions of the capacity, that the epochs before the first fit
    are packed at (:func:`~cfm_plugins.sampler.packing.pack_levels`); ``(1.0,)``: one capacity.
    """

    calibrate_steps: int = 0
    recalibrate_every: int = 0
    clock: str = "cpu"
    warmup_steps: int = WARMUP_STEPS
    levels: tuple = CALIBRATION_LEVELS
    history: list[Calibration] = field(default_factory=list)
    records: list[StepRecord] = field(default_factory=list)
    #: steps planned per epoch since the records started (the same on every rank)
    planned: dict = field(default_factory=dict)
    _started: bool = False  # records of this process exist (the first ones are warm-up)
    _warmup_left: int = 0
    _gave_up: bool = False

    def __post_init__(self):
        if int(self.calibrate_steps) != self.calibrate_steps or self.calibrate_steps < 0:
            raise ValueError(
                "calibrate_steps must be an integer >= 0 (0: one epoch), got "
                f"{self.calibrate_steps!r}"
            )
        if int(self.recalibrate_every) != self.recalibrate_every or self.recalibrate_every < 0:
            raise ValueError(
                "recalibrate_every must be an integer >= 0 (0: never), got "
                f"{self.recalibrate_every!r}"
            )
        self.levels = check_levels(self.levels)
        if self.clock not in CLOCKS:
            raise ValueError(f"clock {self.clock!r}: expected one of {', '.join(CLOCKS)}")

    # -- what the sampler asks ------------------------------------------------------------------
    @property
    def current(self) -> Calibration | None:
        return self.history[-1] if self.history else None

    def fit_for(self, epoch: int) -> Calibration | None:
        """The calibration in force in ``epoch`` (the last one applying from it or before)."""
        found = None
        for c in self.history:
            if c.from_epoch <= epoch:
                found = c
        return found

    @property
    def collecting(self) -> bool:
        """Whether step times are wanted now (calibrating, or recalibration is on)."""
        return not self._gave_up and (not self.history or self.recalibrate_every > 0)

    def epoch_planned(self, epoch: int, steps: int) -> None:
        """Epoch ``epoch`` of ``steps`` steps is planned to be trained (counted only while
        collecting; the sampler says so where every rank selects the epoch alike)."""
        if self.collecting:
            self.planned[int(epoch)] = int(steps)

    def due(self, epoch: int) -> bool:
        """Whether a fit is to be made before planning ``epoch`` (the same answer on every rank).

        Only epochs before ``epoch`` count: ``epoch`` itself is not trained yet."""
        done = sum(n for e, n in self.planned.items() if e < epoch)
        if not self.collecting or done == 0:
            return False
        if not self.history:
            return done >= max(int(self.calibrate_steps), 1)
        return epoch >= self.history[-1].from_epoch + self.recalibrate_every

    def record(
        self, epoch: int, atoms: int, edges: int, graphs: int, wall_s=None, cpu_s=None
    ) -> None:
        """This rank's step: its batch totals and compute time."""
        if not self.collecting:
            return
        first = not self._started
        self._started = True
        self.records.append(
            StepRecord(
                int(epoch),
                int(atoms),
                int(edges),
                int(graphs),
                None if wall_s is None else float(wall_s),
                None if cpu_s is None else float(cpu_s),
            )
        )
        if (
            first
        ):  # the process's first steps pay one-off costs (allocation, lazy init, DDP buckets)
            self._warmup_left = self.warmup_steps
        if self._warmup_left > 0:
            self.records[-1].warmup = True
            self._warmup_left -= 1

    def take_records(self) -> list[StepRecord]:
        """This rank's records since the last fit (handed to the gather), and forget them."""
        out, self.records, self.planned = self.records, [], {}
        return out

    def give_up(self) -> None:
        """No usable step times: keep the current cost and stop collecting."""
        self._gave_up = True
        self.records, self.planned = [], {}

    # -- resume ---------------------------------------------------------------------------------
    def state(self, digest: str) -> dict:
        return {
            "version": STATE_VERSION,
            "data": digest,
            "calibrations": [c.to_dict() for c in self.history],
        }

    def load_state(
        self, state: dict, digest: str, epoch: int | None = None, restart_at_zero: bool = False
    ) -> bool:
        """Restore saved calibrations; returns False (and says why) when they do not apply.

        ``epoch``: the epoch the trainer resumes at; calibrations applying from a later epoch
        were made after the checkpoint and are dropped (that part of the run is redone).
        ``restart_at_zero``: the trainer counts epochs from 0 again (a run continued from
        another's checkpoint): the last saved calibration applies from epoch 0.
        """
        if not state:
            return False
        if state.get("version") != STATE_VERSION:
            log.warning(
                "cost=auto: saved calibration has version %r (this is %d); calibrating anew",
                state.get("version"),
                STATE_VERSION,
            )
            return False
        if state.get("data") != digest:
            log.warning(
                "cost=auto: the saved calibration belongs to another training set (other graph "
                "sizes); calibrating anew"
            )
            return False
        history = [Calibration.from_dict(c) for c in state.get("calibrations", [])]
        if restart_at_zero and history:
            last = history[-1]
            history = [
                Calibration(
                    0, last.fit, last.lif_measured, last.lif_predicted, last.lif_predicted_before
                )
            ]
        elif epoch is not None:
            history = [c for c in history if c.from_epoch <= epoch]
        self.history = history
        self.records, self.planned, self._gave_up = [], {}, False
        return bool(history)


def write_state(path, state: dict) -> None:
    """Write a calibration state as JSON, atomically (a reader never sees half a file)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(state, fh, indent=1)
    os.replace(tmp, path)


def read_state(path) -> dict | None:
    """The calibration state saved at ``path``, or None when there is none."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
