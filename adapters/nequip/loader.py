"""The binpack DataLoader for ``nequip-train``: usable as the ``_target_`` of NequIP's dataloaders.

:func:`BinPackDataLoader` returns a ``torch.utils.data.DataLoader`` whose ``batch_sampler`` is
the ``binpack`` plugin's :class:`~cfm_plugins.sampler.BinPackBatchSampler`::

    data:
      train_dataloader:
        _target_: cfm_plugins_adapters.nequip.BinPackDataLoader
        batch_size: 4          # sets the default bin capacity (batch_size x mean atoms)
        cfm_role: train        # train (shuffled, re-packed every epoch) | val | test
      val_dataloader:
        _target_: cfm_plugins_adapters.nequip.BinPackDataLoader
        cfm_role: val          # every structure exactly once over all ranks, fixed plan

It runs under ``cfm-run --enable nequip,binpack``, which also puts it in place of every stock one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging

import numpy as np
from torch.utils.data import DataLoader, Subset

from cfm_plugins.api import BatchSamplerWrapper, shard_indices

log = logging.getLogger("cfm_plugins.nequip")

ROLES = ("train", "val", "test", "predict")

#: set while NequIP computes its dataset statistics: loaders then cover the whole dataset
_STATS_PASS = contextvars.ContextVar("cfm_nequip_stats_pass", default=False)


@contextlib.contextmanager
def statistics_pass():
    token = _STATS_PASS.set(True)
    try:
        yield
    finally:
        _STATS_PASS.reset(token)


# ------------------------------------------------------------------------------------- sizes
def _sample_size(dataset, index: int) -> tuple[int, int]:
    data = dataset[index]
    if not isinstance(data, dict) or "pos" not in data:
        raise ValueError(
            f"sample {index} of {type(dataset).__name__} is not a NequIP AtomicDataDict "
            f"(got {type(data).__name__})"
        )
    edges = data.get("edge_index")
    return int(data["pos"].shape[0]), (int(edges.shape[1]) if edges is not None else -1)


def local_sizes(dataset, indices, need_edges: bool) -> tuple[np.ndarray, np.ndarray]:
    """(atoms, edges) of samples ``indices``; edges are -1 when not needed.

    Atoms alone come from NequIP's ``num_atoms`` (no transforms, no neighbour list); edges need
    the transformed sample (its neighbour list).
    """
    indices = [int(i) for i in indices]
    if isinstance(dataset, Subset):
        parent = [int(dataset.indices[i]) for i in indices]
        return local_sizes(dataset.dataset, parent, need_edges)
    if not need_edges and hasattr(dataset, "num_atoms"):
        atoms = np.asarray(dataset.num_atoms(indices) if indices else [], dtype=np.int64)
        return atoms, np.full(len(indices), -1, dtype=np.int64)
    pairs = np.asarray([_sample_size(dataset, i) for i in indices], dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def is_nequip_dataset(dataset) -> bool:
    if isinstance(dataset, Subset):
        return is_nequip_dataset(dataset.dataset)
    try:
        from nequip.data.dataset import AtomicDataset
    except ImportError:
        return False
    return isinstance(dataset, AtomicDataset)


# ------------------------------------------------------------------------------------- loader
class _SetEpoch:
    """What Lightning finds as ``batch_sampler.sampler``: it forwards ``set_epoch``."""

    def __init__(self, target):
        self._target = target

    def set_epoch(self, epoch: int) -> None:
        self._target.set_epoch(epoch)


class LightningBatchSampler(BatchSamplerWrapper):
    """The batch sampler as Lightning sees it.

    Lightning (2.6) calls ``set_epoch`` on ``loader.sampler`` and on
    ``loader.batch_sampler.sampler``, never on the batch sampler itself; without this wrapper every
    epoch would repeat the plan of epoch 0. Lightning makes those calls on every rank (training
    and evaluation loops alike): there the sampler checks its plan across ranks and makes a due
    ``cost=auto`` fit (collectives); iterating calls none (a sanity check or a loader read on
    some ranks only cannot block).
    """

    def __init__(self, batch_sampler):
        super().__init__(batch_sampler)
        self.sampler = _SetEpoch(batch_sampler)


def BinPackDataLoader(
    dataset,
    generator=None,
    batch_size: int = 1,
    shuffle: bool | None = None,
    cfm_role: str | None = None,
    sampler=None,
    batch_sampler=None,
    drop_last: bool = False,
    **kwargs,
) -> DataLoader:
    """A ``torch.utils.data.DataLoader`` over ``dataset`` with balanced bin-packed batches.

    ``cfm_role``: ``train`` (shuffled, re-packed from seed + epoch), ``val``/``test``/``predict``
    (a fixed plan; every structure exactly once over all ranks). Default: ``train`` when
    ``shuffle`` is true, else ``val``. Other keyword arguments (``collate_fn``, ``num_workers``,
    ...) go to the DataLoader.

    It takes the arguments NequIP's ``NequIPDataModule`` gives a dataloader's ``_target_``
    (``hydra.utils.instantiate(cfg, dataset=..., generator=...)``; the default ``_target_`` is
    ``torch.utils.data.DataLoader``). Its ``batch_sampler`` is the ``binpack`` plugin's
    :class:`~cfm_plugins.sampler.BinPackBatchSampler`, built from the dataset's atom (and edge)
    counts, each rank reading only its shard's sizes; ``batch_size`` sets the default bin capacity
    (``batch_size`` x mean atoms). It runs under ``cfm-run --enable nequip,binpack``, which also
    sets ``use_distributed_sampler: false`` on Lightning's Trainer and keeps NequIP's dataset
    statistics on the whole training set. Lightning's ``set_epoch`` at the start of every
    training epoch reaches the sampler through :class:`LightningBatchSampler`.
    """
    role = cfm_role or ("train" if shuffle else "val")
    if role not in ROLES:
        raise ValueError(
            f"BinPackDataLoader: cfm_role={role!r}; expected one of {', '.join(ROLES)}"
        )
    if sampler is not None or batch_sampler is not None:
        raise ValueError(
            "BinPackDataLoader makes its own batch sampler: remove `sampler`/`batch_sampler` from "
            "the dataloader config"
        )
    if _STATS_PASS.get():  # NequIP's dataset statistics: every rank reads the whole set, as stock
        return DataLoader(
            dataset, batch_size=batch_size, shuffle=False, generator=generator, **kwargs
        )
    from cfm_plugins_adapters.nequip import running_session

    session = running_session(
        "BinPackDataLoader (for a plain nequip-train use torch.utils.data.DataLoader)"
    )
    hook, config, dist = session.hook, session.config, session.dist
    if role == "train":
        session.trainer = dataclasses.replace(session.trainer, batch_size=int(batch_size))

    n = len(dataset)
    indices = shard_indices(n, dist)
    sizes = hook.cfm_graph_sizes(
        dataset=dataset, indices=indices, need_edges=any(hook.cfm_needs_edges(config=config))
    )
    if sizes is None:
        raise ValueError(
            f"BinPackDataLoader: no plugin reads the sizes of a {type(dataset).__name__}"
        )
    if dist.world_size == 1 or dist.comm is None:
        sizes.indices = None  # the whole dataset, in order
    batch_sampler = hook.cfm_batch_sampler(
        dataset=dataset,
        sizes=sizes,
        config=config,
        dist=dist,
        role="train" if role == "train" else ("test" if role == "test" else "valid"),
        trainer=session.trainer,
    )
    if batch_sampler is None:
        raise RuntimeError(
            "BinPackDataLoader: no batch sampler was offered; enable the binpack plugin "
            "(`cfm-run --enable nequip,binpack`)"
        )
    if role == "train":  # timed steps go there; a restored checkpoint's sampler state comes here
        session.train_sampler = batch_sampler
        pending = getattr(session, "pending_resume", None)
        if pending is not None and hasattr(batch_sampler, "load_resume_state"):
            batch_sampler.load_resume_state(pending)
            session.pending_resume = None
    if drop_last:
        log.info(
            "%s loader: drop_last is not needed with balanced batches; every structure is used",
            role,
        )
    return DataLoader(
        dataset, batch_sampler=LightningBatchSampler(batch_sampler), generator=generator, **kwargs
    )
