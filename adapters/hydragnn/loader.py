"""The loader seam: HydraGNN's ``create_dataloaders`` with a cfm-plugins batch sampler.

HydraGNN (``hydragnn.preprocess.load_data.create_dataloaders(trainset, valset, testset,
batch_size)``; the source adds keyword arguments, :data:`SOURCE_KEYWORDS`) builds PyG
``DataLoader``s over ``DistributedSampler``s when torch.distributed is initialised.
:func:`make_create_dataloaders` returns a function of the same form that asks the
``cfm_batch_sampler`` hook for each split's batch sampler (``train`` shuffled and re-packed every
epoch, ``valid``/``test`` in a fixed plan) and builds the same PyG loader with it; without a
sampler from the hooks it calls HydraGNN's own.

HydraGNN's training loop calls ``loader.sampler.set_epoch(epoch)`` on all three loaders at every
epoch. A loader built with ``batch_sampler=`` has a plain sequential ``sampler``, so the loader's
``sampler`` is replaced by :class:`EpochForwarder`, whose ``set_epoch`` reaches the batch sampler:
HydraGNN's own calls drive the per-epoch re-packing.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from torch.utils.data import Sampler

from cfm_plugins.sizes import shard_indices

log = logging.getLogger("cfm_plugins.hydragnn")

ROLES = ("train", "valid", "test")


class EpochForwarder(Sampler):
    """Stands in for ``loader.sampler``: iterates every index (as the sequential sampler it
    replaces) and forwards ``set_epoch`` to the loader's batch sampler.

    HydraGNN calls ``set_epoch`` on the three loaders on every rank at every epoch: there the
    batch sampler checks its plan across ranks (and makes a due ``cost=auto`` fit), collectives
    every rank reaches alike. Iterating a loader calls none: HydraGNN's ``update_config``
    (``check_if_graph_size_variable_dist``) reads the loaders until the first batch whose node
    count differs, so a rank may stop in the training loader while another goes on into the
    validation loader."""

    def __init__(self, batch_sampler, num_samples: int):
        self.batch_sampler = batch_sampler
        self.num_samples = int(num_samples)

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self):
        return iter(range(self.num_samples))

    def __len__(self) -> int:
        return self.num_samples


def balanced_loader(
    loader_cls, dataset, role: str, session, scales=None, guard=None, **loader_kwargs
):
    """A ``loader_cls`` over ``dataset`` with the hooks' batch sampler, or None if none is offered.

    A training sampler that weighs the loss per sample is handed to ``scales`` (a
    :class:`~.weighting.TrainingScales`), whose loader class tells the loss each batch's factors;
    the training loader tells ``guard`` (a :class:`~.guard.HydraLossGuard`) the step of the plan of
    each batch, so that a non-finite loss names its graphs.
    """
    hook, config, dist = session.hook, session.config, session.dist
    n = len(dataset)
    indices = shard_indices(n, dist)
    sizes = hook.cfm_graph_sizes(
        dataset=dataset, indices=indices, need_edges=any(hook.cfm_needs_edges(config=config))
    )
    if sizes is None:
        log.warning(
            "%s split: no plugin reads the sizes of a %s; HydraGNN's own sampler is kept",
            role,
            type(dataset).__name__,
        )
        return None
    if dist.world_size == 1 or dist.comm is None:
        sizes.indices = None  # the whole dataset, in order
    batch_sampler = hook.cfm_batch_sampler(
        dataset=dataset, sizes=sizes, config=config, dist=dist, role=role, trainer=session.trainer
    )
    if batch_sampler is None:
        return None
    if role == "train":
        session.train_sampler = batch_sampler  # timed steps and the resume state go there
    if (
        scales is not None
        and role == "train"
        and getattr(batch_sampler, "loss_weighting", "stock") != "stock"
    ):
        scales.sampler = batch_sampler
        loader_cls = scales.loader_class(loader_cls)
    if guard is not None and role == "train":
        from cfm_plugins_adapters.hydragnn.guard import tracked_loader_class

        loader_cls = tracked_loader_class(loader_cls, guard)
    loader = loader_cls(dataset, batch_sampler=batch_sampler, **loader_kwargs)
    # DataLoader forbids assigning `sampler` after construction; HydraGNN calls set_epoch on it
    object.__setattr__(loader, "sampler", EpochForwarder(batch_sampler, n))
    return loader


#: keyword arguments of the source's ``create_dataloaders`` (after ``batch_size``) and the values
#: binpack serves: the shuffle flags (the plan orders the batches: training re-packed every epoch,
#: evaluation fixed), no process group of HydraGNN's own, no oversampling. ``batching`` (HydraGNN's
#: own node-budget batching) is replaced by binpack, and said.
SOURCE_KEYWORDS = (
    "train_sampler_shuffle",
    "val_sampler_shuffle",
    "test_sampler_shuffle",
    "group",
    "oversampling",
    "num_samples",
    "batching",
)
_SERVED = {"group": (None,), "oversampling": (False,), "num_samples": (None,)}


def unserved_arguments(args, kwargs) -> list[str]:
    """The arguments of a ``create_dataloaders`` call that binpack's loaders cannot honour."""
    named = dict(zip(SOURCE_KEYWORDS, args))
    bad = [repr(a) for a in args[len(SOURCE_KEYWORDS) :]]
    for name, value in {**named, **kwargs}.items():
        if name not in SOURCE_KEYWORDS:
            bad.append(f"{name}={value!r}")
        elif name in _SERVED and value not in _SERVED[name]:
            bad.append(f"{name}={value!r}")
    return bad


