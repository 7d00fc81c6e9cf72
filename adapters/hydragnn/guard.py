"""Non-finite training losses inside HydraGNN's training loop (see :mod:`cfm_plugins.nonfinite`).

HydraGNN's ``train`` calls ``model.module.loss(pred, data.y, head_index)`` once per training
batch, then ``loss.backward()`` and ``opt.step()``; it never reads the loss on the host during the
epoch (it sums it on the device). Each rank's loss is its own; DDP averages the gradients, so one
rank's NaN reaches every rank's weights at the optimizer step. :class:`HydraLossGuard` wraps the
model's ``loss`` (installed by the ``get_distributed_model`` seam, after the loss weighting): with
``nonfinite=error`` (the default, and the only mode without binpack) a non-finite loss raises
:class:`~cfm_plugins.nonfinite.NonFiniteLossError` before HydraGNN writes a checkpoint; with
``nonfinite=skip`` (binpack) every rank drops that step's gradients. The class says how.

With binpack, the training loader records which step of the plan each batch is
(:func:`tracked_loader_class`), and the sampler's plan gives that batch's graphs: they are named
by their place in the training set handed to ``create_dataloaders`` (HydraGNN's graphs carry no
file).
"""

from __future__ import annotations

import collections
import logging

from cfm_plugins.api import LossGuard, agree_not_finite, name_structures

log = logging.getLogger("cfm_plugins.hydragnn")

#: how the graphs of a batch are named (HydraGNN's lists of graphs have no file)
TRAINSET = "HydraGNN's training set (the trainset given to create_dataloaders)"
ORDER = "counted from 0, in the order of that list"


def tracked_loader_class(loader_cls, guard: HydraLossGuard):
    """A subclass of ``loader_cls`` (the training loader) that tells ``guard`` the step of the
    plan of each batch it yields (the k-th batch of a pass is step ``first_step + k``), and has the
    losses not yet read checked when a pass ends."""

    class TrackedDataLoader(loader_cls):
        def __iter__(self):
            sampler = guard.sampler = self.batch_sampler
            try:
                for k, batch in enumerate(super().__iter__()):
                    guard.step = getattr(sampler, "first_step", 0) + k
                    yield batch
            finally:
                guard.step = None
                guard.epoch_done()

    TrackedDataLoader.__name__ = loader_cls.__name__
    return TrackedDataLoader


