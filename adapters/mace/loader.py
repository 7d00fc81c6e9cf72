"""The DataLoader seam: mace_run_train's loaders, built with a cfm-plugins batch sampler.

mace_run_train calls ``torch_geometric.dataloader.DataLoader(dataset=..., batch_size=...,
sampler=..., shuffle=..., drop_last=...)`` for the per-head, training, validation and test
loaders, looking the name up at call time. :func:`make_dataloader_factory` returns a callable of
the same form that asks the ``cfm_batch_sampler`` hook for a batch sampler and builds mace's own
DataLoader with it (same collation), or falls back to the stock call when no plugin offers one.
"""
from __future__ import annotations

import logging

import numpy as np
from torch.utils.data import ConcatDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("cfm_plugins.mace")


class EpochAdvancing:
    """Wrap a batch sampler so each new pass over it is a new epoch.

    mace calls ``set_epoch`` only under ``--distributed`` (on its DistributedSampler). This
    wrapper re-packs at every ``__iter__`` from ``seed + epoch`` anyway, and honours an explicit
    ``set_epoch`` for the next pass (the DistributedSampler's calls are forwarded here).
    """

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = int(epoch)

    def __iter__(self):
        self.batch_sampler.set_epoch(self._next_epoch)
        self._next_epoch += 1
        return iter(self.batch_sampler)

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def state_dict(self):
        return self.batch_sampler.state_dict()

    def load_state_dict(self, state):
        self.batch_sampler.load_state_dict(state)


def guess_role(dataset, shuffle: bool, sampler) -> str:
    """mace builds its training loader from a ConcatDataset (or with shuffle=True)."""
    if shuffle or isinstance(dataset, ConcatDataset):
        return "train"
    return "valid"


def shard_indices(n: int, dist) -> np.ndarray | None:
    """This rank's share of the size reading (every world_size-th sample), None if alone."""
    if dist.world_size == 1 or dist.comm is None:
        return None
    return np.arange(dist.rank, n, dist.world_size, dtype=np.int64)


def make_dataloader_factory(stock_loader_cls, session):
    """A drop-in for ``torch_geometric.dataloader.DataLoader`` that uses the plugins' sampler."""
    def DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, drop_last=False, **kwargs):
        hook, config, dist = session.hook, session.config, session.dist
        role = guess_role(dataset, shuffle, sampler)
        n = len(dataset)
        indices = shard_indices(n, dist)
        need_edges = any(hook.cfm_needs_edges(config=config))
        sizes = hook.cfm_graph_sizes(
            dataset=dataset, indices=np.arange(n) if indices is None else indices, need_edges=need_edges
        )
        if sizes is not None and indices is None:
            sizes.indices = None  # the whole dataset, in order
        batch_sampler = None
        if sizes is not None:
            batch_sampler = hook.cfm_batch_sampler(dataset=dataset, sizes=sizes, config=config, dist=dist, role=role,
                                                   trainer=session.trainer)
        if batch_sampler is None:
            return stock_loader_cls(dataset=dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                                    drop_last=drop_last, **kwargs)
        if drop_last:
            log.info("%s loader: drop_last is not needed with balanced batches; every sample is used", role)
        wrapped = EpochAdvancing(batch_sampler)
        if isinstance(sampler, DistributedSampler):  # mace calls set_epoch on it each epoch
            stock_set_epoch = sampler.set_epoch

            def set_epoch(epoch, _stock=stock_set_epoch, _ours=wrapped):
                _stock(epoch)
                _ours.set_epoch(epoch)

            sampler.set_epoch = set_epoch
        kwargs.pop("generator", None)
        return stock_loader_cls(dataset=dataset, batch_sampler=wrapped, **kwargs)

    return DataLoader