def make_create_dataloaders(stock_create, loader_cls, session, scales=None, guard=None):
    """A drop-in for HydraGNN's ``create_dataloaders`` that uses the plugins' batch sampler."""

    def create_dataloaders(trainset, valset, testset, batch_size, *args, **kwargs):
        import torch.distributed as tdist

        session.trainer = dataclasses.replace(session.trainer, batch_size=int(batch_size))
        bad = unserved_arguments(args, kwargs)
        if (
            bad
        ):  # an argument binpack cannot honour (or a later HydraGNN's): keep HydraGNN's behaviour
            log.warning(
                "create_dataloaders called with arguments binpack's loaders do not serve (%s); "
                "HydraGNN's own loaders are used",
                ", ".join(bad),
            )
            return stock_create(trainset, valset, testset, batch_size, *args, **kwargs)
        batching = dict(zip(SOURCE_KEYWORDS, args), **kwargs).get("batching")
        if batching and batching.get("mode", "fixed") != "fixed":
            log.warning(
                "HydraGNN's Training.Batching (mode %r) is replaced by binpack's batches: set "
                "binpack's max_tokens/cost instead, or leave binpack out to use HydraGNN's",
                batching.get("mode"),
            )
        if not tdist.is_initialized():
            log.warning(
                "torch.distributed is not initialised: HydraGNN's own (shuffled) loaders are used"
            )
            return stock_create(trainset, valset, testset, batch_size)
        if os.getenv("HYDRAGNN_CUSTOM_DATALOADER", "0") == "1":
            log.info(
                "HYDRAGNN_CUSTOM_DATALOADER=1 is ignored under binpack: PyG's DataLoader is used"
            )
        extra = {}
        if os.getenv("HYDRAGNN_NUM_WORKERS") is not None:
            extra["num_workers"] = int(os.environ["HYDRAGNN_NUM_WORKERS"])
        loaders = []
        for role, dataset in zip(ROLES, (trainset, valset, testset)):
            loaders.append(
                balanced_loader(loader_cls, dataset, role, session, scales, guard, **extra)
            )
        if any(l is None for l in loaders):
            return stock_create(trainset, valset, testset, batch_size)
        return tuple(loaders)

    create_dataloaders.__wrapped__ = stock_create
    return create_dataloaders
