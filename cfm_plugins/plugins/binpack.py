"""binpack: balanced bin-packing batches (Algorithm 1 of the MACE paper) on every rank.

Its options (``max_tokens``, ``cost``, ``cost_a``, ``cost_b``, ``step_balance``,
``calibrate_steps``, ``recalibrate_every``, ``oversize``, ``seed``, ``loss_weighting``,
``nonfinite``) are declared in
:func:`cfm_declare_options` (``cfm-run --list`` shows them). The default capacity
(:func:`default_capacity`) is the trainer's batch size times the mean graph cost, at least the
largest graph, clamped on GPUs. Each epoch is re-packed from ``seed + epoch``.

:func:`cfm_batch_sampler` makes each loader's sampler: under ``cost=auto`` the training sampler
fits the cost on the run's own step times after a calibration. ``loss_weighting=per_sample`` (the
default, :func:`training_loss_weighting`) makes every graph and every atom weigh the same over an
epoch (:mod:`cfm_plugins.sampler.weighting`); the trainer's adapter applies the factors to each
training batch. Evaluation loaders are never reweighted.
"""

from __future__ import annotations

import logging
import math
import weakref

import numpy as np

from cfm_plugins.distributed import reduce_op
from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.binpack")

#: the training samplers this process made, for the balance reported at the end of the run
_TRAINING: weakref.WeakSet = weakref.WeakSet()

GPU_TOKEN_RANGE = {"float32": (800, 4000), "float64": (400, 2000)}


def default_capacity(
    mean_cost: float, max_cost: float, batch_size: int, device: str = "cpu", dtype: str = "float64"
) -> int:
    """The default bin capacity: the trainer's batch size times the mean graph cost, so an epoch
    has about as many steps as with the trainer's own batches; on GPUs (``device == "cuda"``)
    clamped to the MACE paper's section 5.5 range (:data:`GPU_TOKEN_RANGE`: 800..4000 atoms in
    float32, 400..2000 in float64: enough to saturate an A100, below its memory ceiling); and at
    least the largest graph (``max_cost``)."""
    cap = math.ceil(mean_cost * max(int(batch_size), 1))
    if device == "cuda":
        lo, hi = GPU_TOKEN_RANGE.get(dtype, GPU_TOKEN_RANGE["float32"])
        cap = min(max(cap, lo), hi)
    return max(cap, math.ceil(max_cost))


@hookimpl
def cfm_declare_options():
    from cfm_plugins.nonfinite import MODES as NONFINITE_MODES
    from cfm_plugins.options import Option
    from cfm_plugins.sampler.packing import OVERSIZE_POLICIES
    from cfm_plugins.sampler.weighting import LOSS_WEIGHTINGS

    return [
        Option(
            "max_tokens",
            float,
            None,
            "bin capacity in cost units (default: the trainer's batch size x the mean graph cost, "
            "at least the largest graph; on GPUs clamped to 800..4000 atoms in float32, 400..2000 "
            "in float64)",
            positive=True,
        ),
        Option(
            "cost",
            str,
            "atoms",
            "cost of a graph: atoms, edges, linear (cost_a*atoms + cost_b*edges), or "
            "auto (fitted on the run's own step times after calibrate_steps steps)",
            COST_OPTIONS,
        ),
        Option(
            "cost_a",
            float,
            1.0,
            "atom weight of the linear cost (with cost=auto: of the calibration plans)",
        ),
        Option(
            "cost_b",
            float,
            0.0,
            "edge weight of the linear cost (with cost=auto: of the calibration plans)",
        ),
        Option(
            "step_balance",
            str,
            "edges",
            "what the bins of one step are made even in: edges (where cost counts atoms only: "
            "full bins all hold about max_tokens atoms, and a step's time follows its edges) or "
            "the cost itself",
            STEP_BALANCE_OPTIONS,
        ),
        Option(
            "calibrate_steps",
            int,
            0,
            "cost=auto: training steps timed before the first fit (0: one epoch); "
            "the fitted cost plans from the next epoch on",
        ),
        Option(
            "recalibrate_every",
            int,
            0,
            "cost=auto: refit every this many epochs on the steps since the last "
            "fit (0: never), for runs whose step cost changes (GPU warm-up, compilation)",
        ),
        Option(
            "oversize",
            str,
            "error",
            "a graph costlier than max_tokens: error, solo (a batch of its own) or skip",
            OVERSIZE_POLICIES,
        ),
        Option(
            "seed",
            int,
            None,
            "packing seed (default: the trainer's seed, else 0); epoch e packs from seed+e",
        ),
        Option(
            "loss_weighting",
            str,
            "per_sample",
            "training loss weighting: per_sample (every graph's energy term and every atom's "
            "forces term weigh the same over an epoch, whatever batch and rank it lands in; where "
            "the trainer's loss cannot be reweighted, stock, said once) or stock (the trainer's "
            "per-batch means, unchanged); evaluation is never reweighted",
            LOSS_WEIGHTINGS,
        ),
        Option(
            "nonfinite",
            str,
            "error",
            "a training step whose loss is NaN or infinite: error (stop before any checkpoint is "
            "written, naming the structures of the batch) or skip (no optimizer step on any rank "
            "for it, the skipped steps named at the end; one host sync per step)",
            NONFINITE_MODES,
        ),
    ]


