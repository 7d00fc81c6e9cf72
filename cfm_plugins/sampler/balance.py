"""How good a packing is: bins vs the lower bound, padding, per-step balance, LIF; and a picture.

Definitions (``W`` ranks, costs ``c``, capacity ``C``, ``B`` bins, steps ``s`` of ``W`` bins):

- ``lower_bound_bins = ceil(sum c / C)``; ``min_bins_for_world`` = that rounded up to a multiple of
  W.
- ``padding = 1 - sum c / (B*C)``; ``min_padding`` = the same with ``min_bins_for_world`` bins.
- per-step imbalance = max / mean of the step's bin costs (1 = perfectly balanced).
- ``lif`` (HydraGNN paper, LIF = T_max / T_avg) over the epoch: ``sum_s max_s / sum_s mean_s``.
- ``straggler_ratio`` = ``sum_s max_s / (sum c / W)``: the epoch cost when every step waits for its
  slowest rank (cost taken as proportional to the bin cost), relative to a perfect split of the
  total work over the W ranks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .bins import Packing, offsets_from_counts, packing_from_bins
from .packing import lower_bound_bins, round_up


def count(n: int, noun: str) -> str:
    """``"1 step"``, ``"2 steps"``, ``"2 passes"``: a count and its noun, in the plural where it is
    not 1."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}" + ("es" if noun.endswith(("s", "x")) else "s")


def load_imbalance_factor(per_step) -> float:
    """LIF of the HydraGNN paper, ``sum_s max_r t[s][r] / sum_s mean_r t[s][r]``, of a
    ``(steps, ranks)`` matrix of per-rank work (bin costs, or measured times); NaN without work.

    The one definition used for packings (:func:`balance_report`) and for measured runs (the
    mace adapter's step logs), so planned and measured LIF are the same quantity.
    """
    t = np.asarray(per_step, dtype=np.float64)
    if t.ndim != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(
            "load_imbalance_factor needs a (steps, ranks) matrix with at least one step, got "
            f"shape {t.shape}"
        )
    mean = float(t.mean(axis=1).sum())
    return float(t.max(axis=1).sum()) / mean if mean > 0 else math.nan


@dataclass
class BalanceReport:
    num_samples: int
    num_bins: int
    num_steps: int
    world_size: int
    capacity: float
    total_cost: float
    lower_bound_bins: int
    min_bins_for_world: int
    padding: float
    min_padding: float
    max_bin_cost: float
    min_bin_cost: float
    step_max: np.ndarray
    step_mean: np.ndarray
    mean_imbalance: float
    max_imbalance: float
    lif: float
    straggler_ratio: float
    samples_lost: int
    samples_duplicated: int
    bins_over_capacity: int

    def to_dict(self) -> dict:
        d = asdict(self)
        d["step_max"] = self.step_max.tolist()
        d["step_mean"] = self.step_mean.tolist()
        return d

    def to_text(self) -> str:
        return "\n".join(
            [
                f"samples {self.num_samples}, total cost {self.total_cost:g}, capacity "
                f"{self.capacity:g}, {self.world_size} ranks",
                f"bins {self.num_bins} = {self.num_steps} steps (lower bound "
                f"{self.lower_bound_bins}, {self.min_bins_for_world} for {self.world_size} ranks; "
                f"x{self.num_bins / self.lower_bound_bins:.4f})",
                f"padding {100 * self.padding:.3f}% (minimum for the rank count "
                f"{100 * self.min_padding:.3f}%)",
                f"bin cost min {self.min_bin_cost:g} max {self.max_bin_cost:g}; "
                f"{self.bins_over_capacity} bins over capacity",
                f"per-step imbalance (max/mean) mean {self.mean_imbalance:.5f} max "
                f"{self.max_imbalance:.5f}; LIF {self.lif:.5f}; straggler-bound epoch cost / ideal "
                f"{self.straggler_ratio:.5f}",
                f"samples lost {self.samples_lost}, duplicated {self.samples_duplicated}",
            ]
        )


def balance_report(
    packing: Packing, costs, capacity, world_size: int | None = None
) -> BalanceReport:
    """Numbers of :class:`BalanceReport` for ``packing`` of ``costs`` (the array given to pack)."""
    c = np.asarray(costs, dtype=np.float64)
    w = packing.world_size if world_size is None else int(world_size)
    cap = float(capacity)
    total = float(c.sum())
    bc = packing.bin_costs(c)
    sc = bc.reshape(packing.num_steps(w), w)
    smax, smean = sc.max(axis=1), sc.mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        imb = np.where(smean > 0, smax / np.where(smean > 0, smean, 1), 1.0)
    seen = np.bincount(packing.indices, minlength=len(c))
    lb = lower_bound_bins(total, cap)
    mbw = round_up(lb, w)
    nb = len(packing)
    return BalanceReport(
        num_samples=len(c),
        num_bins=nb,
        num_steps=nb // w,
        world_size=w,
        capacity=cap,
        total_cost=total,
        lower_bound_bins=lb,
        min_bins_for_world=mbw,
        padding=1.0 - total / (nb * cap),
        min_padding=1.0 - total / (mbw * cap),
        max_bin_cost=float(bc.max()),
        min_bin_cost=float(bc.min()),
        step_max=smax,
        step_mean=smean,
        mean_imbalance=float(imb.mean()),
        max_imbalance=float(imb.max()),
        lif=load_imbalance_factor(sc),
        straggler_ratio=float(smax.sum() / (total / w)),
        samples_lost=int(np.sum(seen == 0)),
        samples_duplicated=int(np.sum(np.maximum(seen - 1, 0))),
        bins_over_capacity=int(np.sum(bc > cap * (1 + 1e-12))),
    )