class HydraLossGuard:
    """The seam of :mod:`cfm_plugins.nonfinite` in HydraGNN's training loop (see the module
    doc).

    - ``nonfinite=error``: on CPU the loss is read at once (reading a CPU tensor waits for
      nothing) and a non-finite one raises :class:`~cfm_plugins.nonfinite.NonFiniteLossError`
      before ``backward``. On a GPU it is copied to the host without waiting (pinned memory, a
      CUDA event) and read when the GPU got there (at the next training losses), so the check
      adds no synchronisation; every loss not yet read is read before HydraGNN writes a
      checkpoint (the ``save_model`` seam: the error comes before the file) and when a pass over
      the training loader ends. The weights of those few steps are NaN in memory only.
    - ``nonfinite=skip``: the loss is read at once (one host synchronisation per step), the ranks
      agree on it (one all-reduce of a flag) and, where any rank's loss is not finite, every rank
      drops its gradients just before the optimizer steps (torch's global optimizer step
      pre-hook, ``grad = None``: Adam and the other torch optimizers then change no weight and no
      moment). The loss handed back to HydraGNN in that step is 0 (its "Train Loss" averages it
      with the others; the step's graphs still count in its mean). Skipped steps are named at the
      end.
    """

    def __init__(self, config, dist):
        binpack = config.is_enabled("binpack")
        mode = (config.get("nonfinite") if binpack else None) or "error"
        self.guard = LossGuard(mode, dist.rank, dist.world_size, "HydraGNN", named=binpack)
        self.world_size = dist.world_size
        self.sampler = None  # the training batch sampler, once its loader runs
        self.step = None  # the plan's step of the training batch under way
        self.epoch = -1  # HydraGNN's epoch: counted where training losses follow others
        self.steps = 0  # training losses in the current epoch
        self.training = False  # the last loss was a training batch's
        self.pending = collections.deque()  # (host copy, CUDA event, epoch, step)
        self.skip_next = False  # drop the gradients at the next optimizer step
        self._hook = None

    # -- where a step is ------------------------------------------------------------------------
    def structures(self, step=None) -> str | None:
        """The graphs of this rank's batch at ``step`` of the plan (default: the batch under way),
        named; None without binpack's plan."""
        sampler, step = self.sampler, self.step if step is None else step
        if sampler is None or step is None or not hasattr(sampler, "batch_at"):
            return None
        try:
            indices = sampler.batch_at(step)
        except IndexError:
            return None
        return name_structures([(TRAINSET, int(i)) for i in indices], "the training set", ORDER)

    def where(self):
        return (self.epoch if self.epoch >= 0 else None), (
            self.step if self.step is not None else self.steps - 1
        )

    # -- the loss --------------------------------------------------------------------------------
    def wrap_loss(self, model) -> None:
        """Check ``model.loss`` of every training batch (see the class docstring)."""
        stock = model.loss
        guard = self

        def loss(pred, value, head_index):
            total, tasks = stock(pred, value, head_index)
            if not model.training:  # validation, test: HydraGNN's own
                if guard.training:
                    guard.epoch_done()
                return total, tasks
            if not guard.training:  # the first training batch of an epoch
                guard.training, guard.steps = True, 0
                guard.epoch += 1
            guard.steps += 1
            if guard.guard.mode == "skip":
                return guard._skipping(total, tasks)
            guard._watch(total)
            return total, tasks

        model.loss = loss
        if self.guard.mode == "skip":
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._hook = register_optimizer_step_pre_hook(self._pre_step)

    def _watch(self, total) -> None:
        import torch

        self._poll(block=False)
        epoch, step = self.where()
        if total.device.type != "cuda":
            value = float(total.detach())
            if not LossGuard.finite(value):
                self.guard.stop(value, epoch, step, self.structures())
            return
        host = torch.empty((), dtype=total.dtype, pin_memory=True)
        host.copy_(total.detach().reshape(()), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((host, event, epoch, step))  # named only if it is not finite

    def _poll(self, block: bool) -> None:
        while self.pending:
            host, event, epoch, step = self.pending[0]
            if not block and not event.query():
                return
            event.synchronize()
            self.pending.popleft()
            value = float(host)
            if not LossGuard.finite(value):
                self.pending.clear()
                self.guard.stop(value, epoch, step, self.structures(step))

    def _skipping(self, total, tasks):
        own, anyone = agree_not_finite(total, self.world_size)  # the one sync
        if not anyone:
            self.guard.passed()
            return total, tasks
        epoch, step = self.where()
        self.guard.skip(float(total.detach()), epoch, step, self.structures() if own else None, own)
        self.skip_next = True
        per_epoch = len(self.sampler) if self.sampler is not None else None
        self.guard.check_not_all_skipped(per_epoch)
        # backward still runs (DDP reduces every gradient once); the value HydraGNN sums is 0
        zero = total.nan_to_num(0.0, posinf=0.0, neginf=0.0) * 0.0
        return zero, [t.detach().nan_to_num(0.0, posinf=0.0, neginf=0.0) * 0.0 for t in tasks]

    def _pre_step(self, optimizer, args, kwargs):
        if not self.skip_next:
            return None
        self.skip_next = False
        for group in optimizer.param_groups:  # no gradient: the optimizer changes nothing
            for p in group["params"]:
                p.grad = None
        return None

    # -- the ends --------------------------------------------------------------------------------
    def epoch_done(self) -> None:
        """The training part of an epoch ended: read every loss not read yet."""
        self.training = False
        self._poll(block=True)

    def before_checkpoint(self) -> None:
        self._poll(block=True)

    def close(self) -> None:
        """At the end of the run: the losses not read yet, the skipped steps named, the hook
        removed."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._poll(block=True)
        line = self.guard.summary()
        if line:
            log.warning("%s", line)
