"""Non-finite training losses inside nequip-train (see :mod:`cfm_plugins.nonfinite`).

:class:`NonFiniteLoss` is a Lightning callback the adapter adds to every nequip-train Trainer.
Lightning hands it each training step's loss (``on_before_backward``) before the gradients are
made and the optimizer steps (``on_before_optimizer_step``). With ``nonfinite=error`` (the
default, and the only mode without binpack) a non-finite loss raises
:class:`~cfm_plugins.nonfinite.NonFiniteLossError` before any checkpoint is written, without an
extra synchronisation on a GPU; with ``nonfinite=skip`` (binpack) every rank drops that step's
gradients. nequip's loss is the mean over all ranks, so the rank whose batch made it non-finite
is found by a per-rank check of the loss's fields. The class says how each part works.

With binpack, a batch's structures are named from the sampler's plan (``batch_at``) and the
dataset's file (``ASEDataset.file_path``, through nequip's subsets).
"""

from __future__ import annotations

import collections
import logging

import lightning

from cfm_plugins.api import LossGuard, dataset_source, name_structures

log = logging.getLogger("cfm_plugins.nequip")


class NonFiniteLoss(lightning.Callback):
    """Stops at (or skips) a training step whose loss is NaN or infinite (see the module doc).

    - ``nonfinite=error``: a non-finite loss raises
      :class:`~cfm_plugins.nonfinite.NonFiniteLossError`. On CPU the loss is read at once
      (reading a CPU tensor waits for nothing); on a GPU it is copied to the host without waiting
      (``non_blocking`` into pinned memory, with a CUDA event) and read once the GPU got there
      (at the next steps), so the check adds no synchronisation; every loss not yet read is read
      before any checkpoint is written (``on_save_checkpoint``: the error then comes before the
      file is) and at the end of every epoch.
    - nequip's training loss is the mean over all ranks (``dist_sync_on_step``), so every rank
      sees the same non-finite value. To tell which rank's batch made it, the training loss
      (``MetricsManager.forward``) is wrapped to test, on each rank and without waiting, the
      predictions and labels of the fields in the loss (``isfinite``, a few reductions per step);
      that flag is read only with a non-finite loss. The rank whose batch gave it names the
      structures and the fields; the other ranks say their batch was finite.
    - ``nonfinite=skip``: the loss is read before the optimizer step (one host sync per step),
      the ranks agree on it (one all-reduce of a flag) and, where the loss is not finite, every
      rank drops its gradients (``grad = None``): the optimizer then changes no weight and no
      moment. Skipped steps are named at the end.
    """

    def __init__(self):
        self.guard = None
        self.pending = collections.deque()  # (host copies, CUDA event, epoch, step)
        self.count = 0  # batches started in the current epoch
        self.step = None
        self.loss = None
        self.flags = None  # (field names, [fields, 2] bool: predictions, labels not finite)
        self._wrapped = None

    # -- set-up --------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        from cfm_plugins_adapters.nequip import _STATE

        loss = getattr(pl_module, "loss", None)
        if loss is not None and hasattr(loss, "entries") and self._wrapped is not loss:
            self._wrap(loss)
        if self.guard is not None:
            return
        session = _STATE.get("session")
        config = session.config if session is not None else None
        binpack = config is not None and config.is_enabled("binpack")
        mode = (config.get("nonfinite") if binpack else None) or "error"
        self.guard = LossGuard(
            mode, trainer.global_rank, trainer.world_size, "nequip-train", named=binpack
        )

    def _wrap(self, manager):
        """Test, at every training loss, the fields of its terms on this rank (no host sync)."""
        import torch

        fields = [
            (name, entry)
            for name, entry in manager.entries.items()
            if entry.field is not None and entry.coeff is not None
        ]
        stock = manager.forward
        callback = self

        def forward(preds, target, prefix="", suffix=""):
            out = stock(preds, target, prefix=prefix, suffix=suffix)
            if fields and torch.is_grad_enabled():
                with torch.no_grad():
                    rows = []
                    for _, entry in fields:
                        p, t = entry.field(preds, target)
                        bad_t = (
                            torch.isinf(t).any() if entry.ignore_nan else ~torch.isfinite(t).all()
                        )
                        rows.append(torch.stack([~torch.isfinite(p).all(), bad_t]))
                    callback.flags = ([name for name, _ in fields], torch.stack(rows))
            return out

        manager.forward = forward
        self._wrapped = manager

    def _local(self, flags) -> tuple[bool | None, str]:
        """(this rank's batch gave non-finite values, which) from ``flags``; (None, "") unknown."""
        if flags is None:
            return None, ""
        names, table = flags
        table = table.tolist()
        what = [f"{n} predictions" for n, (p, _) in zip(names, table) if p] + [
            f"{n} labels" for n, (_, t) in zip(names, table) if t
        ]
        return bool(what), ", ".join(what)

    def _sampler(self):
        from cfm_plugins_adapters.nequip import _STATE

        session = _STATE.get("session")
        return getattr(session, "train_sampler", None) if session is not None else None

    def _structures(self, trainer, step) -> str | None:
        sampler = self._sampler()
        loader = getattr(trainer, "train_dataloader", None)
        dataset = getattr(loader, "dataset", None)
        if sampler is None or step is None or dataset is None or not hasattr(sampler, "batch_at"):
            return None
        try:
            indices = sampler.batch_at(step)
        except IndexError:
            return None
        return name_structures([dataset_source(dataset, i) for i in indices], "the training set")

    # -- the steps -----------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer, pl_module):
        self.count = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        sampler = self._sampler()
        first = getattr(sampler, "first_step", 0) if sampler is not None else 0
        self.step = first + self.count if sampler is not None else batch_idx
        self.count += 1
        self._poll(block=False, trainer=trainer)

    def on_before_backward(self, trainer, pl_module, loss):
        if self.guard is None:
            return
        flags, self.flags = self.flags, None
        if self.guard.mode == "skip":
            self.loss = (loss.detach(), flags)
            return
        self._watch(trainer, loss.detach(), flags)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.guard is None or self.guard.mode != "skip" or self.loss is None:
            return
        import torch

        (loss, flags), self.loss = self.loss, None
        bad = ~torch.isfinite(loss).all()
        own = flags[1].any() if flags is not None else bad  # this rank's batch gave it
        local = torch.stack([bad | own, own]).to(torch.float32)
        shared = local[:1].clone()
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            torch.distributed.all_reduce(shared, op=torch.distributed.ReduceOp.MAX)
        # the one host sync of skip
        own, anyone = (v > 0 for v in torch.cat([local[1:], shared]).tolist())
        if not anyone:
            self.guard.passed()
            return
        for group in optimizer.param_groups:  # no gradient: the optimizer changes nothing
            for p in group["params"]:
                p.grad = None
        epoch = trainer.current_epoch
        names = self._structures(trainer, self.step) if own else None
        self.guard.skip(float(loss), epoch, self.step, names, own)
        self.guard.check_not_all_skipped(trainer.num_training_batches)

    # -- reading the losses --------------------------------------------------------------------
    def _watch(self, trainer, loss, flags):
        import torch

        epoch = trainer.current_epoch
        if loss.device.type != "cuda":
            self._check(trainer, float(loss), epoch, self.step, flags)
            return
        host = torch.empty((), dtype=loss.dtype, pin_memory=True)
        host.copy_(loss.reshape(()), non_blocking=True)
        if flags is not None:
            table = torch.empty(flags[1].shape, dtype=torch.bool, pin_memory=True)
            table.copy_(flags[1], non_blocking=True)
            flags = (flags[0], table)
        event = torch.cuda.Event()
        event.record()
        self.pending.append((host, flags, event, epoch, self.step))

    def _poll(self, block: bool, trainer=None) -> None:
        while self.pending:
            host, flags, event, epoch, step = self.pending[0]
            if not block and not event.query():
                return
            event.synchronize()
            self.pending.popleft()
            self._check(trainer, float(host), epoch, step, flags)

    def _check(self, trainer, value, epoch, step, flags) -> None:
        if LossGuard.finite(value):
            return
        self.pending.clear()
        own, what = self._local(flags)
        names = self._structures(trainer, step) if trainer is not None else None
        if own is False:
            self.guard.stop(value, epoch, step, names, own=False)
        self.guard.stop(value, epoch, step, names, f" (its {what} are not finite)" if what else "")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._poll(block=True, trainer=trainer)  # before the file is written

    def on_train_epoch_end(self, trainer, pl_module):
        self._poll(block=True, trainer=trainer)

    def on_train_end(self, trainer, pl_module):
        self._poll(block=True, trainer=trainer)
        line = self.guard.summary() if self.guard is not None else None
        if line:
            log.warning("%s", line)
