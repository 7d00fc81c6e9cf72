"""``BinPackBatchSampler``: the packer as a torch batch sampler, one per rank, agreed through MPI.

Every rank computes the same plan (:func:`~cfm_plugins.sampler.packing.pack` is deterministic
for a seed) from the global cost array and takes bin ``step*world_size + rank`` at each step, so
every rank has the same number of steps and nearly the same work at each step. With an mpi4py
communicator the ranks may hold only their shard of the costs (``local_indices``): the shards
are gathered once, and the ranks compare a checksum of their plan where it is made: at
construction and at every :meth:`~BinPackBatchSampler.set_epoch` (the trainer's call, on every
rank alike). Iterating makes no collective call: a trainer may iterate a loader on some ranks only
(a size probe, a preview on rank 0), or more often on one rank than on another.

With ``loss_weighting="per_sample"`` the sampler also gives, for every batch it yielded, the loss
scales that make each graph and atom weigh the same over the epoch (:mod:`.weighting`); a trainer
adapter applies them to the batch the DataLoader returns
(:meth:`BinPackBatchSampler.next_loss_scale`).
"""

from __future__ import annotations

import collections
import hashlib
import logging
from array import array

import numpy as np
from torch.utils.data import Sampler

from .autocost import (
    Calibration,
    align_records,
    data_digest,
    fit_step_times,
    fitted_costs,
    min_fit_steps,
    only_warmup,
    predicted_lif,
    too_few_steps,
)
from .balance import count, load_imbalance_factor
from .bins import (
    Packing,
    check_capacity,
    check_world_size,
    packing_from_bins,
    validate_costs,
    validate_step_sizes,
)
from .even_dims import pack_even_dims
from .packing import pack, pack_even, pack_levels
from .weighting import LossScale, check_loss_weighting, check_reduction, per_sample_scales

log = logging.getLogger("cfm_plugins.sampler")


