"""The DataLoader seam: mace_run_train's loaders, built with a cfm-plugins batch sampler.

mace_run_train calls ``torch_geometric.dataloader.DataLoader(dataset=..., batch_size=...,
sampler=..., shuffle=..., drop_last=...)`` for the per-head, training, validation and test
loaders, looking the name up at call time. :func:`make_dataloader_factory` returns a callable of
the same form that asks the ``cfm_batch_sampler`` hook for a batch sampler and builds mace's own
DataLoader with it (same collation), or falls back to the stock call when no plugin offers one.
Where a plugin gives a ``cfm_batch_budget`` (``static``), the loader's collate function pads every
batch to it (:class:`cfm_plugins.static.mace.PaddingCollater`).

Loss weighting (binpack's ``loss_weighting=per_sample``): mace's losses multiply each
configuration's squared error by its ``weight`` times a per-term weight (``energy_weight``,
``forces_weight``, ``stress_weight``, ``virials_weight``, fields of every batch), then average the
energy, stress and virials terms over the step's graphs and the forces term over its atoms (all
ranks together, ``mace.modules.loss.reduce_loss``). The training loader multiplies the graph-term
fields of each batch by the sampler's graph factor and ``forces_weight`` by its atom factor
(:func:`scale_batch`), so every graph and atom weighs the same over an epoch
(:mod:`cfm_plugins.sampler.weighting`). Validation and test loaders are never scaled.
"""

from __future__ import annotations

import logging

from torch.utils.data import ConcatDataset
from torch.utils.data.distributed import DistributedSampler

from cfm_plugins.sampler.batch_sampler import BatchSamplerWrapper
from cfm_plugins.sizes import shard_indices

log = logging.getLogger("cfm_plugins.mace")

#: mace --loss values whose terms are linear in the per-configuration weights (so scaling a weight
#: scales that configuration's share of the gradient). Not these: huber and universal put the
#: weights inside a Huber function; l1l2energyforces, dipole, dipole_polar and
#: energy_forces_dipole have terms that read no weight.
LINEAR_WEIGHT_LOSSES = ("weighted", "forces_only", "stress", "virials")
#: batch fields of the per-graph terms (scaled by the graph factor) and of the per-atom term
GRAPH_WEIGHT_FIELDS = ("energy_weight", "stress_weight", "virials_weight")
ATOM_WEIGHT_FIELDS = ("forces_weight",)


def loss_reduction() -> str:
    """How this mace averages its loss over ranks: ``"step"`` where ``reduce_loss`` divides by the
    element count of all ranks (mace-torch 0.3.10 and later), else ``"batch"`` (each rank's mean,
    then DDP's average)."""
    import mace.modules.loss as mace_loss

    return "step" if hasattr(mace_loss, "reduce_loss") else "batch"


def scale_batch(batch, scale) -> None:
    """Multiply the weight fields of a mace batch in place: graph terms by ``scale.graphs``, the
    forces term by ``scale.atoms`` (``weight`` itself, shared by all terms, is left as it is).

    A static-shape batch (:class:`cfm_plugins.static.mace.PaddedBatch`, whose fields are views of
    the padded batch, made again when it moves to a device) is scaled in its padded fields (the pad
    graphs' weights are zero) and its views made again."""
    padded = callable(getattr(type(batch), "remake_views", None))
    target = batch.padded if padded else batch
    for fields, factor in ((GRAPH_WEIGHT_FIELDS, scale.graphs), (ATOM_WEIGHT_FIELDS, scale.atoms)):
        for name in fields:
            value = getattr(target, name, None)
            if value is not None:
                target[name] = value * factor
    if padded:
        batch.remake_views()


def loss_scaled_loader_class(loader_cls):
    """A subclass of mace's DataLoader whose batches carry the sampler's loss scales."""

    class LossScaledDataLoader(loader_cls):
        """mace's DataLoader; each batch it returns is scaled by :func:`scale_batch` with the
        factors of the batch the binpack sampler yielded (in the same order)."""

        def __init__(self, *args, cfm_sampler, **kwargs):
            super().__init__(*args, **kwargs)
            self.cfm_sampler = cfm_sampler
            self.cfm_reduction = loss_reduction()

        def __iter__(self):
            for batch in super().__iter__():
                scale_batch(batch, self.cfm_sampler.next_loss_scale(self.cfm_reduction))
                yield batch

    return LossScaledDataLoader


def tracked_loader_class(loader_cls):
    """A subclass of ``loader_cls`` (a training loader over an :class:`EpochAdvancing` batch
    sampler) that records, as ``cfm_step``, the step of the plan of each batch it returns: the
    k-th batch of a pass is step ``first_step + k`` of the sampler (prefetching workers run the
    sampler ahead, the loader returns its batches in order). A non-finite loss names the structures
    of that batch with it (:mod:`.guard`)."""

    class TrackedDataLoader(loader_cls):
        cfm_step = None

        def __iter__(self):
            sampler = getattr(self.batch_sampler, "batch_sampler", self.batch_sampler)
            for k, batch in enumerate(super().__iter__()):
                self.cfm_step = getattr(sampler, "first_step", 0) + k
                yield batch

    TrackedDataLoader.__name__ = loader_cls.__name__  # the loader it is, as mace's logs name it
    return TrackedDataLoader


