"""The plan of one epoch at a rank count: binpack's bins next to the trainer's own batches.

Nothing here re-implements the run's batching:

- binpack: the plugin's own capacity rule and costs (:func:`packing_costs`, a saved ``cost=auto``
  fit included) and the bins of the training sampler itself (:func:`binpack_plan`), epoch by
  epoch;
- the trainer's own batches: torch's ``DistributedSampler`` order (one ``torch.randperm`` per
  seed, split over the ranks as the sampler splits it; :func:`distributed_orders`) cut into
  batches of ``batch_size`` graphs by :func:`cfm_plugins.sampler.fixed_count_batches`;
- balance: :func:`cfm_plugins.sampler.balance_report` and
  :func:`cfm_plugins.sampler.load_imbalance_factor`, the LIF the step logs of a run measure.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

from cfm_plugins.plugins.binpack import GPU_TOKEN_RANGE, default_capacity, steps_by_edges
from cfm_plugins.sampler import balance_report, fixed_count_batches, graph_costs
from cfm_plugins.sampler import load_imbalance_factor as lif_of
from cfm_plugins.sampler.autocost import fitted_costs


@dataclass
class PlanOptions:
    """What the run does that the plan must do alike (the ``binpack`` options and the trainer's).

    ``cost``: ``atoms``, ``edges``, ``linear`` (``cost_a*atoms + cost_b*edges``) or ``fit`` (the
    saved ``cost=auto`` fit ``fit``, which the run's plans use after its calibration; the initial
    cost ``cost_a*atoms + cost_b*edges``). ``device``/``dtype``: where the run trains (the GPU
    clamp of the default capacity). ``seed``/``epoch``: binpack packs epoch ``e`` from
    ``seed + e``; the trainer's DistributedSampler orders are seeded ``seed + k`` for
    ``k < seeds``. ``stock_drop_last``: the trainer's sampler drops the last ``n % ranks``
    structures (mace) instead of repeating some (torch's default, HydraGNN). ``step_balance``:
    binpack's option: ``edges`` (under ``cost=atoms`` the bins of a step are chosen by their
    edges, where the edges are known) or ``cost``.
    """

    batch_size: int = 8
    max_tokens: float | None = None
    cost: str = "atoms"
    cost_a: float = 1.0
    cost_b: float = 0.0
    fit: object = None
    device: str = "cuda"
    dtype: str = "float64"
    seed: int = 0
    epoch: int = 0
    oversize: str = "error"
    seeds: int = 5
    stock_drop_last: bool = True
    step_balance: str = "edges"


def packing_costs(atoms, edges, opts: PlanOptions) -> tuple[np.ndarray, float, str]:
    """``(costs, capacity, how the capacity was chosen)`` as the binpack plugin computes them: its
    default capacity rule and GPU clamp (:func:`cfm_plugins.plugins.binpack.default_capacity`),
    its costs (:func:`cfm_plugins.sampler.graph_costs`), and for a saved ``cost=auto`` fit the
    costs of :func:`cfm_plugins.sampler.autocost.fitted_costs` with the capacity rule of
    :class:`~cfm_plugins.sampler.AutoCostBatchSampler`."""
    atoms = np.asarray(atoms, dtype=np.float64)
    kind = "linear" if opts.cost == "fit" else opts.cost
    initial = graph_costs(atoms, edges, kind=kind, a=opts.cost_a, b=opts.cost_b)
    if opts.max_tokens is not None:
        capacity, rule = float(opts.max_tokens), "--max-tokens"
    else:
        capacity = float(
            default_capacity(
                float(initial.mean()),
                float(initial.max()),
                opts.batch_size,
                opts.device,
                opts.dtype,
            )
        )
        raw = math.ceil(float(initial.mean()) * max(int(opts.batch_size), 1))
        rule = f"batch size {opts.batch_size} x mean cost {initial.mean():.4g}"
        if opts.device == "cuda":
            lo, hi = GPU_TOKEN_RANGE.get(opts.dtype, GPU_TOKEN_RANGE["float32"])
            if not lo <= raw <= hi:
                rule += f", clamped to binpack's GPU range {lo}..{hi} for {opts.dtype}"
            raw = min(max(raw, lo), hi)
        if capacity > raw:
            rule += ", raised to the largest structure"
    if opts.cost != "fit":
        return initial, capacity, rule
    costs = fitted_costs(opts.fit, atoms, edges, initial)
    return costs, max(capacity, float(costs.max())), rule + " (in the units of the initial cost)"


def distributed_orders(n: int, ranks: int, seed: int, drop_last: bool) -> np.ndarray:
    """The orders torch's ``DistributedSampler(shuffle=True, seed=seed, drop_last=drop_last)``
    gives each rank in epoch 0 of a data set of ``n`` (row ``r``: rank ``r``'s order): one
    ``torch.randperm`` seeded with ``seed``, padded (repeating its start) or cut to a multiple
    of ``ranks``, rank ``r`` taking every ``ranks``-th index from ``r``. The same orders as
    ``list(DistributedSampler(...))`` on each rank (``tests/plan/test_planning.py``), without
    ``ranks`` permutations of the data set."""
    import torch

    if drop_last and n % ranks:
        per = math.ceil((n - ranks) / ranks)
    else:
        per = math.ceil(n / ranks)
    total = per * ranks
    g = torch.Generator()
    g.manual_seed(int(seed))
    idx = torch.randperm(n, generator=g).numpy()
    if total > n:  # DistributedSampler repeats its order's start to fill the last step
        pad = total - n
        extra = idx[:pad] if pad <= n else np.tile(idx, math.ceil(pad / n))[:pad]
        idx = np.concatenate([idx, extra])
    idx = idx[:total]
    return idx.reshape(per, ranks).T


def _bins_of(packing, values) -> np.ndarray:
    """The sum of ``values`` over each bin (``Packing.bin_costs`` without its ``np.repeat``)."""
    v = np.asarray(values, dtype=np.float64)[packing.indices]
    if len(v) == 0:
        return np.zeros(len(packing))
    sums = np.add.reduceat(v, np.minimum(packing.offsets[:-1], len(v) - 1))
    return np.where(packing.bin_sizes() > 0, sums, 0.0)


def _summary(packing, costs, capacity, ranks, atoms, edges, model, step_extra):
    """The figures of one plan (binpack's or a stock order's)."""
    steps = packing.num_steps(ranks)
    if steps == 0:
        return {"steps": 0, "bins": 0}
    rep = balance_report(packing, costs, capacity, ranks)
    bin_atoms = _bins_of(packing, atoms)
    graphs = packing.bin_sizes().astype(np.float64)
    provision = max(float(capacity), rep.max_bin_cost)
    out = {
        "steps": steps,
        "bins": rep.num_bins,
        "graphs_per_batch": float(graphs.mean()),
        "atoms_per_batch": float(bin_atoms.mean()),
        "largest_batch_atoms": int(bin_atoms.max()),
        "largest_batch_cost": rep.max_bin_cost,
        "padding": 1.0 - rep.total_cost / (rep.num_bins * provision),
        "lif": rep.lif,
        "straggler_ratio": rep.straggler_ratio,
        "mean_step_imbalance": rep.mean_imbalance,
        "epoch_cost": float(rep.step_max.sum()),
        "samples_lost": rep.samples_lost,
        "samples_duplicated": rep.samples_duplicated,
    }
    if model is not None:
        bin_edges = _bins_of(packing, edges) if edges is not None else np.zeros(len(packing))
        t = np.asarray(model.predict(bin_atoms, bin_edges, graphs), dtype=np.float64)
        t = t.reshape(steps, ranks)
        compute = float(t.max(axis=1).sum())
        out.update(
            lif_time=lif_of(t),
            compute_s=compute,
            allreduce_s=steps * step_extra,
            epoch_s=compute + steps * step_extra,
            step_s=float(t.max(axis=1).mean()) + step_extra,
        )
    return out


def binpack_plan(costs, capacity, ranks: int, opts: PlanOptions, edges=None):
    """The training sampler's packing of ``opts.epoch`` at ``ranks`` (global bins, step order):
    :class:`~cfm_plugins.sampler.BinPackBatchSampler` itself, with the options the plugin gives a
    training loader (``repeat``, shuffled, the seed, the oversize policy, and under ``cost=atoms``
    with ``step_balance=edges`` the ``edges`` as its ``step_sizes``, where given)."""
    from cfm_plugins.sampler import BinPackBatchSampler

    by_edges = edges is not None and steps_by_edges(opts.cost, opts.step_balance)

    sampler = BinPackBatchSampler(
        costs,
        capacity,
        rank=0,
        world_size=ranks,
        seed=opts.seed,
        oversize=opts.oversize,
        shuffle=True,
        repeat=True,
        step_sizes=edges if by_edges else None,
    )
    if opts.epoch:
        sampler.set_epoch(opts.epoch)
    return sampler.plan()


def plan_ranks(
    atoms,
    edges,
    ranks: int,
    opts: PlanOptions,
    costs,
    capacity,
    model=None,
    allreduce_s: float = 0.0,
) -> dict:
    """Everything the plan says about ``ranks``: binpack's plan and the trainer's own batches
    over ``opts.seeds`` orders (each figure's median, min and max)."""
    atoms = np.asarray(atoms)
    n = len(atoms)
    packing = binpack_plan(costs, capacity, ranks, opts, edges)
    binpack = _summary(packing, costs, capacity, ranks, atoms, edges, model, allreduce_s)
    binpack["repeated"] = len(packing.repeated)
    binpack["skipped"] = len(packing.skipped)
    binpack["solo"] = len(packing.solo)
    binpack["step_max"] = packing.step_costs(costs, ranks).max(axis=1).tolist()
    stock_runs = []
    per = (n // ranks) if opts.stock_drop_last else math.ceil(n / ranks)
    if per > 0:
        for k in range(opts.seeds):
            orders = distributed_orders(n, ranks, opts.seed + k + opts.epoch, opts.stock_drop_last)
            fixed = fixed_count_batches(orders, opts.batch_size)
            stock_runs.append(
                _summary(fixed, costs, capacity, ranks, atoms, edges, model, allreduce_s)
            )
    stock = _spread(stock_runs)
    stock["orders"] = len(stock_runs)
    stock["per_rank"] = per
    stock["dropped"] = n - per * ranks if opts.stock_drop_last else 0
    stock["repeated"] = 0 if opts.stock_drop_last else per * ranks - n
    out = {"ranks": ranks, "binpack": binpack, "stock": stock}
    if model is not None and stock_runs:
        out["speedup"] = stock["epoch_s"] / binpack["epoch_s"]
    return out


def _spread(runs: list[dict]) -> dict:
    """Median of each figure over ``runs``, with ``<name>_min`` and ``<name>_max``."""
    if not runs:
        return {"steps": 0}
    out = {}
    for name in runs[0]:
        vals = [r[name] for r in runs]
        if name in ("steps", "bins"):  # the same for every order
            out[name] = vals[0]
            continue
        out[name] = statistics.median(vals)
        if len(runs) > 1:
            out[f"{name}_min"], out[f"{name}_max"] = min(vals), max(vals)
    return out


def memory_check(
    largest_atoms: float, capacity: float, device: str, dtype: str, cost: str
) -> str | None:
    """A warning when binpack's batches leave the per-GPU range of the MACE paper's section 5.5
    (float32: 800..4000 atoms, float64: 400..2000: below, the GPU is not saturated; above, a
    batch may not fit an 80 GB GPU's memory), or None."""
    if device != "cuda":
        return None
    lo, hi = GPU_TOKEN_RANGE.get(dtype, GPU_TOKEN_RANGE["float32"])
    if largest_atoms > hi:
        return (
            f"the largest batch holds {largest_atoms:.0f} atoms, above the {hi} atoms the MACE "
            f"paper found to fit an 80 GB GPU in {dtype} (its section 5.5): it may run out of "
            f"memory; lower --max-tokens (binpack's max_tokens) to <= {hi}"
            + ("" if cost == "atoms" else " in atoms")
        )
    if capacity < lo and cost == "atoms":
        return (
            f"the capacity {capacity:g} atoms is below the {lo} atoms the MACE paper found to "
            f"saturate a GPU in {dtype} (its section 5.5): the GPUs will idle; raise --max-tokens"
        )
    return None


def make_plan(
    atoms,
    edges,
    ranks_list,
    opts: PlanOptions,
    model=None,
    allreduce=None,
    progress=None,
) -> dict:
    """The plan at every rank count of ``ranks_list``: ``{"results": [...], "efficiency": ...,
    "capacity": ..., "warnings": [...]}``. ``model``: a step-time model (``predict(atoms, edges,
    graphs)`` in seconds) or None; ``allreduce(ranks)``: seconds of the gradient all-reduce per
    step; ``progress(ranks)``: called before each rank count.

    Raises:
        ValueError: a plan the options cannot make (a structure costlier than the capacity under
            ``oversize="error"``), from the sampler itself.
    """
    from .report import efficiency

    costs, capacity, rule = packing_costs(atoms, edges, opts)
    results = []
    for w in ranks_list:
        if progress is not None:
            progress(w)
        extra = allreduce(w) if allreduce is not None else 0.0
        results.append(plan_ranks(atoms, edges, w, opts, costs, capacity, model, extra))
    warnings = []
    largest = max(r["binpack"].get("largest_batch_atoms", 0) for r in results)
    warn = memory_check(largest, capacity, opts.device, opts.dtype, opts.cost)
    if warn:
        warnings.append(warn)
    return {
        "results": results,
        "capacity": capacity,
        "capacity_rule": rule,
        "costs_total": float(np.sum(costs)),
        "efficiency": {k: efficiency(results, k) for k in ("binpack", "stock")},
        "warnings": warnings,
    }