def fixed_count_batches(rank_indices, batch_size: int, drop_last: bool = False) -> Packing:
    """The batches a trainer's loader makes from each rank's sampler order, as a :class:`Packing`.

    A stock trainer (mace, HydraGNN) gives every rank a ``DistributedSampler`` and cuts each
    rank's index sequence into consecutive batches of ``batch_size`` graphs: step ``s`` of rank
    ``r`` is batch ``s`` of ``rank_indices[r]``. With the same sampler seed and epoch these are
    the batches the trainer trains on.

    Args:
        rank_indices: one sequence of dataset indices per rank, in the order the rank's sampler
            yields them (``list(sampler)`` after ``sampler.set_epoch(epoch)``); a 2-D array
            (``(ranks, length)``, equal lengths) is cut without a Python loop over batches.
        batch_size: graphs per batch (the trainer's ``batch_size``).
        drop_last: drop each rank's last batch when it holds fewer than ``batch_size`` graphs
            (the loader's ``drop_last``).

    Returns:
        A :class:`Packing` with one bin per rank and step (``world_size = len(rank_indices)``).

    Raises:
        ValueError: no rank, ``batch_size`` < 1, or ranks with different numbers of batches
            (a distributed run would hang at the step where one rank has none).
    """
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not len(rank_indices):
        raise ValueError("rank_indices is empty: give one index sequence per rank")
    if isinstance(rank_indices, np.ndarray) and rank_indices.ndim == 2:
        return _fixed_count_equal(rank_indices, int(batch_size), drop_last)
    per_rank = []
    for idx in rank_indices:
        idx = [int(i) for i in idx]
        batches = [idx[i : i + batch_size] for i in range(0, len(idx), batch_size)]
        if drop_last and batches and len(batches[-1]) < batch_size:
            batches.pop()
        per_rank.append(batches)
    counts = [len(b) for b in per_rank]
    if len(set(counts)) != 1:
        raise ValueError(
            f"the ranks have {counts} batches: every rank needs the same number of steps "
            "(DistributedSampler pads every rank to the same length)"
        )
    bins = [b for step in zip(*per_rank) for b in step]
    return packing_from_bins(bins, len(per_rank))


def _fixed_count_equal(orders: np.ndarray, batch_size: int, drop_last: bool) -> Packing:
    """:func:`fixed_count_batches` of equally long orders (a ``(ranks, length)`` array, what a
    ``DistributedSampler`` gives every rank), without a Python loop over batches: the same plan."""
    w, length = orders.shape
    full, rest = divmod(length, batch_size)
    parts = [orders[:, : full * batch_size].reshape(w, full, batch_size).transpose(1, 0, 2)]
    counts = [np.full(full * w, batch_size, dtype=np.int64)]
    if rest and not drop_last:
        parts.append(orders[:, full * batch_size :])
        counts.append(np.full(w, rest, dtype=np.int64))
    indices = np.concatenate([p.reshape(-1) for p in parts]).astype(np.int64)
    return Packing(indices, offsets_from_counts(np.concatenate(counts)), world_size=w)