def _rank_list(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def gather_shards(costs: np.ndarray, local_indices, comm) -> np.ndarray:
    """Global cost array from every rank's ``(local_indices, costs)`` shard (a collective call).

    ``costs`` may have further columns (``(n, k)``: several values per sample, gathered alike).

    Raises ``ValueError`` (on every rank) if the shards overlap or leave gaps.
    """
    idx = np.asarray(local_indices, dtype=np.int64)
    if idx.ndim != 1 or idx.shape != costs.shape[:1]:
        raise ValueError(
            f"local_indices has shape {idx.shape} but costs has shape {costs.shape}: "
            "give one global dataset index per local cost"
        )
    parts = comm.allgather((idx, costs))
    all_idx = np.concatenate([p[0] for p in parts])
    all_cost = np.concatenate([np.asarray(p[1], dtype=np.float64) for p in parts])
    if len(all_idx) == 0:
        raise ValueError("costs is empty on every rank: the dataset has no samples to batch")
    if all_idx.min() < 0:
        r = next(r for r, p in enumerate(parts) if len(p[0]) and p[0].min() < 0)
        raise ValueError(f"rank {r} gave a negative global index in local_indices")
    n = int(all_idx.max()) + 1
    seen = np.bincount(all_idx, minlength=n)
    if np.any(seen > 1):
        dup = np.flatnonzero(seen > 1)
        owners = [r for r, p in enumerate(parts) if np.isin(p[0], dup[:1]).any()]
        raise ValueError(
            f"shards overlap: {len(dup)} sample(s) appear on more than one rank, e.g. sample "
            f"{int(dup[0])} on ranks {_rank_list(owners)}; give each global index to exactly one "
            "rank"
        )
    if np.any(seen == 0):
        gap = np.flatnonzero(seen == 0)
        raise ValueError(
            f"shards leave gaps: {len(gap)} sample(s) of 0..{n - 1} are on no rank, e.g. "
            f"{gap[:5].tolist()}; every global index must belong to one rank"
        )
    out = np.empty((n,) + all_cost.shape[1:], dtype=np.float64)
    out[all_idx] = all_cost
    return out


def _digest(values) -> str | None:
    """A digest of a per-sample array (``None`` for none): what the ranks compare of it."""
    if values is None:
        return None
    return hashlib.blake2b(np.ascontiguousarray(values).tobytes(), digest_size=16).hexdigest()


class BinPackBatchSampler(Sampler):
    """Yields this rank's batches (lists of dataset indices) of a balanced bin-packing plan.

    Every rank builds the same plan of the whole dataset and takes bin ``step*world_size + rank``
    at each step, so every rank has the same number of steps and nearly the same work at each.
    The packer follows the options: :func:`~cfm_plugins.sampler.packing.pack` (full bins,
    Algorithm 1), :func:`~cfm_plugins.sampler.packing.pack_even` with ``even`` (bins of nearly
    equal cost, for batches padded to one budget), and
    :func:`~cfm_plugins.sampler.even_dims.pack_even_dims` when :attr:`even_dims` is set too.
    Use it as ``DataLoader(dataset, batch_sampler=sampler)`` on every rank.

    Args:
        costs: per-sample costs (finite, > 0); global (``costs[i]`` is sample ``i``) unless
            ``local_indices``.
        capacity: bin budget in cost units (e.g. 3072 atoms).
        rank: this rank, ``0 <= rank < world_size``.
        world_size: the number of ranks (one bin per rank per step).
        seed: the plan of epoch ``e`` is packed from ``seed + e`` (:meth:`set_epoch`).
        comm: an mpi4py communicator (duck-typed: ``allgather``), needed when ``local_indices``
            hold a shard; also used to check that all ranks have the same plan, at construction
            and at every :meth:`set_epoch` (never while iterating).
        local_indices: global dataset index of each entry of ``costs`` (this rank's shard).
        drop_last: drop the steps whose bins average less than half the capacity (the few
            bins of leftovers); their samples are not seen in that epoch (logged).
            ``False`` (default): every sample is used exactly once per epoch.
        oversize: ``"error"``, ``"skip"`` or ``"solo"`` for samples costlier than ``capacity``
            (see :func:`~cfm_plugins.sampler.packing.pack`).
        shuffle: ``True``: a new plan each epoch (random ties, step order, rank mapping, order
            inside batches). ``False``: the deterministic plan, the same every epoch.
        evaluation: for evaluation loaders: a set too small for the capacity and the number of
            ranks gets a plan anyway instead of an error.
        repeat: for training loaders: a set too small for the ranks gets a few samples
            repeated, as torch's ``DistributedSampler`` pads, instead of an error;
            :attr:`repeated` says how many in the current epoch.
        atoms: per-sample atom counts, indexed like ``costs`` (a shard with ``local_indices``);
            needed by ``loss_weighting="per_sample"``, gathered like the costs.
        loss_weighting: ``"stock"`` (the trainer's own loss, unchanged) or ``"per_sample"``:
            :meth:`next_loss_scale` gives the factors of each yielded batch (see
            :mod:`cfm_plugins.sampler.weighting`).
        even: bins of nearly equal cost instead of full ones, as many; a settable attribute
            (the ``static`` feature sets it, and :attr:`even_dims`).
        step_sizes: ``None``, or a size per sample (finite, >= 0; indexed like ``costs``, a
            shard with ``local_indices``, gathered like the costs) whose bin sums choose the
            bins of each step instead of the bins' costs (``pack``'s ``step_sizes``: edges,
            where the cost counts atoms); part of the options the ranks compare.

    Raises:
        ValueError: a bad ``rank``, ``world_size``, ``seed``, ``capacity``, cost or step size
            (naming the sample); a plan the options cannot make (a sample over the capacity under
            ``oversize="error"``, too few samples for the ranks without ``repeat`` or
            ``evaluation``); shards that overlap or leave gaps; ranks with different global
            costs; ``loss_weighting="per_sample"`` without ``atoms``. Raised at construction,
            on every rank.

    ``len()`` is the number of steps of the current epoch, the same on every rank.
    ``state_dict()`` records epoch, seed and the batches yielded so far; after
    ``load_state_dict`` the next iteration continues with the next batch.

    Collective calls (with ``comm``): construction and :meth:`set_epoch` only, which every rank
    makes alike (trainers call ``set_epoch`` on every rank at every epoch). Both compare the
    plan's checksum and the options the plans follow from (seed, capacity, packer options) across
    the ranks and raise ``RuntimeError`` on every rank when they differ. A plan is a deterministic
    function of the costs, the capacity, the options and the epoch, all checked at construction,
    so iterating needs no collective: ``__iter__``, ``len()``, :meth:`select_epoch` (a wrapper's
    own epoch advance) and :meth:`batch_at` never call the communicator.
    """

    def __init__(
        self,
        costs,
        capacity,
        *,
        rank: int,
        world_size: int,
        seed: int = 0,
        comm=None,
        local_indices=None,
        drop_last: bool = False,
        oversize: str = "error",
        shuffle: bool = True,
        evaluation: bool = False,
        repeat: bool = False,
        atoms=None,
        loss_weighting: str = "stock",
        even: bool = False,
        step_sizes=None,
    ):
        # world_size and capacity first (rank is checked against world_size; comm against both);
        # oversize and the costs are checked by ``pack``, which runs at the end of the constructor
        world_size = check_world_size(world_size)
        if int(rank) != rank or not 0 <= rank < world_size:
            raise ValueError(
                f"rank {rank!r} is not in 0..{world_size - 1} (world_size {world_size})"
            )
        if int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.rank, self.world_size, self.seed = int(rank), world_size, int(seed)
        self.capacity = check_capacity(capacity)
        self.comm, self.drop_last, self.oversize, self.shuffle = (
            comm,
            bool(drop_last),
            oversize,
            bool(shuffle),
        )
        self.evaluation, self.repeat, self.even = bool(evaluation), bool(repeat), bool(even)
        #: with ``even``, per-sample sizes (``(n, k)``: atoms, edges) the bins are to be even in too
        #: (:func:`~cfm_plugins.sampler.even_dims.pack_even_dims`); set by the ``static`` plugin
        self.even_dims = None
        self.loss_weighting = check_loss_weighting(loss_weighting)
        if self.loss_weighting != "stock" and atoms is None:
            raise ValueError(
                f"loss_weighting={loss_weighting!r} needs the atom count of every sample "
                "(atoms=...)"
            )
        if comm is not None:
            self._check_comm(comm)
        self.costs = validate_costs(self._global(costs, local_indices))
        self.atoms = None if atoms is None else self._global(atoms, local_indices, check=False)
        if step_sizes is not None:  # checked as given (this rank's shard), then gathered
            step_sizes = validate_step_sizes(step_sizes, np.size(costs))
            step_sizes = self._global(step_sizes, local_indices, check=False)
        self.step_sizes = validate_step_sizes(step_sizes, len(self.costs))
        if self.atoms is not None and self.atoms.shape != self.costs.shape:
            raise ValueError(
                f"atoms has {self.atoms.size} entries, costs {self.costs.size}: give one atom "
                "count per sample"
            )
        self._yielded_bins: collections.deque = (
            collections.deque()
        )  # bins yielded, scales not yet taken
        self._scales: dict = {}  # (plan key, reduction) -> per-bin scales
        self.epoch = 0
        self._resume = 0  # batches to skip at the next __iter__ (set by load_state_dict)
        self.first_step = 0  # the step the current (or next) pass starts at
        self._yielded = 0  # batches yielded in the current epoch
        self._plan: Packing | None = None
        self._plan_key = None
        self._dropped: tuple[int, int] = (0, 0)
        self._cost_version = 0  # bumped when the costs change (cost=auto), part of the plan's key
        #: epoch -> (sum over steps of the largest bin cost, of the mean bin cost, steps) of the
        #: plans iterated: the planned balance (:meth:`planned_lif`)
        self._planned: dict[int, tuple[float, float, int]] = {}
        #: this rank's timed training steps (:meth:`record_time`): wall, CPU seconds, -1 if not
        #: taken
        self._times = array("d")
        #: the epochs that had timed steps: the ones trained (a trainer may also iterate the
        #: training loader to evaluate, untimed)
        self.timed_epochs: set[int] = set()
        #: the epochs a trainer selected with :meth:`set_epoch`: the ones it trains (a pass over
        #: the loader it makes otherwise, e.g. for statistics, does not count)
        self.trainer_epochs: set[int] = set()
        self.plan()  # errors (oversize, too many ranks) surface at construction
        self._verify()  # every rank constructs its sampler: the one collective point besides
        # set_epoch

    def _global(self, values, local_indices, check: bool = True) -> np.ndarray:
        """The global array of per-sample ``values`` (this rank's shard with ``local_indices``)."""
        local = np.asarray(values, dtype=np.float64) if np.size(values) else np.zeros(0)
        if local_indices is None:
            if check and self.comm is not None and self.world_size > 1:
                self._check_same_costs(local)
            return local
        if self.comm is not None:
            return gather_shards(local, local_indices, self.comm)
        idx = np.asarray(local_indices, dtype=np.int64)
        if idx.shape != local.shape or not np.array_equal(np.sort(idx), np.arange(len(idx))):
            raise ValueError(
                "local_indices hold a shard but comm is None: pass the mpi4py communicator "
                "(comm=MPI.COMM_WORLD) so the shards can be gathered, or give global costs"
            )
        glob = np.empty(len(idx))
        glob[idx] = local
        return glob

    # -- MPI checks ----------------------------------------------------------------------------
    def _check_comm(self, comm):
        size = comm.Get_size() if hasattr(comm, "Get_size") else None
        if size is not None and size != self.world_size:
            raise ValueError(f"world_size={self.world_size} but the communicator has {size} ranks")
        if hasattr(comm, "Get_rank") and comm.Get_rank() != self.rank:
            raise ValueError(
                f"rank={self.rank} but this process is rank {comm.Get_rank()} of the communicator"
            )

    def _check_same_costs(self, glob: np.ndarray):
        digest = (
            len(glob),
            hashlib.blake2b(np.ascontiguousarray(glob).tobytes(), digest_size=16).hexdigest(),
        )
        everyone = self.comm.allgather(digest)
        odd = [r for r, d in enumerate(everyone) if d != everyone[0]]
        if odd:
            raise ValueError(
                f"ranks {_rank_list(odd)} have different global costs than rank 0 "
                f"({[d[0] for d in everyone]} samples): without local_indices every rank must "
                "give the same global cost array"
            )

    def _options(self) -> tuple:
        """The options the plans follow from, besides the costs (checked where they are given)."""
        return (
            ("seed", self.seed),
            ("capacity", self.capacity),
            ("shuffle", self.shuffle),
            ("oversize", self.oversize),
            ("evaluation", self.evaluation),
            ("repeat", self.repeat),
            ("drop_last", self.drop_last),
            ("even", self.even),
            ("even_dims", self.even_dims is not None),
            ("loss_weighting", self.loss_weighting),
            ("step_sizes", _digest(self.step_sizes)),
        )

    def _verify(self) -> None:
        """Compare the current plan's checksum and the options across ranks (collective: called
        at construction and by :meth:`set_epoch`, which every rank makes alike; never while
        iterating). Raises ``RuntimeError`` on every rank when they differ."""
        if self.comm is None:
            return
        sums = self.comm.allgather((self.plan().checksum(), self._options()))
        odd = [r for r, x in enumerate(sums) if x != sums[0]]
        if not odd:
            return
        groups = {}
        for r, (h, _) in enumerate(sums):
            groups.setdefault(h, []).append(r)
        desc = "; ".join(f"ranks [{_rank_list(rs)}] have plan {h[:12]}" for h, rs in groups.items())
        other = [
            f"{name}: "
            + ", ".join(f"rank {r} {dict(opts)[name]!r}" for r, (_, opts) in enumerate(sums))
            for name, value in sums[0][1]
            if any(dict(opts)[name] != value for _, opts in sums)
        ]
        raise RuntimeError(
            f"the ranks disagree on the batch plan of epoch {self.epoch}: ranks "
            f"{_rank_list(odd)} differ from rank 0 ({desc}"
            + (f"; options differ: {'; '.join(other)}" if other else "")
            + "); give every rank the same seed, capacity, costs and options, and call "
            "set_epoch with the same epoch on every rank"
        )

    # -- the plan ------------------------------------------------------------------------------
    def _pack_seed(self, epoch: int | None = None):
        return self.seed + (self.epoch if epoch is None else int(epoch)) if self.shuffle else None

    def packing_of_epoch(self, epoch: int) -> Packing:
        """The (global) packing of epoch ``epoch``, before ``drop_last``, without changing the
        sampler's epoch: what the epochs ahead will hold (padded batches size their budget from
        it)."""
        options = dict(
            oversize=self.oversize,
            evaluation=self.evaluation,
            repeat=self.repeat,
            step_sizes=self.step_sizes,
        )
        args = (self.capacity, self.world_size, self._pack_seed(epoch))
        if not self.even:  # full bins (Algorithm 1)
            return pack(self.costs, *args, **options)
        if self.even_dims is None:  # bins even in the cost
            return pack_even(self.costs, *args, **options)
        return pack_even_dims(self.costs, self.even_dims, *args, **options)  # and in atoms, edges

    def plan(self) -> Packing:
        """The (global) packing of the current epoch, after ``drop_last``."""
        key = (
            self._pack_seed(),
            self.epoch if self.shuffle else None,
            self._cost_version,
            self.even,
            None if self.even_dims is None else id(self.even_dims),
        )
        if self._plan is None or self._plan_key != key:
            p = self.packing_of_epoch(self.epoch)
            if self.drop_last:
                p = self._drop_underfilled(p)
            self._plan, self._plan_key = p, key
        return self._plan

    def _drop_underfilled(self, p: Packing) -> Packing:
        w = self.world_size
        sc = p.step_costs(self.costs, w)
        keep = sc.mean(axis=1) >= 0.5 * self.capacity
        if keep.all():
            self._dropped = (0, 0)
            return p
        if not keep.any():
            raise ValueError(
                "drop_last=True would drop every step (all bins under half the capacity); "
                "use drop_last=False or a smaller capacity"
            )
        kept = packing_from_bins(
            [p[b] for b in np.flatnonzero(np.repeat(keep, w))], w, solo=p.solo, skipped=p.skipped
        )
        n_drop = len(p.indices) - len(kept.indices)
        self._dropped = (int((~keep).sum()), int(n_drop))
        log.info(
            "drop_last: dropped %d step(s) whose bins average under half the capacity (%d samples "
            "not seen in epoch %d)",
            self._dropped[0],
            n_drop,
            self.epoch,
        )
        return kept

    @property
    def repeated(self) -> int:
        """Samples placed twice in the current epoch's plan so that every rank has a batch
        (``repeat``)."""
        return len(self.plan().repeated)

    @property
    def dropped(self) -> tuple[int, int]:
        """(steps, samples) dropped by ``drop_last`` in the current epoch's plan."""
        self.plan()
        return self._dropped

    # -- torch Sampler protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return self.plan().num_steps(self.world_size)

    def __iter__(self):
        # no collective here: a trainer may iterate a loader on some ranks only
        plan = self.plan()
        start, self._resume = self._resume, 0
        epoch = self.epoch
        sc = plan.step_costs(self.costs, self.world_size)
        self._planned[epoch] = (float(sc.max(axis=1).sum()), float(sc.mean(axis=1).sum()), len(sc))
        self._yielded = start
        self.first_step = start
        self._yielded_bins.clear()  # a new pass: scales left from an abandoned one are stale
        weighted = self.loss_weighting != "stock"
        for s in range(start, plan.num_steps(self.world_size)):
            b = s * self.world_size + self.rank
            batch = self._rank_batch(plan, s, epoch)
            self._yielded = s + 1
            if weighted:
                self._yielded_bins.append((self._plan_key, b))
            yield batch.tolist()

    def _rank_batch(self, plan: Packing, step: int, epoch: int) -> np.ndarray:
        batch = plan[step * self.world_size + self.rank]
        if self.shuffle:
            batch = np.random.default_rng((self.seed, epoch, step, self.rank)).permutation(batch)
        return batch

    def batch_at(self, step: int) -> list[int]:
        """The dataset indices of this rank's batch at ``step`` of the current epoch, in the order
        :meth:`__iter__` yields them (an adapter names the structures of a batch with them: the
        k-th batch a pass returns is step ``first_step + k``)."""
        plan = self.plan()
        steps = plan.num_steps(self.world_size)
        if not 0 <= int(step) < steps:
            raise IndexError(f"step {step} is not in 0..{steps - 1} of epoch {self.epoch}")
        return self._rank_batch(plan, int(step), self.epoch).tolist()

    # -- the balance achieved -------------------------------------------------------------------
    def planned_lif(self, epochs=None) -> tuple[float, list[float]]:
        """The load imbalance factor of the plans iterated so far (of ``epochs`` only, if given),
        in the units of the costs they were packed with (over all their steps), and that of each
        epoch's plan (epoch order); NaN before any iteration."""
        parts = [self._planned[e] for e in sorted(self._planned) if epochs is None or e in epochs]
        if not parts:
            return float("nan"), []
        total = sum(p[1] for p in parts)
        overall = sum(p[0] for p in parts) / total if total > 0 else float("nan")
        return overall, [p[0] / p[1] if p[1] > 0 else float("nan") for p in parts]

    def record_time(self, wall_s: float | None = None, cpu_s: float | None = None) -> None:
        """One timed training step of this rank (its compute time, wall-clock and/or thread CPU
        seconds), for the measured balance (:meth:`step_times`); adapters hand every timed step
        over (:func:`cfm_plugins.step_timer.hand_over`)."""
        self._times.extend(
            (
                -1.0 if wall_s is None else float(wall_s),
                -1.0 if cpu_s is None else float(cpu_s),
            )
        )
        self.timed_epochs.add(self.epoch)

    def step_times(self) -> np.ndarray:
        """This rank's timed training steps as a ``(steps, 2)`` array of wall and CPU seconds
        (-1 where the adapter could not take that clock), in the order they ran."""
        return np.frombuffer(self._times, dtype=np.float64).reshape(-1, 2).copy()

    # -- loss weighting ------------------------------------------------------------------------
    def loss_scales(self, reduction: str = "step") -> np.ndarray:
        """``(num_bins, 2)`` factors ``[graphs, atoms]`` of every bin of the current plan (all 1
        under ``loss_weighting="stock"``); ``reduction`` is how the trainer averages its loss
        over ranks (:mod:`cfm_plugins.sampler.weighting`)."""
        check_reduction(reduction)
        plan = self.plan()
        if self.loss_weighting == "stock":
            return np.ones((len(plan), 2))
        key = (self._plan_key, reduction)
        if key not in self._scales:
            self._scales = {
                key: per_sample_scales(plan, self.atoms, reduction)
            }  # the current plan's only
        return self._scales[key]

    def next_loss_scale(self, reduction: str = "step") -> LossScale:
        """The factors of the oldest batch yielded and not yet scaled, in the order batches were
        yielded.

        A DataLoader returns batches in the order its batch sampler yielded them (prefetching
        workers included), so an adapter calls this once for every batch the loader returns.
        Under ``loss_weighting="stock"`` the factors are 1.
        """
        if self.loss_weighting == "stock":
            return LossScale(1.0, 1.0)
        if not self._yielded_bins:
            raise RuntimeError(
                "next_loss_scale: no batch was yielded since the last call (call it once per batch "
                "the DataLoader returns)"
            )
        key, b = self._yielded_bins.popleft()
        if key != self._plan_key:
            raise RuntimeError(
                "next_loss_scale: the batch belongs to a plan that is no longer the current one "
                "(set_epoch was called during an epoch)"
            )
        g, a = self.loss_scales(reduction)[b]
        return LossScale(float(g), float(a))

    def set_epoch(self, epoch: int) -> None:
        """The trainer's call: select epoch ``epoch`` (plan packed from ``seed + epoch``), start it
        from its first batch, and check the plan across ranks (collective: call it on every rank,
        as trainers call ``DistributedSampler.set_epoch``). The same epoch again keeps a position
        restored by :meth:`load_state_dict`."""
        self.select_epoch(epoch)
        self.trainer_epochs.add(self.epoch)
        self._verify()

    def select_epoch(self, epoch: int) -> None:
        """:meth:`set_epoch` without the check across ranks (no collective call): for a wrapper
        that makes each pass over the loader a new epoch on its own (which a rank may do more
        often than another); the trainer's own ``set_epoch`` calls check the plan."""
        if int(epoch) != epoch or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if int(epoch) != self.epoch:
            self._resume = 0
            self._yielded = 0
        self.epoch = int(epoch)

    def state_dict(self, batches_consumed: int | None = None) -> dict:
        """Epoch, seed and batches consumed in the epoch (default: the batches yielded so far;
        pass the number actually trained on when a DataLoader prefetches ahead)."""
        done = self._yielded if batches_consumed is None else int(batches_consumed)
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "batches_consumed": done,
            "world_size": self.world_size,
            "num_batches": len(self),
            "checksum": self.plan().checksum(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration continues with batch ``state['batches_consumed']`` of its
        epoch."""
        ws = state.get("world_size", self.world_size)
        if ws != self.world_size:
            raise ValueError(
                f"state was saved with world_size {ws}, this sampler has {self.world_size}: the "
                "plan differs; resume from the start of an epoch instead (set_epoch)"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        done = int(state["batches_consumed"])
        n = len(self)
        if not 0 <= done <= n:
            raise ValueError(f"batches_consumed={done} is not in 0..{n} for epoch {self.epoch}")
        if "checksum" in state and state["checksum"] != self.plan().checksum():
            log.warning(
                "resumed plan differs from the saved one (costs or options changed): the rest of "
                "epoch %d may repeat or miss samples",
                self.epoch,
            )
        self._resume = done
        self._yielded = done


class BatchSamplerWrapper(Sampler):
    """Stands in for a batch sampler where a trainer expects another object (adapters subclass it
    to route the trainer's ``set_epoch`` calls): iteration, ``len`` and ``state_dict`` are the
    wrapped sampler's."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def state_dict(self):
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state):
        self.batch_sampler.load_state_dict(state)


class AutoCostBatchSampler(BinPackBatchSampler):
    """A :class:`BinPackBatchSampler` whose costs are fitted on the run's own step times
    (``cost=auto``).

    The first epoch (or the first ``calibration.calibrate_steps`` steps) is planned with
    ``initial_costs``, its steps packed at the calibration's capacity levels
    (:func:`~cfm_plugins.sampler.packing.pack_levels`: 70, 85 and 100 % of ``capacity``, so that the
    counts of the timed steps vary; one capacity where bins are padded, ``even``); the adapter
    hands every training step's compute time to :meth:`record_step`; then the records of all ranks
    are gathered once (``comm.allgather``), rank 0 fits them
    (:func:`~cfm_plugins.sampler.autocost.fit_step_times`) and every rank takes rank 0's verdict,
    so every rank computes the same costs and the same plan (the checksum still holds). The fits
    are the state a resume needs (:meth:`resume_state`, :meth:`load_resume_state`): step times
    cannot be measured again, so a resumed run must be given the fits of the interrupted one to
    plan the same batches.

    Where the gather happens (a collective: at a point every rank reaches equally, never in
    ``__iter__``, which a trainer may call on some ranks only):

    - in :meth:`set_epoch`, the trainer's call on every rank at the start of every epoch (mace
      through the adapter's ``train_one_epoch``, HydraGNN's loop, Lightning), when a fit is due
      for that epoch (:meth:`CostCalibration.due`, from the steps planned by the ``set_epoch``
      calls before it); the fit applies from that epoch;
    - for a trainer that never calls ``set_epoch`` and only iterates (each pass a new epoch through
      :meth:`select_epoch`, e.g. the mace adapter's ``EpochAdvancing`` outside mace's loop): in
      :meth:`record_step` of the last step of an epoch (every rank trains the same steps and hands
      every one over, the ``record_step`` protocol); the verdict is taken on every rank at the next
      :meth:`select_epoch` and the fit applies from the next epoch, as with ``set_epoch``. A pass
      that is not trained (untimed) does not reach it.

    Args (beyond :class:`BinPackBatchSampler`'s): ``atoms``, ``edges``: per-sample counts (global,
    or this rank's shard with ``local_indices``); ``initial_costs``: the costs of the calibration
    plans, in the units of ``capacity`` (fitted costs are scaled to the same total);
    ``calibration``: a :class:`~cfm_plugins.sampler.autocost.CostCalibration` (schedule, clock).
    """

    def __init__(
        self,
        atoms,
        edges,
        initial_costs,
        capacity,
        *,
        calibration,
        rank: int,
        world_size: int,
        seed: int = 0,
        comm=None,
        local_indices=None,
        **kwargs,
    ):
        cols = np.stack(
            [np.asarray(x, dtype=np.float64).reshape(-1) for x in (atoms, edges, initial_costs)],
            axis=1,
        )
        if local_indices is not None:
            if comm is None:
                raise ValueError(
                    "local_indices hold a shard but comm is None: pass the mpi4py communicator"
                )
            cols = gather_shards(cols, local_indices, comm)
        self.atoms, self.edges, initial = cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy()
        self.initial_costs = initial
        self.initial_capacity = check_capacity(capacity)
        self.calibration = calibration
        self._digest = data_digest(self.atoms, self.edges)
        self._applied = None  # the Calibration whose costs are in use (None: initial costs)
        self._said_untimed = False
        self._waiting = None  # the epoch of the last "too few steps" verdict (set_epoch's)
        self._explicit_epoch = None  # the epoch of the trainer's last set_epoch (None: none yet)
        self._pending = None  # a verdict gathered at the last step of an epoch, not yet taken
        self._timed_in = (None, 0)  # (epoch, steps recorded in it): a trainer that only iterates
        self._levels_planned = (
            None  # whether the cached plan is a calibration plan of several capacities
        )
        super().__init__(
            initial,
            capacity,
            rank=rank,
            world_size=world_size,
            seed=seed,
            comm=comm,
            atoms=self.atoms,
            **kwargs,
        )
        self.calibration.epoch_planned(self.epoch, len(self))  # epoch 0 is planned from here

    # -- what adapters call ---------------------------------------------------------------------
    @property
    def needs_step_times(self) -> bool:
        """Whether :meth:`record_step` is wanted now (while calibrating, or with recalibration)."""
        return self.calibration.collecting

    def record_step(
        self,
        atoms: int,
        edges: int,
        graphs: int,
        wall_s: float | None = None,
        cpu_s: float | None = None,
    ) -> None:
        """One training step of this rank: the batch's totals and its compute time (forward +
        backward, without waits for other ranks), in wall-clock and/or thread CPU seconds.

        Without a ``set_epoch`` from the trainer, the last step of an epoch gathers the records
        of every rank when a fit is due (collective: every rank trains and hands over the same
        steps); the verdict is taken at the next :meth:`select_epoch`."""
        self.calibration.record(self.epoch, atoms, edges, graphs, wall_s, cpu_s)
        if self._explicit_epoch is not None or not self.calibration.collecting:
            return  # the trainer's set_epoch calls gather (or nothing is wanted any more)
        epoch, steps = self._timed_in
        steps = steps + 1 if epoch == self.epoch else 1
        self._timed_in = (self.epoch, steps)
        if self.first_step + steps == len(self) and self.calibration.due(self.epoch + 1):
            verdict = self._calibrate(self.epoch + 1)
            if verdict is not None:
                self._pending = verdict

    @property
    def cost_label(self) -> str:
        """The cost of the current epoch's plan, for step logs: ``initial`` or ``auto-<k>`` (k-th
        fit)."""
        cal = self.calibration.fit_for(self.epoch)
        return "initial" if cal is None else f"auto-{self.calibration.history.index(cal) + 1}"

    @property
    def calibrations(self) -> list:
        """The fits made so far (:class:`~cfm_plugins.sampler.autocost.Calibration`), oldest
        first."""
        return list(self.calibration.history)

    def resume_state(self) -> dict | None:
        """What a resume needs to plan the same batches (JSON-able), or None before any fit."""
        return self.calibration.state(self._digest) if self.calibration.history else None

    def load_resume_state(
        self, state: dict | None, epoch: int | None = None, restart_at_zero: bool = False
    ) -> bool:
        """Take the fits of an interrupted run (see :meth:`CostCalibration.load_state`); the
        plans of ``epoch`` on use them. Returns whether any fit applies."""
        ok = self.calibration.load_state(
            state, self._digest, epoch=epoch, restart_at_zero=restart_at_zero
        )
        if ok and self.rank == 0:
            cal = self.calibration.current
            log.info(
                "cost=auto: resuming with the saved fit from epoch %d: step time = %s",
                cal.from_epoch,
                cal.fit.formula(),
            )
        self._use_costs_of(self.epoch)
        return ok

    # -- epochs ---------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The trainer's call on every rank: select ``epoch``; when a fit is due, gather every
        rank's records and take rank 0's verdict (collective); check the plan across ranks
        (collective). The same epoch again (mace: its DistributedSampler's ``set_epoch``, then
        the adapter's) keeps a "too few steps" verdict without gathering again."""
        previous = self._explicit_epoch
        self.select_epoch(epoch)
        if self.epoch != previous:
            self._waiting = None
        self._explicit_epoch = self.epoch
        if self.calibration.due(self.epoch):
            verdict = self._calibrate(self.epoch)
            if verdict is not None:
                self._take(verdict)
        self.calibration.epoch_planned(self.epoch, len(self))
        self.trainer_epochs.add(self.epoch)
        self._verify()

    def select_epoch(self, epoch: int) -> None:
        """Select ``epoch`` without any collective call (a wrapper's own advance at each pass):
        the costs of the fit in force then, after taking a verdict gathered at the last step of
        the epoch before (:meth:`record_step`)."""
        super().select_epoch(epoch)
        if self._pending is not None:
            verdict, self._pending = self._pending, None
            self._take(verdict)
        self._use_costs_of(self.epoch)
        if self._explicit_epoch is None:  # a trainer that only iterates: each pass is planned
            self.calibration.epoch_planned(self.epoch, len(self))

    def __iter__(self):
        # no collective here (a trainer may iterate a loader on some ranks only): the fits are
        # gathered in set_epoch or at the last timed step of an epoch
        self._use_costs_of(self.epoch)
        yield from super().__iter__()

    def packing_of_epoch(self, epoch: int) -> Packing:
        """As :meth:`BinPackBatchSampler.packing_of_epoch`; an epoch timed for the first fit is
        packed at the calibration's capacity levels
        (:func:`~cfm_plugins.sampler.packing.pack_levels`), so that the counts of its steps vary
        enough to be told apart from the constant step time."""
        if not self._levels_for(epoch):
            return super().packing_of_epoch(epoch)
        return pack_levels(
            self.costs,
            self.capacity,
            self.world_size,
            seed=self._pack_seed(epoch),
            levels=self.calibration.levels,
            oversize=self.oversize,
            repeat=self.repeat,
        )

    def _levels_for(self, epoch: int) -> bool:
        """Whether ``epoch`` gets the calibration plan of several capacities: before the first
        fit, while step times are wanted, unless the bins are to be padded to one budget
        (``even``: a padded step takes the same time whatever its counts) or under-filled steps
        are dropped (``drop_last``)."""
        cal = self.calibration
        return (
            len(cal.levels) > 1
            and cal.fit_for(epoch) is None
            and cal.collecting
            and not self.even
            and not self.drop_last
        )

    def plan(self) -> Packing:
        key = self._levels_for(self.epoch)
        if key != self._levels_planned:  # the calibration ended (a fit, or given up): plan anew
            self._levels_planned = key
            self._cost_version += 1
        return super().plan()

    def _use_costs_of(self, epoch: int) -> None:
        cal = self.calibration.fit_for(epoch)
        if cal is self._applied:
            return
        if cal is None:
            costs, capacity = self.initial_costs, self.initial_capacity
        else:
            costs = fitted_costs(cal.fit, self.atoms, self.edges, self.initial_costs)
            capacity = max(self.initial_capacity, float(costs.max()))
        self.costs, self.capacity, self._applied = validate_costs(costs), capacity, cal
        self._cost_version += 1
        self._plan = None

    def _calibrate(self, epoch: int):
        """Gather every rank's records, fit on rank 0, return rank 0's verdict for a fit from
        ``epoch`` on, the same on every rank (collective); None while it waits for more steps (the
        records are kept, and a second call for the same epoch gathers nothing)."""
        if epoch == self._waiting:  # asked again for the same epoch: the verdict stands
            return None
        planned = dict(self.calibration.planned)
        local = self.calibration.take_records()
        multi = self.comm is not None and self.world_size > 1
        parts = self.comm.allgather(local) if multi else [local]
        verdict = self._fit(parts, epoch) if self.rank == 0 else None
        if multi:
            verdict = self.comm.allgather(verdict)[0]
        if verdict[0] == "more":  # too few steps yet: keep the records, time the next epoch too
            self.calibration.records = local + self.calibration.records
            self.calibration.planned = planned
            self._waiting = epoch
            return None
        return verdict

    def _take(self, verdict) -> None:
        """Apply a verdict of :meth:`_calibrate` (rank 0's, the same on every rank): give up, or
        take the fit, whose costs plan the epochs from its ``from_epoch`` on."""
        kind, payload = verdict
        if kind == "none":
            self.calibration.give_up()
            return
        cal = Calibration.from_dict(payload)
        self.calibration.history.append(cal)
        self._use_costs_of(self.epoch)
        cal.lif_predicted = predicted_lif(
            cal.fit, self.plan(), self.atoms, self.edges, self.world_size
        )
        if self.rank == 0:
            f = cal.fit
            cands = ", ".join(f"{'+'.join(t)} {e * 1e3:.3g} ms" for t, e in f.cv_table[:4])
            clock = "thread CPU time" if f.clock == "cpu" else "wall-clock time"
            log.info(
                "binpack cost=auto from epoch %d: step time = %s (%s of forward+backward, %s "
                "x %s%s, R^2 %.3f; model %s chosen by cross-validated error of the "
                "per-step max over ranks: %s); LIF measured in the calibration %.3f (the fit "
                "predicts %.3f there), predicted for the new plan %.3f; capacity %g",
                cal.from_epoch,
                f.formula(),
                clock,
                count(f.steps, "step"),
                count(f.ranks, "rank"),
                f", {f.outliers} outlying step(s) left out" if f.outliers else "",
                f.r2,
                "+".join(f.terms) or "(none)",
                cands,
                cal.lif_measured,
                cal.lif_predicted_before,
                cal.lif_predicted,
                self.capacity,
            )

    def _fit(self, parts, epoch: int):
        """Rank 0's verdict on the gathered records: ("fit", calibration), ("more", None) or
        ("none", reason)."""
        first = not self.calibration.history
        if not any(parts):  # the loader was iterated without training (a trainer's set-up pass), or
            if not self._said_untimed:  # the adapter does not time steps: wait for timed steps
                self._said_untimed = True
                log.info(
                    "binpack cost=auto: no timed training step in the epochs so far (a pass over "
                    "the loader without training, or an adapter that does not time steps); the "
                    "plans keep %s until there are",
                    "the initial cost" if first else "the last fit",
                )
            return ("more", None)
        aligned = align_records(parts, self.calibration.clock)
        if aligned is None and only_warmup(parts):
            steps = max(len(p) for p in parts)
            log.info(
                "binpack cost=auto: the %s timed so far on each rank %s warm-up (the first %d "
                "steps of a process pay one-off costs and are not fitted); timing the next epoch "
                "too",
                count(steps, "step"),
                "is" if steps == 1 else "are",
                self.calibration.warmup_steps,
            )
            return ("more", None)
        if aligned is None:
            log.warning(
                "binpack cost=auto: the ranks share no timed step; keeping %s",
                "the initial cost" if first else "the last fit",
            )
            return ("none", "the ranks share no timed step")
        times, atoms, edges, graphs, clock = aligned
        if too_few_steps(*times.shape):
            needed = min_fit_steps(times.shape[1])
            if first:
                log.info(
                    "binpack cost=auto: %s %s too few to fit (%d needed, past the warm-up); "
                    "timing the next epoch too",
                    count(len(times), "timed step"),
                    "is" if len(times) == 1 else "are",
                    needed,
                )
                return ("more", None)
            log.info(
                "binpack cost=auto: %s %s too few to refit (%d needed); keeping the last fit",
                count(len(times), "timed step"),
                "is" if len(times) == 1 else "are",
                needed,
            )
            return ("none", "too few steps")
        fit = fit_step_times(times, atoms, edges, graphs, clock=clock)
        if not fit.explains:
            log.warning(
                "binpack cost=auto: the step times do not grow with atoms, edges or graphs (R^2 "
                "%.3f over %d steps); keeping %s",
                fit.r2,
                fit.steps,
                "the initial cost" if first else "the last fit",
            )
            return ("none", "nothing explains the step times")
        before = load_imbalance_factor(fit.predict(atoms, edges, graphs))
        cal = Calibration(epoch, fit, load_imbalance_factor(times), float("nan"), before)
        return ("fit", cal.to_dict())

    # -- mid-epoch resume (state_dict) carries the fits too -------------------------------------
    def state_dict(self, batches_consumed: int | None = None) -> dict:
        state = super().state_dict(batches_consumed)
        state["cost_state"] = self.resume_state()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("cost_state"):
            self.calibration.load_state(
                state["cost_state"], self._digest, epoch=int(state["epoch"])
            )
        self.epoch = int(state["epoch"])
        self._use_costs_of(self.epoch)
        super().load_state_dict(state)