@hookimpl
def cfm_needs_adapter():
    return True  # the sampler is used only where an adapter builds the trainer's loaders


COST_OPTIONS = ("atoms", "edges", "linear", "auto")
STEP_BALANCE_OPTIONS = ("edges", "cost")


def steps_by_edges(cost: str, step_balance: str) -> bool:
    """Whether the bins of a step are chosen by their edges rather than their cost: under
    ``cost=atoms`` with ``step_balance=edges`` (the other costs hold the edges already)."""
    return cost == "atoms" and step_balance == "edges"


@hookimpl
def cfm_needs_edges(config):
    if config.get("cost") != "atoms":
        return True
    # step_balance=edges uses the edges where the sizes carry them
    return "wanted" if steps_by_edges("atoms", config.get("step_balance")) else False


@hookimpl
def cfm_needs_step_times(config):
    return config.get("cost") == "auto"


def costs_from_sizes(sizes, config) -> np.ndarray:
    """Per-graph costs; under ``cost=auto`` those of the calibration plans (the linear cost)."""
    from cfm_plugins.sampler import graph_costs

    kind = config.get("cost")
    return graph_costs(
        sizes.atoms,
        sizes.edges,
        kind="linear" if kind == "auto" else kind,
        a=config.get("cost_a"),
        b=config.get("cost_b"),
    )


def step_clock(dist) -> str:
    """``cpu`` (thread CPU time) on CPU ranks with one intra-op thread, else ``wall``.

    On CPU the training thread runs forward and backward itself and uses no CPU while it waits for
    other ranks, so its CPU time is the rank's work whatever else shares the cores; with several
    intra-op threads it misses their share, and on GPUs the work is not on the thread at all.
    """
    import torch

    on_cpu = getattr(dist, "device_type", dist.device) == "cpu"
    return "cpu" if on_cpu and torch.get_num_threads() == 1 else "wall"


def global_stats(costs: np.ndarray, dist) -> tuple[float, float]:
    """(mean, max) cost over every rank's shard."""
    if dist.world_size == 1 or dist.comm is None:
        return float(np.mean(costs)), float(np.max(costs))
    n, total, peak = (
        dist.comm.allreduce(len(costs)),
        dist.comm.allreduce(float(np.sum(costs))),
        dist.comm.allreduce(
            float(np.max(costs)) if len(costs) else 0.0, op=reduce_op(dist.comm, "MAX")
        ),
    )
    return total / max(n, 1), peak


@hookimpl
def cfm_configure(config):
    for name in ("calibrate_steps", "recalibrate_every"):
        if config.get(name) < 0:
            raise ValueError(
                f"binpack option {name}={config.options.get(name)!r} must be >= 0 (0: "
                f"{'one epoch' if name == 'calibrate_steps' else 'never'})"
            )
        if config.get(name) and config.get("cost") != "auto":
            log.warning(
                "binpack option %s is read only with cost=auto (cost=%s here)",
                name,
                config.get("cost"),
            )


