"""The DataLoader seam: mace_run_train's loaders, built with a cfm-plugins batch sampler.

mace_run_train calls ``torch_geometric.dataloader.DataLoader(dataset=..., batch_size=...,
sampler=..., shuffle=..., drop_last=...)`` for the per-head, training, validation and test
loaders, looking the name up at call time. :func:`make_dataloader_factory` returns a callable of
the same form that asks the ``cfm_batch_sampler`` hook for a batch sampler and builds mace's own
DataLoader with it (same collation), or falls back to the stock call when no plugin offers one.
Where a plugin gives a ``cfm_batch_budget`` (``static``), the loader's collate function pads every
batch to it (:class:`cfm_plugins.static_shapes.mace.PaddingCollater`).

- :func:`loader_role`: which of mace's loaders a dataset feeds (training, validation, test);
- :func:`scale_batch`: binpack's ``loss_weighting=per_sample`` applied to each training batch;
- :func:`structure_mean_metric_class`: with binpack, the validation ``loss`` is mace's loss over
  the whole set as one batch, whatever the batches and ranks.
"""

from __future__ import annotations

import logging
import sys

from torch.utils.data import ConcatDataset
from torch.utils.data.distributed import DistributedSampler

from cfm_plugins.api import BatchSamplerWrapper, shard_indices

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

    A static-shape batch (:class:`cfm_plugins.static_shapes.mace.PaddedBatch`, whose fields are
    views of the padded batch, made again when it moves to a device) is scaled in its padded fields
    (the pad graphs' weights are zero) and its views made again.

    mace's losses multiply each configuration's squared error by its ``weight`` times a per-term
    weight (``energy_weight``, ``forces_weight``, ``stress_weight``, ``virials_weight``, fields of
    every batch), then average the energy, stress and virials terms over the step's graphs and the
    forces term over its atoms (all ranks together, ``mace.modules.loss.reduce_loss``). The
    training loader (binpack's ``loss_weighting=per_sample``) calls this on each batch with the
    sampler's factors, so every graph and atom weighs the same over an epoch
    (:mod:`cfm_plugins.sampler.weighting`). Validation and test loaders are never scaled.
    """
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

    Collectives: :meth:`set_epoch` (mace's calls, on every rank) reaches the sampler's
    ``set_epoch``, which checks the plan across ranks and makes a due ``cost=auto`` fit; a pass
    advances the epoch with the sampler's ``select_epoch``, which calls no collective, so a rank
    may iterate the loader more often than another (mace reads the training set for its
    statistics, a rank-0 preview) and the next ``set_epoch`` puts every rank on the epoch mace
    trains.

    A ``load_state_dict`` (a run that saved :meth:`state_dict` mid-epoch itself) restores the
    exact position: the next pass continues at the saved epoch and batch.
    """

    def __init__(self, batch_sampler):
        super().__init__(batch_sampler)
        self._next_epoch = 0
        self._resuming = False

    def set_epoch(self, epoch: int) -> None:
        epoch = int(epoch)
        if not (self._resuming and epoch == self.batch_sampler.epoch):
            self._resuming = False
            self._next_epoch = epoch
        # on every call, on every rank alike (a collective: the plan check, a cost=auto fit made
        # before mace's checkpoint); the same epoch keeps a restored position inside it
        self.batch_sampler.set_epoch(epoch)

    def __iter__(self):
        if self._resuming:  # the restored epoch and batch (load_state_dict)
            self._resuming = False
            self._next_epoch = self.batch_sampler.epoch + 1
            return iter(self.batch_sampler)
        # the next epoch without a collective: a rank may iterate more often than another
        select = getattr(self.batch_sampler, "select_epoch", self.batch_sampler.set_epoch)
        select(self._next_epoch)
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
    the sampler which epoch a resumed run starts at. mace calls ``train_one_epoch`` on every rank
    at every epoch: this ``set_epoch`` is where the sampler checks its plan across ranks and makes
    a due ``cost=auto`` fit (collectives), never a pass over a loader.

    ``session`` learns which sampler trains (``session.train_sampler``: timed steps go there).
    ``state_file`` (a callable giving a :class:`~cfm_plugins.step_timer.SamplerStateFile` or None)
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


#: the local variables of mace 0.3.16's ``run()`` (mace/cli/run_train.py) holding the datasets
#: its loaders are built from: ``train_set`` (the ConcatDataset of every head's training set, the
#: loader that trains), ``train_sets`` (each head's training set, a loader of its own),
#: ``valid_sets`` (each head's validation set) and ``test_sets`` (the test sets, by name)
MACE_DATASET_VARIABLES = (
    ("train_set", "train"),
    ("train_sets", "train"),
    ("valid_sets", "valid"),
    ("test_sets", "test"),
)
#: how many frames above the loader call :func:`loader_role` looks for mace's ``run()``
ROLE_FRAME_DEPTH = 8


def mace_role(dataset, frame) -> str | None:
    """The role of the loader over ``dataset`` built from ``frame`` (or a frame up to
    :data:`ROLE_FRAME_DEPTH` above it) of ``mace.cli.run_train``: the role of the variable of
    :data:`MACE_DATASET_VARIABLES` that holds ``dataset`` itself (a dict's values are looked
    through), or None where no mace_run_train frame holds it."""
    for _ in range(ROLE_FRAME_DEPTH):
        if frame is None:
            return None
        if frame.f_globals.get("__name__") == "mace.cli.run_train":
            local = frame.f_locals
            for name, role in MACE_DATASET_VARIABLES:
                value = local.get(name)
                held = value.values() if isinstance(value, dict) else (value,)
                if any(item is dataset for item in held):
                    return role
        frame = frame.f_back
    return None


def guess_role(dataset, shuffle: bool, sampler, kwargs=None) -> str:
    """A guess at which of mace_run_train's loaders is being built, from its arguments only (where
    :func:`mace_role` finds no mace frame holding the dataset).

    mace 0.3.16 builds the training loader from a ConcatDataset (and a per-head one with
    ``shuffle=True``), the validation loaders with ``shuffle=False`` and a ``generator``, the
    test loaders without a ``generator`` (and ``shuffle=True`` when not ``--distributed``). A
    validation set of several HDF5 shards is a ConcatDataset too: this guess takes it for a
    training set.
    """
    has_generator = kwargs is not None and "generator" in kwargs
    if isinstance(dataset, ConcatDataset) or (shuffle and (kwargs is None or has_generator)):
        return "train"
    if kwargs is not None and not has_generator:
        return "test"
    return "valid"


def loader_role(dataset, shuffle, sampler, kwargs, frame, config=None) -> str:
    """``train``, ``valid`` or ``test``: the role mace_run_train gives ``dataset``
    (:func:`mace_role`, from ``frame``, the caller of the DataLoader); where no mace frame holds it
    (a loader built elsewhere), :func:`guess_role`, with a warning (once per role).

    The dataset handed to the loader is looked up, by identity, among the datasets of the
    ``run()`` frame of ``mace.cli.run_train`` that builds it (``train_set``, ``train_sets``,
    ``valid_sets``, ``test_sets``), whatever their type (an xyz list, an HDF5 file or folder,
    LMDB, a ConcatDataset of shards or heads).
    """
    role = mace_role(dataset, frame)
    if role is not None:
        return role
    role = guess_role(dataset, shuffle, sampler, kwargs)
    said = (
        f"binpack: a loader over a {type(dataset).__name__} of {len(dataset)} structure(s) is "
        "built outside mace_run_train's run() (or from a dataset none of its train_set, "
        f"train_sets, valid_sets, test_sets holds): taken for a {role} loader from its arguments "
        f"(shuffle={shuffle}, {'a' if kwargs and 'generator' in kwargs else 'no'} generator)"
    )
    if config is None or config.first_time(said):
        log.warning("%s", said)
    return role


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
    from cfm_plugins.api import UsageError

    try:
        return hook.cfm_batch_sampler(
            dataset=dataset, sizes=sizes, config=config, dist=dist, role=role, trainer=trainer
        )
    except ValueError as err:
        # the sampler's messages speak of its capacity: say which option sets it, where they do
        hint = capacity_hint(config) if "capacity" in str(err) else ""
        raise (UsageError if isinstance(err, UsageError) else ValueError)(
            f"mace_run_train's {role} loader, {LOADER_FILES[role]} with {len(dataset)} "
            f"structure(s) on {dist.world_size} rank(s): {err}{hint}"
        ) from err


def capacity_hint(config) -> str:
    """Where the capacity of a binpack message comes from: binpack's ``max_tokens``, and where it
    was set (``cfm-run -o``, ``--cfm-max-tokens`` in the trainer command, the environment, a
    config file), or its default."""
    if config is not None and "max_tokens" in config.options:
        where = config.option_sources.get("max_tokens")
        return f" (the capacity is binpack's max_tokens={config.options['max_tokens']}" + (
            f", from {where})" if where else ")"
        )
    return (
        " (the capacity is binpack's max_tokens: cfm-run -o max_tokens=N, or --cfm-max-tokens=N "
        "in the trainer command)"
    )


def pad_batches(loader, hook, batch_sampler, sizes, config, dist, role, pad_distance):
    """With a ``cfm_batch_budget`` (the ``static`` feature), make ``loader`` pad every batch to
    it."""
    tracker = hook.cfm_batch_budget(
        batch_sampler=batch_sampler, sizes=sizes, config=config, dist=dist, role=role
    )
    if tracker is not None:
        from cfm_plugins.api import PaddingCollater

        loader.collate_fn = PaddingCollater(loader.collate_fn, tracker, pad_distance())
    return loader


def make_dataloader_factory(stock_loader_cls, session, pad_distance=lambda: 10.0):
    """A drop-in for ``torch_geometric.dataloader.DataLoader`` that uses the plugins' sampler (and
    pads its batches to a budget where a plugin gives one; ``pad_distance()``: the pad edges'
    length, more than the model's cutoff)."""
    scaled_loader_cls = loss_scaled_loader_class(stock_loader_cls)
    tracked = {
        cls: tracked_loader_class(cls) for cls in (stock_loader_cls, scaled_loader_cls)
    }  # training loaders: the step of each batch (a non-finite loss names its structures)

    def DataLoader(dataset, batch_size=1, shuffle=False, sampler=None, drop_last=False, **kwargs):
        hook, config, dist = session.hook, session.config, session.dist
        role = loader_role(dataset, shuffle, sampler, kwargs, sys._getframe(1), config)
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
            log.info("%s loader: %s", role, drop_last_note(batch_sampler, config))
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
        weighting = getattr(batch_sampler, "loss_weighting", "stock")
        if role == "train":
            DataLoader.training_weightings.append(weighting)
        scaled = weighting != "stock"
        cls = scaled_loader_cls if scaled else stock_loader_cls
        if role == "train":
            cls = tracked[cls]
        extra = {"cfm_sampler": batch_sampler} if scaled else {}
        loader = cls(dataset=dataset, batch_sampler=wrapped, **extra, **kwargs)
        return pad_batches(loader, hook, batch_sampler, sizes, config, dist, role, pad_distance)

    DataLoader.training_weightings = []  # the loss weighting of every training loader built
    return DataLoader


def drop_last_note(batch_sampler, config) -> str:
    """Why a loader of balanced batches ignores mace's ``drop_last``, and which samples it uses."""
    skipped = 0
    if config.get("oversize") == "skip" and callable(getattr(batch_sampler, "plan", None)):
        skipped = len(getattr(batch_sampler.plan(), "skipped", ()))
    if not skipped:
        return "drop_last is not needed with balanced batches; every sample is used"
    return (
        f"drop_last is not needed with balanced batches; every sample is used but the {skipped} "
        "costlier than the capacity, which oversize=skip leaves out"
    )


#: the most loss terms (calls of ``mace.modules.loss.reduce_loss`` in one call of the loss) the
#: structure-mean validation loss keeps apart
MAX_LOSS_TERMS = 8
#: how far a batch's loss may be from its terms recombined (relative) for the split to count as
#: exact (float32 rounding passes; a term outside ``reduce_loss`` does not)
TERMS_RTOL = 1e-5


def loss_terms(loss_fn, ref, pred):
    """mace's loss on one batch, split into its terms: ``(raw, coefficients, exact)``.

    Every term of mace's losses is ``reduce_loss(raw)``, the mean of a tensor ``raw`` of
    per-structure (energy, stress, virials) or per-atom (forces) parts, and the loss is a linear
    combination of the terms. The loss is called with ``ddp=True`` (so that Huber terms, too, go
    through ``reduce_loss``) and ``mace.modules.loss.reduce_loss`` replaced by one that records
    ``raw`` and returns a chosen value: each term's mean once (the batch's loss), 0 for all (the
    constant, which must be 0), then 1 for one term at a time (its coefficient). ``exact``: the
    recombined terms give the loss of the batch as mace computes it on one rank (``ddp=False``),
    at most :data:`MAX_LOSS_TERMS` terms and no constant; nothing here reduces over ranks."""
    import torch
    from mace.modules import loss as mace_loss

    stock = mace_loss.reduce_loss
    raws, replies = [], []

    def reduce_loss(raw_loss, ddp=None):
        k = len(raws)
        raws.append(raw_loss)
        reply = replies[k] if k < len(replies) else raw_loss.mean()
        return torch.as_tensor(reply, dtype=raw_loss.dtype, device=raw_loss.device)

    def call(values):
        raws.clear()
        replies[:] = values
        return float(loss_fn(ref=ref, pred=pred, ddp=True))

    with torch.no_grad():
        one_rank = float(loss_fn(ref=ref, pred=pred, ddp=False))
        mace_loss.reduce_loss = reduce_loss
        try:
            value = call([])
            found = [r.detach() for r in raws]
            n = len(found)
            constant = call([0.0] * n)
            coefficients = [
                call([1.0 if j == k else 0.0 for j in range(n)]) - constant for k in range(n)
            ]
        finally:
            mace_loss.reduce_loss = stock
    means = [float(r.mean()) if r.numel() else 0.0 for r in found]
    recombined = sum(a * m for a, m in zip(coefficients, means))
    scale = max(abs(one_rank), abs(value), 1e-300)
    exact = (
        0 < n <= MAX_LOSS_TERMS
        and abs(constant) <= TERMS_RTOL * scale
        and abs(recombined - one_rank) <= TERMS_RTOL * scale
        and abs(value - one_rank) <= TERMS_RTOL * scale
    )
    return found, coefficients, exact


def structure_mean_metric_class(metric_cls):
    """A subclass of mace's ``MACELoss`` (``metric_cls``) whose ``loss`` is mace's loss function
    over the whole set as one batch on one rank, the same whatever the batches and the number of
    ranks; its other metrics are mace's. Where a loss does not split into terms exactly
    (:func:`loss_terms`), the loss is ``metric_cls``'s own, said once.

    With binpack, this ``loss`` is what mace's ``evaluate`` logs and uses for checkpoints and
    patience: each term of the loss (a call of ``mace.modules.loss.reduce_loss``) is summed and
    counted over every batch and rank, and the terms' means are combined with the loss's own
    coefficients.
    """
    import torch

    class StructureMeanLoss(metric_cls):
        def __init__(self, loss_fn):
            super().__init__(loss_fn=loss_fn)
            f64 = torch.float64
            # summed over ranks: each term's sum and count of parts, each rank's coefficients
            # (once per rank that evaluated a batch) and how many such ranks
            self.add_state("cfm_sums", torch.zeros(MAX_LOSS_TERMS, dtype=f64), "sum")
            self.add_state("cfm_counts", torch.zeros(MAX_LOSS_TERMS, dtype=f64), "sum")
            self.add_state("cfm_coefficients", torch.zeros(MAX_LOSS_TERMS, dtype=f64), "sum")
            self.add_state("cfm_ranks", torch.zeros((), dtype=f64), "sum")
            self.add_state("cfm_terms", torch.zeros((), dtype=f64), "max")
            self.add_state("cfm_inexact", torch.zeros((), dtype=f64), "sum")

        cfm_last = None  # (batch, output, terms) of the last update

        def update(self, batch, output):  # pylint: disable=arguments-differ
            super().update(batch, output)
            last = self.cfm_last
            if last is not None and last[0] is batch and last[1] is output:
                terms = last[2]  # torchmetrics' forward updates twice with the same batch
            else:
                terms = loss_terms(self.loss_fn, batch, output)
                self.cfm_last = (batch, output, terms)
            raws, coefficients, exact = terms
            n = len(raws)
            seen = self.cfm_ranks > 0
            if seen and (
                n != int(self.cfm_terms)
                or any(
                    abs(a - float(b)) > TERMS_RTOL * max(abs(a), 1.0)
                    for a, b in zip(coefficients, self.cfm_coefficients[:n])
                )
            ):
                exact = False  # the terms changed from one batch to the next
            if not exact:
                self.cfm_inexact += 1
                return
            for k, raw in enumerate(raws):
                self.cfm_sums[k] += raw.to(torch.float64).sum()
                self.cfm_counts[k] += raw.numel()
            if not seen:
                self.cfm_coefficients[:n] = torch.tensor(coefficients, dtype=torch.float64)
                self.cfm_ranks += 1
                self.cfm_terms.fill_(n)

        def compute(self):
            loss, aux = super().compute()
            if self.cfm_inexact > 0 or self.cfm_ranks == 0:
                said = (
                    f"binpack: mace's validation loss for {type(self.loss_fn).__name__} is mace's "
                    "own mean of per-batch means (it depends on the batches): the loss does not "
                    "split into means of per-structure parts"
                )
                if said not in _SAID:
                    _SAID.add(said)
                    log.warning("%s", said)
                return loss, aux
            n = int(self.cfm_terms)
            coefficients = self.cfm_coefficients[:n] / self.cfm_ranks
            value = (coefficients * self.cfm_sums[:n] / self.cfm_counts[:n].clamp(min=1)).sum()
            aux["loss"] = float(value)
            return aux["loss"], aux

    StructureMeanLoss.__name__ = metric_cls.__name__
    return StructureMeanLoss


_SAID: set[str] = set()


def use_structure_mean_loss() -> callable:
    """Put :func:`structure_mean_metric_class` in place of ``MACELoss`` in ``mace.tools.train``
    (``evaluate`` looks the name up at each call); return a function that puts mace's back."""
    import importlib

    mace_train = importlib.import_module("mace.tools.train")
    stock = mace_train.MACELoss
    mace_train.MACELoss = structure_mean_metric_class(stock)

    def undo():
        mace_train.MACELoss = stock

    return undo
