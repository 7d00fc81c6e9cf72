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

from cfm_plugins.api import shard_indices

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
    wants = hook.cfm_needs_edges(config=config)  # True: needed; "wanted": used where present
    need_edges = True if True in wants else ("wanted" if any(wants) else False)
    sizes = hook.cfm_graph_sizes(dataset=dataset, indices=indices, need_edges=need_edges)
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


#: where HydraGNN's cost-aware batching is set: its ``create_dataloaders(..., batching=...)``
#: reads this section of the JSON config (``hydragnn.preprocess.load_data``)
BATCHING_KEY = "NeuralNetwork.Training.Batching"
#: HydraGNN's ``oversized_sample`` policies as binpack's ``oversize``
OVERSIZE = {"error": "error", "single": "solo", "skip": "skip"}


def counts_atoms(config) -> bool:
    """Whether binpack's capacity is in atoms (``cost=atoms``, or a linear/auto cost of
    ``1*atoms``), the unit of HydraGNN's node budget."""
    cost = config.get("cost")
    linear_atoms = config.get("cost_a") == 1 and config.get("cost_b") == 0
    return cost == "atoms" or (cost in ("linear", "auto") and linear_atoms)


def take_over_batching(batching: dict, config, rank: int) -> None:
    """binpack in place of HydraGNN's cost-aware batching (``batching``: the
    :data:`BATCHING_KEY` section, mode ``node_budget``).

    Without binpack's ``max_tokens`` the capacity is the section's ``max_nodes`` (refused, with
    a :class:`~cfm_plugins.options.UsageError`, where binpack's cost is not counted in atoms);
    without binpack's ``oversize``, ``oversized_sample`` sets it. Rank 0 says so once."""
    from cfm_plugins.api import UsageError

    budget = batching.get("max_nodes")
    said = f"HydraGNN's {BATCHING_KEY} (mode {batching.get('mode')}"
    said += f", max_nodes {budget})" if budget is not None else ")"
    said += " is replaced by binpack's batches: "
    source = f"{BATCHING_KEY}.max_nodes"  # a capacity this function set (loaders made twice)
    if "max_tokens" in config.options and config.option_sources.get("max_tokens") != source:
        said += f"capacity max_tokens={config.get('max_tokens'):g} (binpack's; max_nodes unused)"
    elif budget is None:
        said += "binpack's default capacity"
    elif not counts_atoms(config):
        raise UsageError(
            f"binpack cost={config.get('cost')} counts its capacity in other units than "
            f"{BATCHING_KEY}.max_nodes ({budget} nodes): set binpack's max_tokens (cfm-run -o "
            "max_tokens=N), or use cost=atoms to pack to that node budget, or remove the Batching "
            "section"
        )
    else:
        config.options["max_tokens"] = float(budget)
        config.option_sources["max_tokens"] = source
        said += f"capacity {budget} atoms, its max_nodes (binpack's max_tokens is not set)"
    policy = OVERSIZE.get(batching.get("oversized_sample"))
    if policy is not None and "oversize" not in config.options:
        config.options["oversize"] = policy
        config.option_sources["oversize"] = f"{BATCHING_KEY}.oversized_sample"
    if batching.get("max_graphs") is not None:
        said += f"; max_graphs {batching['max_graphs']} is not applied (bins hold any graph count)"
    if rank == 0 and config.first_time(said):
        log.info("%s", said)


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
        if not tdist.is_initialized():
            log.warning(
                "torch.distributed is not initialised: HydraGNN's own (shuffled) loaders are used"
            )
            return stock_create(trainset, valset, testset, batch_size, *args, **kwargs)
        batching = dict(zip(SOURCE_KEYWORDS, args), **kwargs).get("batching")
        if batching and batching.get("mode", "fixed") != "fixed":
            take_over_batching(batching, session.config, session.dist.rank)
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
            return stock_create(trainset, valset, testset, batch_size, *args, **kwargs)
        return tuple(loaders)

    create_dataloaders.__wrapped__ = stock_create
    return create_dataloaders
