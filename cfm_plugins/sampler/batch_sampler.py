"""``BinPackBatchSampler``: the packer as a torch batch sampler, one per rank, agreed through MPI.

Every rank computes the same plan (:func:`~cfm_plugins.sampler.packing.pack` is deterministic
for a seed) from the global cost array and takes bin ``step*world_size + rank`` at each step, so
every rank has the same number of steps and nearly the same work at each step. With an mpi4py
communicator the ranks may hold only their shard of the costs (``local_indices``): the shards
are gathered once, and at the start of every epoch the ranks compare a checksum of their plan.

With ``loss_weighting="per_sample"`` the sampler also gives, for every batch it yielded, the loss
scales that make each graph and atom weigh the same over the epoch (:mod:`.weighting`); a trainer
adapter applies them to the batch the DataLoader returns (:meth:`BinPackBatchSampler.next_loss_scale`).
"""
from __future__ import annotations

import collections
import hashlib
import logging

import numpy as np
from torch.utils.data import Sampler

from .packing import Packing, check_capacity, check_world_size, pack, packing_from_bins, validate_costs
from .weighting import LossScale, check_loss_weighting, check_reduction, per_sample_scales

log = logging.getLogger("cfm_plugins.sampler")


def _rank_list(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def gather_shards(costs: np.ndarray, local_indices, comm) -> np.ndarray:
    """Global cost array from every rank's ``(local_indices, costs)`` shard (a collective call).

    Raises ``ValueError`` (on every rank) if the shards overlap or leave gaps.
    """
    idx = np.asarray(local_indices, dtype=np.int64)
    if idx.ndim != 1 or idx.shape != costs.shape:
        raise ValueError(f"local_indices has shape {idx.shape} but costs has shape {costs.shape}: "
                         "give one global dataset index per local cost")
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
        raise ValueError(f"shards overlap: {len(dup)} sample(s) appear on more than one rank, e.g. sample "
                         f"{int(dup[0])} on ranks {_rank_list(owners)}; give each global index to exactly one rank")
    if np.any(seen == 0):
        gap = np.flatnonzero(seen == 0)
        raise ValueError(f"shards leave gaps: {len(gap)} sample(s) of 0..{n - 1} are on no rank, e.g. "
                         f"{gap[:5].tolist()}; every global index must belong to one rank")
    out = np.empty(n, dtype=np.float64)
    out[all_idx] = all_cost
    return out


class BinPackBatchSampler(Sampler):
    """Yields this rank's batches (lists of dataset indices) of a balanced bin-packing plan.

    Args:
        costs: per-sample costs; global (``costs[i]`` is sample ``i``) unless ``local_indices``.
        capacity: bin budget in cost units (e.g. 3072 atoms).
        rank, world_size: this rank and the number of ranks (one bin per rank per step).
        seed: the plan of epoch ``e`` is packed from ``seed + e`` (``set_epoch``).
        comm: an mpi4py communicator (duck-typed: ``allgather``), needed when ``local_indices``
            hold a shard; also used to check at each epoch that all ranks have the same plan.
        local_indices: global dataset index of each entry of ``costs`` (this rank's shard).
        drop_last: drop the steps whose bins average less than half the capacity (the few
            bins of leftovers); their samples are not seen in that epoch (logged).
            ``False`` (default): every sample is used exactly once per epoch.
        oversize: ``"error"`` | ``"skip"`` | ``"solo"`` for samples costlier than ``capacity``.
        shuffle: ``True``: new plan each epoch (random ties, step order, rank mapping, order
            inside batches). ``False``: the deterministic plan, the same every epoch.
        evaluation: for evaluation loaders (see :func:`pack`): a set too small for the
            capacity and the number of ranks gets a plan anyway instead of an error.
        atoms: per-sample atom counts, indexed like ``costs`` (a shard with ``local_indices``);
            needed by ``loss_weighting="per_sample"`` (its atom terms), gathered like the costs.
        loss_weighting: ``"stock"`` (the trainer's own loss, unchanged) or ``"per_sample"``:
            :meth:`next_loss_scale` gives the factors of each yielded batch (see
            :mod:`cfm_plugins.sampler.weighting`).

    ``len()`` is the number of steps of the current epoch, the same on every rank.
    ``state_dict()`` records epoch, seed and the batches yielded so far; after
    ``load_state_dict`` the next iteration continues with the next batch.
    """

    def __init__(self, costs, capacity, *, rank: int, world_size: int, seed: int = 0, comm=None,
                 local_indices=None, drop_last: bool = False, oversize: str = "error", shuffle: bool = True,
                 evaluation: bool = False, atoms=None, loss_weighting: str = "stock"):
        # world_size and capacity first (rank is checked against world_size; comm against both);
        # oversize and the costs are checked by ``pack``, which runs at the end of the constructor
        world_size = check_world_size(world_size)
        if int(rank) != rank or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is not in 0..{world_size - 1} (world_size {world_size})")
        if int(seed) != seed or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.rank, self.world_size, self.seed = int(rank), world_size, int(seed)
        self.capacity = check_capacity(capacity)
        self.comm, self.drop_last, self.oversize, self.shuffle = comm, bool(drop_last), oversize, bool(shuffle)
        self.evaluation = bool(evaluation)
        self.loss_weighting = check_loss_weighting(loss_weighting)
        if self.loss_weighting != "stock" and atoms is None:
            raise ValueError(f"loss_weighting={loss_weighting!r} needs the atom count of every sample (atoms=...)")
        if comm is not None:
            self._check_comm(comm)
        self.costs = validate_costs(self._global(costs, local_indices))
        self.atoms = None if atoms is None else self._global(atoms, local_indices, check=False)
        if self.atoms is not None and self.atoms.shape != self.costs.shape:
            raise ValueError(f"atoms has {self.atoms.size} entries, costs {self.costs.size}: give one atom count "
                             "per sample")
        self._yielded_bins: collections.deque = collections.deque()  # bins yielded, scales not yet taken
        self._scales: dict = {}  # (plan key, reduction) -> per-bin scales
        self.epoch = 0
        self._resume = 0  # batches to skip at the next __iter__ (set by load_state_dict)
        self._yielded = 0  # batches yielded in the current epoch
        self._plan: Packing | None = None
        self._plan_key = None
        self._dropped: tuple[int, int] = (0, 0)
        self._verified_key = None
        self.plan()  # errors (oversize, too many ranks) surface at construction

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
            raise ValueError("local_indices hold a shard but comm is None: pass the mpi4py communicator "
                             "(comm=MPI.COMM_WORLD) so the shards can be gathered, or give global costs")
        glob = np.empty(len(idx))
        glob[idx] = local
        return glob

    # -- MPI checks ----------------------------------------------------------------------------
    def _check_comm(self, comm):
        size = comm.Get_size() if hasattr(comm, "Get_size") else None
        if size is not None and size != self.world_size:
            raise ValueError(f"world_size={self.world_size} but the communicator has {size} ranks")
        if hasattr(comm, "Get_rank") and comm.Get_rank() != self.rank:
            raise ValueError(f"rank={self.rank} but this process is rank {comm.Get_rank()} of the communicator")

    def _check_same_costs(self, glob: np.ndarray):
        digest = (len(glob), hashlib.blake2b(np.ascontiguousarray(glob).tobytes(), digest_size=16).hexdigest())
        everyone = self.comm.allgather(digest)
        odd = [r for r, d in enumerate(everyone) if d != everyone[0]]
        if odd:
            raise ValueError(f"ranks {_rank_list(odd)} have different global costs than rank 0 "
                             f"({[d[0] for d in everyone]} samples): without local_indices every rank must "
                             "give the same global cost array")

    def _verify(self, plan: Packing):
        """Compare the plan's checksum across ranks (collective, once per epoch)."""
        if self.comm is None or self._verified_key == self._plan_key:
            return
        sums = self.comm.allgather(plan.checksum())
        if any(h != sums[0] for h in sums):
            groups = {}
            for r, h in enumerate(sums):
                groups.setdefault(h, []).append(r)
            desc = "; ".join(f"ranks [{_rank_list(rs)}] have plan {h[:12]}" for h, rs in groups.items())
            odd = [r for r, h in enumerate(sums) if h != sums[0]]
            raise RuntimeError(f"the ranks disagree on the batch plan of epoch {self.epoch}: ranks "
                               f"{_rank_list(odd)} differ from rank 0 ({desc}); give every rank the same "
                               "seed, capacity, costs and options")
        self._verified_key = self._plan_key

    # -- the plan ------------------------------------------------------------------------------
    def _pack_seed(self):
        return self.seed + self.epoch if self.shuffle else None

    def plan(self) -> Packing:
        """The (global) packing of the current epoch, after ``drop_last``."""
        key = (self._pack_seed(), self.epoch if self.shuffle else None)
        if self._plan is None or self._plan_key != key:
            p = pack(self.costs, self.capacity, self.world_size, seed=self._pack_seed(), oversize=self.oversize,
                     evaluation=self.evaluation)
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
            raise ValueError("drop_last=True would drop every step (all bins under half the capacity); "
                             "use drop_last=False or a smaller capacity")
        kept = packing_from_bins([p[b] for b in np.flatnonzero(np.repeat(keep, w))], w, solo=p.solo,
                                 skipped=p.skipped)
        n_drop = len(p.indices) - len(kept.indices)
        self._dropped = (int((~keep).sum()), int(n_drop))
        log.info("drop_last: dropped %d step(s) whose bins average under half the capacity (%d samples "
                 "not seen in epoch %d)", self._dropped[0], n_drop, self.epoch)
        return kept

    @property
    def dropped(self) -> tuple[int, int]:
        """(steps, samples) dropped by ``drop_last`` in the current epoch's plan."""
        self.plan()
        return self._dropped

    # -- torch Sampler protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return self.plan().num_steps(self.world_size)

    def __iter__(self):
        plan = self.plan()
        self._verify(plan)
        start, self._resume = self._resume, 0
        epoch = self.epoch
        self._yielded = start
        self._yielded_bins.clear()  # a new pass: scales left from an abandoned one are stale
        weighted = self.loss_weighting != "stock"
        for s in range(start, plan.num_steps(self.world_size)):
            b = s * self.world_size + self.rank
            batch = plan[b]
            if self.shuffle:
                batch = np.random.default_rng((self.seed, epoch, s, self.rank)).permutation(batch)
            self._yielded = s + 1
            if weighted:
                self._yielded_bins.append((self._plan_key, b))
            yield batch.tolist()

    # -- loss weighting ------------------------------------------------------------------------
    def loss_scales(self, reduction: str = "step") -> np.ndarray:
        """``(num_bins, 2)`` factors ``[graphs, atoms]`` of every bin of the current plan (all 1 under
        ``loss_weighting="stock"``); ``reduction`` is how the trainer averages its loss over ranks
        (:mod:`cfm_plugins.sampler.weighting`)."""
        check_reduction(reduction)
        plan = self.plan()
        if self.loss_weighting == "stock":
            return np.ones((len(plan), 2))
        key = (self._plan_key, reduction)
        if key not in self._scales:
            self._scales = {key: per_sample_scales(plan, self.atoms, reduction)}  # the current plan's only
        return self._scales[key]

    def next_loss_scale(self, reduction: str = "step") -> LossScale:
        """The factors of the oldest batch yielded and not yet scaled, in the order batches were yielded.

        A DataLoader returns batches in the order its batch sampler yielded them (prefetching
        workers included), so an adapter calls this once for every batch the loader returns.
        Under ``loss_weighting="stock"`` the factors are 1.
        """
        if self.loss_weighting == "stock":
            return LossScale(1.0, 1.0)
        if not self._yielded_bins:
            raise RuntimeError("next_loss_scale: no batch was yielded since the last call (call it once per batch "
                               "the DataLoader returns)")
        key, b = self._yielded_bins.popleft()
        if key != self._plan_key:
            raise RuntimeError("next_loss_scale: the batch belongs to a plan that is no longer the current one "
                               "(set_epoch was called during an epoch)")
        g, a = self.loss_scales(reduction)[b]
        return LossScale(float(g), float(a))

    def set_epoch(self, epoch: int) -> None:
        """Select epoch ``epoch`` (plan packed from ``seed + epoch``) and start it from its first batch."""
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
        return {"epoch": self.epoch, "seed": self.seed, "batches_consumed": done,
                "world_size": self.world_size, "num_batches": len(self), "checksum": self.plan().checksum()}

    def load_state_dict(self, state: dict) -> None:
        """Resume: the next iteration continues with batch ``state['batches_consumed']`` of its epoch."""
        ws = state.get("world_size", self.world_size)
        if ws != self.world_size:
            raise ValueError(f"state was saved with world_size {ws}, this sampler has {self.world_size}: the plan "
                             "differs; resume from the start of an epoch instead (set_epoch)")
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        done = int(state["batches_consumed"])
        n = len(self)
        if not 0 <= done <= n:
            raise ValueError(f"batches_consumed={done} is not in 0..{n} for epoch {self.epoch}")
        if "checksum" in state and state["checksum"] != self.plan().checksum():
            log.warning("resumed plan differs from the saved one (costs or options changed): the rest of "
                        "epoch %d may repeat or miss samples", self.epoch)
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
