"""Every sampler side by side on one data set (``cfm-plan --compare``, ``benchmarks/samplers.py``).

:func:`compare_ranks` plans one epoch at a rank count with each sampler of :data:`SAMPLERS`:
torch's ``DistributedSampler`` with the trainer's batch size, HydraGNN's, fairchem's and
metatrain's samplers (:mod:`.peer_samplers`) at one budget in atoms, and binpack (the training
sampler itself, :func:`.planning.binpack_plan`). Each row: steps, padding, LIF in atoms, in edges
and in predicted step time, structures dropped or repeated, the planning time and peak memory of
one rank (every rank plans the whole epoch), and the predicted epoch (every step waits for its
slowest rank) against binpack's. A sampler that refuses the set (fewer batches than ranks, a
structure over the budget) has a row saying why. :func:`table` writes the rows in markdown,
:func:`compare_text` what the command prints.
"""

from __future__ import annotations

import math
import time
import tracemalloc

import numpy as np

from cfm_plugins.sampler import load_imbalance_factor

from .predict import fmt_time

#: the samplers compared, in the order of the rows: key -> label
SAMPLERS = {
    "distributed": "DistributedSampler",
    "hydragnn": "HydraGNN node_budget",
    "fairchem": "fairchem max_atoms",
    "metatrain": "metatrain max_atoms",
    "binpack": "binpack",
}


def _planner(key, atoms, edges, capacity, ranks, *, batch_size, seed, epoch, drop_last, binpack):
    """A function of no arguments that makes the packing of sampler ``key`` (binpack's as the
    training sampler plans it: with ``cost=atoms`` its steps even in ``edges``, where given)."""
    from . import peer_samplers
    from .planning import PlanOptions, binpack_plan

    if key == "binpack":
        costs, cap, opts = binpack or (atoms, capacity, PlanOptions(seed=seed, epoch=epoch))
        return lambda: binpack_plan(costs, cap, ranks, opts, edges)
    fn = peer_samplers.PEERS[key]
    kw = {"batch_size": batch_size, "drop_last": drop_last} if key == "distributed" else {}
    return lambda: fn(atoms, capacity, ranks, seed=seed, epoch=epoch, **kw)


def figures(packing, atoms, edges, ranks, capacity, model=None, allreduce_s=0.0) -> dict:
    """The figures of one packing (see the module notes); the epoch in seconds with a step-time
    ``model`` (``predict(atoms, edges, graphs)``), else in atoms (the sum of each step's
    largest batch)."""
    steps = packing.num_steps(ranks)
    out = {"steps": steps}
    if steps == 0:
        return out
    bin_atoms = packing.bin_costs(atoms)
    largest = float(bin_atoms.max())
    seen = np.bincount(packing.indices, minlength=len(atoms))
    out.update(
        padding=1.0 - float(bin_atoms.sum()) / (len(packing) * max(float(capacity), largest)),
        largest=largest,
        lif_atoms=load_imbalance_factor(bin_atoms.reshape(steps, ranks)),
        dropped=int(np.sum(seen == 0)),
        repeated=int(np.sum(np.maximum(seen - 1, 0))),
    )
    bin_edges = None
    if edges is not None:
        bin_edges = packing.bin_costs(edges)
        out["lif_edges"] = load_imbalance_factor(bin_edges.reshape(steps, ranks))
    if model is not None:
        zeros = np.zeros(len(packing))
        t = np.asarray(
            model.predict(
                bin_atoms, bin_edges if bin_edges is not None else zeros, packing.bin_sizes()
            ),
            dtype=np.float64,
        ).reshape(steps, ranks)
        out["lif_time"] = load_imbalance_factor(t)
        out["epoch"] = float(t.max(axis=1).sum()) + steps * float(allreduce_s)
    else:
        out["epoch"] = float(bin_atoms.reshape(steps, ranks).max(axis=1).sum())
    return out


def _timed(make):
    t0, c0 = time.perf_counter(), time.process_time()
    result = make()
    return result, time.perf_counter() - t0, time.process_time() - c0


def _peak_mb(make) -> float:
    """Peak memory of ``make()`` as tracemalloc sees it (numpy's and Python's allocations)."""
    was = tracemalloc.is_tracing()
    if not was:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    make()
    peak = tracemalloc.get_traced_memory()[1]
    if not was:
        tracemalloc.stop()
    return (peak - base) / 2**20