def draw_batches(
    packing: Packing,
    costs,
    world_size: int | None = None,
    steps=None,
    baseline: Packing | None = None,
    capacity: float | None = None,
    titles=("fixed-count batches", "bin packing"),
    cost_label: str = "atoms",
    rank_label: str = "rank",
):
    """The picture of :func:`plot_batches` as a matplotlib figure (not saved).

    Args:
        packing: the plan drawn on the right (or alone).
        costs: the cost of every sample, indexed like the plans' indices.
        world_size: ranks (default: ``packing.world_size``).
        steps: the steps drawn (an iterable of step numbers); ``None``: every step.
        baseline: a plan drawn on the left, e.g. the trainer's own batches
            (:func:`fixed_count_batches`).
        capacity: draws the bin capacity as a dashed line.
        titles: the titles of the baseline and of ``packing``; each gets the plan's LIF over
            all its steps appended.
        cost_label: names the cost on the x axis (``atoms``, ``edges``, ...).
        rank_label: names a row's rank (``"rank"``, or ``"GPU"`` where each rank runs on one).

    Returns:
        The ``matplotlib.figure.Figure``: one axes per plan; every drawn sample is one bar
        whose ``gid`` is ``"sample <index>"``.

    Raises:
        ValueError: a plan whose bins do not split into steps of ``world_size``.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    c = np.asarray(costs, dtype=np.float64)
    w = packing.world_size if world_size is None else int(world_size)
    panels = [(packing, titles[1])]
    if baseline is not None:
        panels.insert(0, (baseline, titles[0]))
    shown = []
    for pk, _ in panels:
        n = pk.num_steps(w)
        shown.append([s for s in (range(n) if steps is None else steps) if 0 <= s < n])
    rows = max(len(st) for st in shown) * w
    fig, axes = plt.subplots(
        1,
        len(panels),
        figsize=(6.5 * len(panels), 0.3 * rows + 1.9),
        squeeze=False,
        sharex=True,
    )
    cmap = plt.get_cmap("tab20")
    xmax = max(capacity or 0.0, max(float(pk.bin_costs(c).max()) for pk, _ in panels))
    for ax, (pk, title), st in zip(axes[0], panels, shown):
        lif = load_imbalance_factor(pk.step_costs(c, w))
        y, labels = 0, []
        for s in st:
            bins = pk.step(s, w)
            slowest = max(float(c[b].sum()) for b in bins)
            for r, items in enumerate(bins):
                x = 0.0
                for i in items:
                    ax.barh(
                        y,
                        c[i],
                        left=x,
                        height=0.8,
                        color=cmap(int(i) % 20),
                        edgecolor="black",
                        linewidth=0.3,
                        gid=f"sample {int(i)}",
                    )
                    x += c[i]
                if slowest > x:  # this rank waits for the step's slowest rank
                    ax.barh(
                        y,
                        slowest - x,
                        left=x,
                        height=0.8,
                        color="none",
                        edgecolor="0.6",
                        hatch="////",
                        linewidth=0,
                    )
                labels.append(f"step {s} {rank_label} {r}")
                y += 1
            ax.axhline(y - 0.5, color="grey", linewidth=0.8)
        if capacity is not None:
            ax.axvline(capacity, color="red", linestyle="--", linewidth=1)
        ax.set_yticks(range(y))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.set_xlim(0, xmax * 1.02)
        ax.set_xlabel(f"cost ({cost_label}) of each {rank_label}'s batch")
        n = pk.num_steps(w)
        part = f"{n} steps" if len(st) == n else f"steps {st[0]}-{st[-1]} of {n} shown"
        ax.set_title(
            f"{title}\nLIF {lif:.3f} ({cost_label} per rank and step; {part})", fontsize=10
        )
    legend = [
        Patch(
            facecolor="none",
            edgecolor="0.6",
            hatch="////",
            label="idle: waiting for the step's slowest rank",
        )
    ]
    if capacity is not None:
        legend.append(plt.Line2D([], [], color="red", linestyle="--", label="bin capacity"))
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def plot_batches(
    packing: Packing,
    costs,
    world_size: int | None,
    path,
    steps=range(4),
    baseline: Packing | None = None,
    capacity: float | None = None,
    titles=("fixed-count batches", "bin packing"),
    cost_label: str = "atoms",
    rank_label: str = "rank",
) -> str:
    """Draw the batches of a few steps like the MACE paper's Figure 12 and save a PNG.

    One row per rank and step, each sample a bar as long as its cost (one colour per sample,
    the same in both panels), the time a rank waits for the step's slowest rank hatched. With
    ``baseline`` (the trainer's own fixed-count batches) on the left and ``packing`` on the
    right, each titled with its LIF (:func:`load_imbalance_factor` of its bins' costs over all
    its steps), the picture shows what bin packing does to the ranks' waits.

    Args:
        packing, costs, world_size, steps, baseline, capacity, titles, cost_label, rank_label:
            as :func:`draw_batches` (``steps`` default: the first four; ``None``: every step).
        path: where to write the PNG.

    Returns:
        ``path`` as a string.

    Raises:
        ValueError: as :func:`draw_batches`.
    """
    import matplotlib.pyplot as plt

    fig = draw_batches(
        packing, costs, world_size, steps, baseline, capacity, titles, cost_label, rank_label
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def co_batched_pairs(packing: Packing) -> int:
    """Number of unordered sample pairs that share a bin."""
    k = packing.bin_sizes().astype(np.int64)
    return int(np.sum(k * (k - 1) // 2))


def repeated_pairs(first: Packing, second: Packing, num_samples: int) -> tuple[int, int, float]:
    """Pairs co-batched in ``first`` that are co-batched again in ``second``: exact count.

    Each sample gets ``(bin in first, bin in second)``; samples sharing both bins are the
    repeated pairs, ``sum C(g, 2)`` over groups of equal keys (one sort). Samples in several
    bins (duplicating packers) count once, by their last bin. Returns
    ``(repeated, pairs in first, fraction)``.
    """
    a = first.sample_bins(num_samples)
    b = second.sample_bins(num_samples)
    ok = (a >= 0) & (b >= 0)
    key = a[ok] * np.int64(len(second) + 1) + b[ok]
    _, g = np.unique(key, return_counts=True)
    rep = int(np.sum(g.astype(np.int64) * (g - 1) // 2))
    tot = co_batched_pairs(first)
    return rep, tot, rep / tot if tot else 0.0