class EpochAdvancing(BatchSamplerWrapper):
    """Wrap a batch sampler so each new pass over it is a new epoch, or the epoch mace names.

    How mace 0.3.16 resumes (``--restart_latest``): checkpoints are written only at the end of
    an epoch (after validation), named by that epoch; a restart loads the latest one and trains
    from its epoch number, from the first batch (mace cannot resume inside an epoch). So the
    sampler state to restore is just that epoch: :func:`follow_mace_epochs` passes the epoch of
    every ``train_one_epoch`` call to :meth:`set_epoch` (the plan of epoch ``e`` is packed from
    ``seed + e``, as the stock ``DistributedSampler.set_epoch(e)`` reshuffles), and a resumed
    run trains the same batches as the interrupted one did in that epoch. Without an explicit
    ``set_epoch`` each pass counts as the next epoch (a loader used outside mace's training loop).

    A ``load_state_dict`` (a run that saved :meth:`state_dict` mid-epoch itself) restores the
    exact position: the next pass continues at the saved epoch and batch.
    """

    def __init__(self, batch_sampler):
        super().__init__(batch_sampler)
        self._next_epoch = 0
        self._resuming = False

    def set_epoch(self, epoch: int) -> None:
        epoch = int(epoch)
        if self._resuming and epoch == self.batch_sampler.epoch:
            return  # keep the restored position inside that epoch
        self._resuming = False
        self._next_epoch = epoch
        self.batch_sampler.set_epoch(
            epoch
        )  # now: a cost=auto fit is made here, before mace's checkpoint

    def __iter__(self):
        if self._resuming:  # the restored epoch and batch (load_state_dict)
            self._resuming = False
            self._next_epoch = self.batch_sampler.epoch + 1
            return iter(self.batch_sampler)
        self.batch_sampler.set_epoch(self._next_epoch)
        self._next_epoch += 1
        return iter(self.batch_sampler)

    def load_state_dict(self, state):
        self.batch_sampler.load_state_dict(state)
        self._resuming = True
        self._next_epoch = self.batch_sampler.epoch


def follow_mace_epochs(session=None, state_file=None):
    """Make the training sampler pack the epoch mace trains (also after ``--restart_latest``).

    ``mace.tools.train.train`` looks ``train_one_epoch`` up in its module at call time, with
    ``epoch=`` and ``data_loader=``; the wrapper calls ``set_epoch(epoch)`` on an
    :class:`EpochAdvancing` batch sampler first. Under ``--distributed`` mace also calls
    ``set_epoch`` on its DistributedSampler (forwarded here too); on one rank nothing else tells
    the sampler which epoch a resumed run starts at.

    ``session`` learns which sampler trains (``session.train_sampler``: timed steps go there).
    ``state_file`` (a callable giving a :class:`~cfm_plugins.steptime.SamplerStateFile` or None)
    keeps the sampler's resume state: saved after every ``set_epoch`` that changed it (a
    ``cost=auto`` fit, made at the start of an epoch, so before the checkpoint at that epoch's
    end), and given back when the first epoch mace trains is not 0 (mace resumed from a
    checkpoint; fits made after that checkpoint are dropped, that part of the run is redone).
    Returns a function that undoes the wrap.
    """
    import importlib

    mace_train = importlib.import_module(
        "mace.tools.train"
    )  # the module (mace.tools.train is also a function)
    stock = mace_train.train_one_epoch
    first = [True]

    def train_one_epoch(*args, **kwargs):
        loader, epoch = kwargs.get("data_loader"), kwargs.get("epoch")
        batch_sampler = getattr(loader, "batch_sampler", None)
        if isinstance(batch_sampler, EpochAdvancing) and epoch is not None:
            sampler = batch_sampler.batch_sampler
            if session is not None:
                session.train_sampler = sampler
            keeper = state_file() if state_file is not None else None
            if keeper is not None and first[0] and epoch > 0:
                keeper.load(sampler, epoch=epoch)
            first[0] = False
            batch_sampler.set_epoch(epoch)
            if keeper is not None:
                keeper.save(sampler)
        return stock(*args, **kwargs)

    mace_train.train_one_epoch = train_one_epoch

    def undo():
        mace_train.train_one_epoch = stock

    return undo


def guess_role(dataset, shuffle: bool, sampler, kwargs=None) -> str:
    """Which of mace_run_train's loaders is being built: ``train``, ``valid`` or ``test``.

    mace 0.3.16 builds the training loader from a ConcatDataset (and a per-head one with
    ``shuffle=True``), the validation loaders with ``shuffle=False`` and a ``generator``, the
    test loaders without a ``generator`` (and ``shuffle=True`` when not ``--distributed``).
    """
    has_generator = kwargs is not None and "generator" in kwargs
    if isinstance(dataset, ConcatDataset) or (shuffle and (kwargs is None or has_generator)):
        return "train"
    if kwargs is not None and not has_generator:
        return "test"
    return "valid"