def compare_ranks(
    atoms,
    edges,
    ranks: int,
    capacity: float,
    *,
    batch_size: int = 8,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
    model=None,
    allreduce_s: float = 0.0,
    binpack=None,
    memory: bool = True,
    repeats: int = 1,
    samplers=tuple(SAMPLERS),
) -> list[dict]:
    """One row per sampler at ``ranks``: ``capacity`` is the peers' budget in atoms;
    ``batch_size``, ``drop_last``: the ``DistributedSampler``'s; ``binpack``: ``(costs,
    capacity, PlanOptions)`` of binpack's plan (default: atoms at ``capacity``, ``seed``,
    ``epoch``); ``memory``: measure the peak memory (a second plan, under tracemalloc);
    ``repeats``: plans timed, the fastest kept."""
    import torch  # noqa: F401  (the peers' shuffles and binpack's sampler: imported before the clocks)

    from cfm_plugins.sampler import BinPackBatchSampler  # noqa: F401

    atoms = np.asarray(atoms)
    rows = []
    for key in samplers:
        make = _planner(
            key,
            atoms,
            edges,
            capacity,
            ranks,
            batch_size=batch_size,
            seed=seed,
            epoch=epoch,
            drop_last=drop_last,
            binpack=binpack,
        )
        row = {"sampler": SAMPLERS[key], "key": key, "ranks": ranks, "capacity": capacity}
        try:
            packing, wall, cpu = _timed(make)
        except ValueError as exc:
            rows.append({**row, "refused": str(exc)})
            continue
        for _ in range(repeats - 1):
            _, w2, c2 = _timed(make)
            wall, cpu = min(wall, w2), min(cpu, c2)
        row.update(figures(packing, atoms, edges, ranks, capacity, model, allreduce_s))
        row.update(plan_s=wall, plan_cpu_s=cpu, peak_mb=_peak_mb(make) if memory else None)
        rows.append(row)
    base = next((r for r in rows if r["key"] == "binpack" and r.get("epoch")), None)
    for r in rows:
        if base is not None and r.get("epoch"):
            r["vs_binpack"] = r["epoch"] / base["epoch"]
    return rows


def _f(v, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, fmt)


def _epoch(v: float, timed: bool) -> str:
    return fmt_time(v) if timed else f"{v:,.0f}"


#: the columns of :func:`table`
COLUMNS = (
    "ranks",
    "capacity (atoms)",
    "sampler",
    "steps",
    "largest batch (atoms)",
    "padding",
    "LIF atoms",
    "LIF edges",
    "LIF time",
    "dropped / repeated",
    "plan",
    "peak (MB)",
    "epoch",
    "epoch / binpack",
)


def table(rows: list[dict], timed: bool) -> list[str]:
    """The rows as a markdown table (:data:`COLUMNS`); the epoch in time where ``timed``, else
    in atoms."""
    cols = list(COLUMNS)
    cols[-2] = "epoch" if timed else "epoch (atoms)"
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        head = f"| {r['ranks']} | {r['capacity']:g} | {r['sampler']} |"
        if "refused" in r:
            out.append(head + f" refused: {r['refused']} |" + " - |" * (len(cols) - 4))
            continue
        if not r["steps"]:
            out.append(head + " 0 (no batch) |" + " - |" * (len(cols) - 4))
            continue
        has = r.get("vs_binpack") is not None
        out.append(
            head + f" {r['steps']} | {r['largest']:.0f} | {100 * r['padding']:.2f}% | "
            f"{_f(r['lif_atoms'], '.4f')} | "
            f"{_f(r.get('lif_edges'), '.4f')} | {_f(r.get('lif_time'), '.4f')} | "
            f"{r['dropped']} / {r['repeated']} | {fmt_time(r['plan_s'])} | "
            f"{_f(r['peak_mb'], '.1f')} | "
            f"{_epoch(r['epoch'], timed)} | {_f(r.get('vs_binpack'), '.3f')}{'x' * has} |"
        )
    return out


def compare_text(plan: dict) -> list[str]:
    """What ``cfm-plan --compare`` prints: every sampler's row at every rank count."""
    c, s = plan["compare"], plan["stock"]
    return [
        f"every sampler (--compare): the budget of HydraGNN's, fairchem's and metatrain's "
        f"samplers {c['budget_atoms']:g} atoms ({c['budget_rule']}); DistributedSampler with "
        f"{s['batch_size']} graphs per rank ({'drop_last' if s['drop_last'] else 'padded'}); "
        f"seed {plan['binpack']['seed']}, epoch {plan['binpack']['epoch']}",
        *table(c["rows"], timed=bool(plan.get("time"))),
        "plan, peak (MB): one rank's plan of the epoch (every rank plans it all) on this "
        "machine, the other samplers as cfm-plan models them",
    ]