@hookimpl
def cfm_batch_sampler(dataset, sizes, config, dist, role, trainer):
    """The batch sampler of one loader: :class:`~cfm_plugins.sampler.BinPackBatchSampler`, or
    under ``cost=auto`` for the training loader :class:`~cfm_plugins.sampler.AutoCostBatchSampler`.

    ``cost=auto``: the training plans of the first epoch (or ``calibrate_steps`` steps) use
    ``cost_a*atoms + cost_b*edges`` (atoms by default), their steps packed at 70, 85 and 100 % of
    the capacity so that the counts vary (:func:`~cfm_plugins.sampler.packing.pack_levels`), the
    adapters hand every step's compute time to the sampler (:func:`cfm_needs_step_times` tells
    them to; the clock: :func:`step_clock`), and from the next epoch on the plans use a cost
    fitted on those times (see :mod:`cfm_plugins.sampler.autocost`). Evaluation loaders keep the
    initial cost (their steps run forward only) and are never reweighted.

    ``cost=atoms`` with ``step_balance=edges`` (the default): the bins of one step are chosen by
    their edges (the sampler's ``step_sizes``), where the graphs' sizes carry them on every rank.
    """
    from cfm_plugins.sampler import BinPackBatchSampler

    costs = costs_from_sizes(sizes, config)
    capacity = config.get("max_tokens")
    if capacity is None:
        mean, peak = global_stats(costs, dist)
        capacity = default_capacity(
            mean,
            peak,
            trainer.batch_size or 8,
            getattr(dist, "device_type", dist.device),
            trainer.dtype or "float64",
        )
    seed = config.get("seed")
    common = dict(
        rank=dist.rank,
        world_size=dist.world_size,
        seed=seed if seed is not None else (trainer.seed or 0),
        comm=dist.comm if dist.world_size > 1 else None,
        local_indices=sizes.indices,
        oversize=config.get("oversize"),
        shuffle=(role == "train"),
        evaluation=(role != "train"),
        repeat=(role == "train"),
        loss_weighting=training_loss_weighting(config, trainer) if role == "train" else "stock",
    )  # eval: never
    cost = config.get("cost")
    if cost == "auto" and role == "train":
        from cfm_plugins.sampler import AutoCostBatchSampler, CostCalibration

        if sizes.edges is None:
            raise ValueError(
                f"cost=auto needs the edge count of every graph, and the sizes of this "
                f"{type(dataset).__name__} came without them; use cost=atoms, or a dataset whose "
                "graphs carry their edges"
            )
        clock = step_clock(dist)
        calibration = CostCalibration(
            calibrate_steps=config.get("calibrate_steps"),
            recalibrate_every=config.get("recalibrate_every"),
            clock=clock,
        )
        sampler = AutoCostBatchSampler(
            sizes.atoms, sizes.edges, costs, capacity, calibration=calibration, **common
        )
        cost = (
            "auto: calibrating on "
            + (
                f"{calibration.calibrate_steps} steps"
                if calibration.calibrate_steps
                else "one epoch"
            )
            + f" planned with {initial_cost_label(config)}, "
            f"{'thread CPU' if clock == 'cpu' else 'wall-clock'} time"
        )
    else:
        by_edges = steps_by_edges(cost, config.get("step_balance")) and sizes.edges is not None
        if dist.world_size > 1 and dist.comm is not None:  # every rank alike (a collective)
            by_edges = bool(dist.comm.allreduce(int(by_edges), op=reduce_op(dist.comm, "MIN")))
        sampler = BinPackBatchSampler(
            costs,
            capacity,
            atoms=sizes.atoms if role == "train" else None,
            step_sizes=sizes.edges if by_edges else None,
            **common,
        )
        if cost == "auto":
            cost = (
                f"{initial_cost_label(config)}: "
                "evaluation loaders keep the initial cost under cost=auto"
            )
    from cfm_plugins.sampler.balance import count

    said = (
        f"binpack {role}: {count(len(sampler), 'step')} on each of "
        f"{count(dist.world_size, 'rank')}, capacity {capacity:g} ({cost})"
    )
    if config.first_time(said):  # mace builds its training loader twice
        log.info("%s", said)
    if role == "train":
        _TRAINING.add(sampler)
        if dist.rank == 0 and config.first_time("binpack weight spread"):
            log_weight_spread(sampler)
    if sampler.repeated:
        log.warning(
            "binpack %s: %d sample(s) do not give each of %d ranks a batch at every step: %d of "
            "them "
            "repeated in epoch %d (others in later epochs), as torch's DistributedSampler pads",
            role,
            len(sampler.costs),
            dist.world_size,
            sampler.repeated,
            sampler.epoch,
        )
    return sampler


