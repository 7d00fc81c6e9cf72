"""Planned against measured: a run's step logs beside ``cfm-plan``'s plan of the same data and
options.

    python -m tools.plan_check RUN/steps -- DATA... --ranks 2 --batch-size 4 --seed 7 \\
        --device cpu --r-max 4.0

``RUN/steps`` is the run's ``step_log`` (``RUN/steps.rank<r>.jsonl``); after ``--`` come the
``cfm-plan`` arguments that describe the run (one rank count: the run's). For every epoch the log
holds, binpack's plan of that epoch is made as ``cfm-plan`` makes it and compared with the log
(:func:`compare`): the steps, each rank's atoms (and edges, where the log has them) at every step,
and the plan's LIF of a step time fitted on the run's own steps against the measured LIF of
``--time`` (default ``compute_cpu_s``), within a tolerance set by the clock's noise. Prints the
figures and exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

#: the run's first steps pay one-off costs (allocation, lazy initialisation): binpack's balance
#: report and ``cost=auto`` leave them out too
WARMUP = 3


def compare(
    step_log: str, plan_args: list[str], time_key: str = "compute_cpu_s", warmup: int = WARMUP
) -> dict:
    """The comparison as a dict: ``steps``, ``batches_equal``, ``edges_compared``,
    ``lif_planned``, ``lif_measured``, ``tolerance``, ``sigma``, ``fit``, ``ok``.

    For every epoch of ``step_log``, binpack's plan of that epoch (made from ``plan_args`` as
    ``cfm-plan`` makes it) against the log:

    - steps: equal;
    - batches: each rank's atoms (and edges, where the log has them) at every step, equal;
    - LIF: the plan's, with the step time fitted on the run's own logged steps after ``warmup``
      (:func:`~cfm_plugins.sampler.autocost.fit_step_times`, what ``cost=auto`` fits), against the
      measured LIF of ``time_key`` (default the compute time of the training thread,
      ``compute_cpu_s``) over the same steps, within ``0.56 sigma + 3 sigma / sqrt(steps) + 0.01``:
      ``sigma`` is the relative spread of the measured times about the fit (the clock's noise,
      which no plan can know), ``0.56 sigma`` the expected excess of the slower of two ranks over
      the mean under it, ``3 sigma / sqrt(steps)`` three standard errors of a mean over the steps,
      and 0.01 the fit's misfit of the counts.
    """
    from cfm_plugins.plan.cli import build_parser, prepare
    from cfm_plugins.plan.planning import binpack_plan, packing_costs
    from cfm_plugins.sampler import load_imbalance_factor
    from cfm_plugins.sampler.autocost import fit_step_times
    from cfm_plugins.steplog import read_step_logs

    args = build_parser().parse_args([*plan_args, "-q", "--no-cache"])
    # training steps only (NequIP's logs hold its validation steps too, as stage "val")
    ranks_logged = [
        [r for r in rank if r.get("stage", "train") == "train"] for rank in read_step_logs(step_log)
    ]
    world = len(ranks_logged)
    if args.ranks != [world]:
        raise ValueError(f"the log has {world} ranks; give --ranks {world}")
    prep = prepare(args)
    opts = prep.opts
    costs, capacity, _ = packing_costs(prep.atoms, prep.edges, opts)
    epochs = sorted({r.get("epoch", 0) for r in ranks_logged[0]})
    out = {"epochs": {}, "batches_equal": True, "edges_compared": False}
    planned_t = []
    steps_logged = []
    for e in epochs:
        logged = [[r for r in rank if r.get("epoch", 0) == e] for rank in ranks_logged]
        opts.epoch = e
        packing = binpack_plan(costs, capacity, world, opts)
        n = packing.num_steps(world)
        same_steps = all(len(x) == n for x in logged)
        atoms_ok = edges_ok = same_steps
        if same_steps:
            plan_atoms = packing.step_costs(prep.atoms, world)
            log_atoms = np.array([[s["atoms"] for s in x] for x in logged]).T
            atoms_ok = np.array_equal(plan_atoms, log_atoms)
            if prep.edges is not None and all(s.get("edges") is not None for s in logged[0]):
                out["edges_compared"] = True
                log_edges = np.array([[s["edges"] for s in x] for x in logged]).T
                edges_ok = np.array_equal(packing.step_costs(prep.edges, world), log_edges)
            planned_t.append(packing)
            steps_logged.extend(zip(*logged))
        out["epochs"][e] = {
            "planned_steps": n,
            "logged_steps": [len(x) for x in logged],
            "atoms_equal": bool(atoms_ok),
            "edges_equal": bool(edges_ok),
        }
        out["batches_equal"] &= bool(atoms_ok and edges_ok)
    out["steps_equal"] = all(
        all(m == v["planned_steps"] for m in v["logged_steps"]) for v in out["epochs"].values()
    )
    kept = steps_logged[warmup:]
    if len(kept) >= 4 and out["steps_equal"]:
        times = np.array([[r[time_key] for r in s] for s in kept])
        # the counts of the plan's batches (the run's, where the batches are equal; edges also
        # where the log has none, NequIP's)
        edges = prep.edges if prep.edges is not None else np.zeros(len(prep.atoms))
        counts = [
            np.concatenate([p.step_costs(x, world) for p in planned_t])[warmup:]
            for x in (prep.atoms, edges, np.ones(len(prep.atoms)))
        ]
        fit = fit_step_times(times, *counts, outlier_cutoff=None)
        planned = fit.predict(*counts)
        sigma = float(np.std(times / planned - 1.0, ddof=1))
        measured = load_imbalance_factor(times)
        out.update(
            lif_planned=load_imbalance_factor(planned),
            lif_measured=measured,
            lif_planned_cost=load_imbalance_factor(
                np.concatenate([p.step_costs(costs, world) for p in planned_t])[warmup:]
            ),
            sigma=sigma,
            tolerance=0.56 * sigma + 3 * sigma / math.sqrt(len(kept)) + 0.01,
            fit=fit.formula(),
            steps_timed=len(kept),
        )
        out["lif_ok"] = abs(out["lif_planned"] - measured) <= out["tolerance"]
    else:
        out["lif_ok"] = False
    out["ok"] = bool(out["steps_equal"] and out["batches_equal"] and out["lif_ok"])
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m tools.plan_check")
    ap.add_argument("step_log")
    ap.add_argument("--time", default="compute_cpu_s", help="the logged time to compare")
    ap.add_argument("--warmup", type=int, default=WARMUP)
    a = ap.parse_args(argv[:cut])
    out = compare(a.step_log, argv[cut + 1 :], a.time, a.warmup)
    for e, v in out["epochs"].items():
        print(
            f"epoch {e}: steps planned {v['planned_steps']}, logged {v['logged_steps']}; atoms "
            f"{'equal' if v['atoms_equal'] else 'DIFFER'}, edges "
            f"{'equal' if v['edges_equal'] else 'DIFFER'}"
            + ("" if out["edges_compared"] else " (not logged)")
        )
    if "lif_planned" in out:
        print(
            f"LIF planned {out['lif_planned']:.4f} (in the cost's units "
            f"{out['lif_planned_cost']:.4f}), measured {out['lif_measured']:.4f} ({a.time}, "
            f"{out['steps_timed']} steps after {a.warmup}); tolerance {out['tolerance']:.4f} "
            f"(sigma {out['sigma']:.4f}); fit {out['fit']}"
        )
    print("OK" if out["ok"] else "MISMATCH")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