LOADER_FILES = {
    "train": "the training set (--train_file)",
    "valid": "the validation set (--valid_file or --valid_fraction)",
    "test": "a test set (--test_file or --test_dir)",
}


def batch_sampler_for(hook, dataset, sizes, config, dist, role, trainer):
    """Ask the plugins for ``role``'s batch sampler; a ValueError names the loader and its data.

    Evaluation loaders are packed with ``evaluation=True`` (every rank gets a batch at every step,
    every structure counted once where the set has one per rank), the training loader with a few
    structures repeated where the set is too small for the ranks; what is still refused (a
    structure larger than the capacity) has the sampler's message say what helps, and this one
    say which loader and which file.
    """
    from cfm_plugins.options import UsageError

    try:
        return hook.cfm_batch_sampler(
            dataset=dataset, sizes=sizes, config=config, dist=dist, role=role, trainer=trainer
        )
    except ValueError as err:
        # the sampler's messages speak of its capacity: say which option sets it, where they do
        hint = " (the capacity is --cfm-max-tokens)" if "capacity" in str(err) else ""
        raise (UsageError if isinstance(err, UsageError) else ValueError)(
            f"mace_run_train's {role} loader, {LOADER_FILES[role]} with {len(dataset)} "
            f"structure(s) on {dist.world_size} rank(s): {err}{hint}"
        ) from err


def pad_batches(loader, hook, batch_sampler, sizes, config, dist, role, pad_distance):
    """With a ``cfm_batch_budget`` (the ``static`` feature), make ``loader`` pad every batch to
    it."""
    tracker = hook.cfm_batch_budget(
        batch_sampler=batch_sampler, sizes=sizes, config=config, dist=dist, role=role
    )
    if tracker is not None:
        from cfm_plugins.static.mace import PaddingCollater

        loader.collate_fn = PaddingCollater(loader.collate_fn, tracker, pad_distance())
    return loader


def make_dataloader_factory(stock_loader_cls, session, pad_distance=lambda: 10.0):
    """A drop-in for ``torch_geometric.dataloader.DataLoader`` that uses the plugins' sampler (and
    pads its batches to a budget where a plugin gives one; ``pad_distance()``: the pad edges'
    length,
    more than the model's cutoff)."""
    scaled_loader_cls = loss_scaled_loader_class(stock_loader_cls)
    tracked = {
        cls: tracked_loader_class(cls) for cls in (stock_loader_cls, scaled_loader_cls)
    }  # training loaders: the step of each batch (a non-finite loss names its structures)

    def DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, drop_last=False, **kwargs):
        hook, config, dist = session.hook, session.config, session.dist
        role = guess_role(dataset, shuffle, sampler, kwargs)
        n = len(dataset)
        need_edges = any(hook.cfm_needs_edges(config=config))
        sizes = hook.cfm_graph_sizes(
            dataset=dataset, indices=shard_indices(n, dist), need_edges=need_edges
        )
        if sizes is not None and (dist.world_size == 1 or dist.comm is None):
            sizes.indices = None  # the whole dataset, in order
        batch_sampler = None
        if sizes is not None:
            batch_sampler = batch_sampler_for(
                hook, dataset, sizes, config, dist, role, session.trainer
            )
        if batch_sampler is None:
            if hook.cfm_batch_budget.get_hookimpls():
                log.warning(
                    "%s loader: no batch sampler for %s, so its batches are not padded to a "
                    "budget (the compiled model sees their own shapes)",
                    role,
                    type(dataset).__name__,
                )
            return stock_loader_cls(
                dataset=dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                drop_last=drop_last,
                **kwargs,
            )
        if drop_last:
            log.info(
                "%s loader: drop_last is not needed with balanced batches; every sample is used",
                role,
            )
        wrapped = EpochAdvancing(batch_sampler)
        if isinstance(sampler, DistributedSampler):  # mace calls set_epoch on it each epoch
            stock_set_epoch = sampler.set_epoch

            def set_epoch(epoch, _stock=stock_set_epoch, _ours=wrapped):
                _stock(epoch)
                _ours.set_epoch(epoch)

            sampler.set_epoch = set_epoch
        # the trainer's generator stays: each iteration's base seed is drawn from it, as in the
        # stock loader, not from torch's global generator, whose draws would change the model's
        # initialisation (mace iterates the training loader before it builds the model)
        scaled = getattr(batch_sampler, "loss_weighting", "stock") != "stock"
        cls = scaled_loader_cls if scaled else stock_loader_cls
        if role == "train":
            cls = tracked[cls]
        extra = {"cfm_sampler": batch_sampler} if scaled else {}
        loader = cls(dataset=dataset, batch_sampler=wrapped, **extra, **kwargs)
        return pad_batches(loader, hook, batch_sampler, sizes, config, dist, role, pad_distance)

    return DataLoader