def initial_cost_label(config) -> str:
    a, b = config.get("cost_a"), config.get("cost_b")
    return "atoms" if (a, b) == (1.0, 0.0) else f"{a:g}*atoms + {b:g}*edges"


def training_loss_weighting(config, trainer) -> str:
    """The ``loss_weighting`` the training sampler uses: the option's value where the trainer's
    adapter can apply it (``trainer.loss_weightings``). A weighting set explicitly that the
    adapter cannot apply is an error; the default (``per_sample``) falls back to ``stock``, said
    in one log line: a loss that has no per-sample weights to scale (mace's Huber loss, a trainer
    whose adapter offers none) trains as the trainer defines it.

    Batches filled to a token budget hold varying numbers of graphs, so a trainer's per-batch loss
    means weigh graphs (energy) and atoms (forces) unequally over an epoch. ``per_sample`` gives
    the training sampler the factors that make every graph and every atom weigh the same
    (:mod:`cfm_plugins.sampler.weighting`); the trainer's adapter applies them to each training
    batch (mace: the per-configuration ``energy_weight``/``forces_weight``/... fields; HydraGNN:
    each head's loss term; NequIP: each term of its loss). Evaluation loaders are never
    reweighted."""
    from cfm_plugins.options import UsageError

    wanted = config.get("loss_weighting")
    if wanted in trainer.loss_weightings:
        return wanted
    loss = trainer.loss or "this trainer's loss"
    why = (
        f"binpack loss_weighting={wanted}: {loss} cannot be reweighted per sample (the adapter "
        "scales per-sample weights only in losses linear in them; it offers "
        f"{', '.join(trainer.loss_weightings)})"
    )
    if "loss_weighting" in config.options:
        where = config.option_sources.get("loss_weighting")
        raise UsageError(
            f"{why}: set loss_weighting=stock or change the loss"
            + (f" (loss_weighting from {where})" if where else "")
        )
    if config.first_time(why):
        log.info("%s: using loss_weighting=stock", why)
    return "stock"


@hookimpl
def cfm_trainer_settings(config, trainer):
    """Check the loss weighting against the trainer's loss as soon as the adapter knows the loss,
    before any data is read (a ``UsageError``: cfm-run says it and exits 2)."""
    if trainer.loss is not None:
        training_loss_weighting(config, trainer)


@hookimpl
def cfm_after_trainer(config, dist, exit_code):
    if exit_code == 0 and dist is not None and dist.world_size > 1:
        log_balance(list(_TRAINING), config, dist)
    _TRAINING.clear()


def log_balance(samplers, config, dist) -> None:
    """At the end of a run of several ranks, rank 0 logs the balance of the training batches: the
    planned load imbalance factor (in the cost's units) and, where the adapter timed the steps
    (option ``step_log``, or ``cost=auto``), the measured one, over every rank's compute times
    (a few collectives, on every rank alike: call it on every rank)."""
    from cfm_plugins.sampler.autocost import WARMUP_STEPS
    from cfm_plugins.sampler.balance import count

    iterated = [s for s in samplers if s.planned_lif()[1]]
    # mace builds its training loader twice: the one that trained has the timed steps, or the
    # epochs set by the trainer, or the most passes
    sampler = max(
        iterated,
        key=lambda s: (len(s.step_times()), len(s.trainer_epochs), len(s.planned_lif()[1])),
        default=None,
    )
    times = sampler.step_times()[WARMUP_STEPS:] if sampler is not None else np.zeros((0, 2))
    measured = measured_lif(times, dist, step_clock(dist))
    if dist.rank != 0 or sampler is None:
        return
    # the epochs trained: those with timed steps, else those the trainer selected (set_epoch); a
    # trainer iterates its training loader otherwise too (mace reads it for its statistics and
    # evaluates on it), passes that are not epochs trained. Without either, every pass.
    trained = sampler.timed_epochs or sampler.trainer_epochs
    planned, by_epoch = sampler.planned_lif(trained or None)
    passes = count(len(by_epoch), "epoch") if trained else f"{count(len(by_epoch), 'pass')} over it"
    unit = "epoch" if trained else "pass"
    span = (
        ""
        if len(by_epoch) < 2
        else f" in every {unit}"
        if f"{min(by_epoch):.3f}" == f"{max(by_epoch):.3f}"
        else f" ({min(by_epoch):.3f} to {max(by_epoch):.3f} by {unit})"
    )
    if measured is None:
        measure = (
            "measured: not gathered (the ranks have no MPI communicator)"
            if dist.comm is None
            else "measured: the steps were not timed (option step_log=PATH times them, as "
            "cost=auto does)"
            if len(sampler.step_times()) == 0
            else f"measured: no step timed on every rank past the first {WARMUP_STEPS}"
        )
    else:
        lif, steps, clock = measured
        measure = (
            f"measured LIF {lif:.3f} from the compute times of {count(steps, 'step')} x "
            f"{count(dist.world_size, 'rank')} ({'thread CPU' if clock == 'cpu' else 'wall-clock'}"
            f" time; the first {WARMUP_STEPS} steps of the run left out as warm-up)"
        )
    cost = config.get("cost")
    units = (
        "the units of the costs packed with (initial, then fitted: cost=auto)"
        if cost == "auto"
        else initial_cost_label(config)
        if cost == "linear"
        else cost
    )
    log.info(
        "binpack balance of the training batches (%s): planned LIF %.3f in %s%s; %s",
        passes,
        planned,
        units,
        span,
        measure,
    )


def measured_lif(times, dist, clock: str):
    """``(LIF, steps, clock)`` of every rank's timed steps (``times``: this rank's ``(steps, 2)``
    wall and CPU seconds, -1 where not taken), or None where no step is timed on every rank.
    ``clock`` is preferred, the other one used where a rank lacks it. Collective: every rank calls
    it, with its own times."""
    comm = dist.comm
    if comm is None:
        return None
    n = comm.allreduce(len(times), op=reduce_op(comm, "MIN"))
    if n == 0:
        return None
    mine = np.ascontiguousarray(times[:n], dtype=np.float64)
    if hasattr(comm, "Allreduce"):  # mpi4py: element-wise, in buffers
        from mpi4py import MPI

        most, total, least = (np.empty_like(mine) for _ in range(3))
        comm.Allreduce(mine, most, op=MPI.MAX)
        comm.Allreduce(mine, total, op=MPI.SUM)
        comm.Allreduce(mine, least, op=MPI.MIN)
    else:  # ranks started without MPI (the rendezvous store's communicator)
        every = np.stack(comm.allgather(mine))
        most, total, least = every.max(axis=0), every.sum(axis=0), every.min(axis=0)
    for c in (clock, "wall" if clock == "cpu" else "cpu"):
        col = 0 if c == "wall" else 1
        if np.all(least[:, col] >= 0):
            mean = total[:, col].sum() / dist.world_size
            return (float(most[:, col].sum() / mean) if mean > 0 else float("nan"), n, c)
    return None


def log_weight_spread(sampler) -> None:
    """Say how unequally the trainer's own loss means weigh graphs and atoms over epoch 0's plan,
    and what ``loss_weighting`` does about it (step-wide means, as mace's loss; per-rank means
    differ
    little)."""
    from cfm_plugins.sampler.weighting import weight_spread

    graphs, atoms = weight_spread(sampler.plan(), sampler.atoms, "step")
    if sampler.loss_weighting == "per_sample":
        log.info(
            "binpack loss_weighting=per_sample: every graph and atom weighs the same over an epoch "
            "(the "
            "trainer's own means would weigh graphs up to %.1fx and atoms up to %.1fx apart)",
            graphs,
            atoms,
        )
    else:
        log.info(
            "binpack loss_weighting=stock: over an epoch the per-batch means weigh graphs up to "
            "%.1fx and atoms up to %.1fx apart (loss_weighting=per_sample makes them equal)",
            graphs,
            atoms,
        )
