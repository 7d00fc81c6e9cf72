"""Non-finite training losses inside mace_run_train (see :mod:`cfm_plugins.nonfinite`).

``mace.tools.train.train_one_epoch`` calls ``take_step`` (looked up in its module at call time)
once per training batch, with keyword arguments; ``take_step`` runs forward, ``loss_fn``,
backward, gradient clipping, ``optimizer.step()`` and ``ema.update()``, then brings the loss to
the host for its log. :class:`MaceLossGuard` wraps both functions: with ``nonfinite=error`` (the
default, and the only mode without binpack) a non-finite loss raises
:class:`~cfm_plugins.nonfinite.NonFiniteLossError` before mace writes the epoch's checkpoint, at
no extra synchronisation; with ``nonfinite=skip`` (binpack) every rank skips the optimizer and
EMA update of that step. The class says how each mode works.

With binpack, the training loader records which step of the plan each batch it returns is
(``cfm_step``, :func:`.loader.tracked_loader_class`); its sampler gives that batch's dataset
indices (``batch_at``) and :class:`.data_checks.Sources` their file and index.
"""

from __future__ import annotations

import logging

from cfm_plugins.api import LossGuard, agree_not_finite, dataset_source, name_structures

log = logging.getLogger("cfm_plugins.mace")


class _Held:
    """The optimizer or the EMA as ``take_step`` sees it: ``step``/``update`` do nothing in a
    skipped step; everything else is the object's own."""

    def __init__(self, target, state: dict):
        self._target, self._state = target, state

    def step(self, *args, **kwargs):
        if self._state["skip"]:
            return None
        return self._target.step(*args, **kwargs)

    def update(self, *args, **kwargs):
        if self._state["skip"]:
            return None
        return self._target.update(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._target, name)


class MaceLossGuard:
    """The seam of :mod:`cfm_plugins.nonfinite` in mace's training loop (see the module doc).

    - ``nonfinite=error``: the loss mace brought to the host (``to_numpy``) is checked after
      ``take_step`` returns, so the check adds no synchronisation. A non-finite loss raises
      :class:`~cfm_plugins.nonfinite.NonFiniteLossError` inside the epoch, before mace validates
      and writes the epoch's checkpoint (checkpoints and the ``.model`` are written only at epoch
      ends and after training). The weights of that step are NaN in memory only; cfm-run ends
      every rank (the other ranks wait in the next step's collectives). mace's loss is each
      rank's own (``reduce_loss`` shares only the element counts), so the rank whose batch gave
      it is the one that names it.
    - ``nonfinite=skip``: the check must come before ``optimizer.step()``: ``loss_fn`` is wrapped
      to test its result (one host synchronisation per step) and, on several ranks, to agree on
      it (one all-reduce of a flag), so every rank skips the same steps. In a skipped step the
      backward pass runs as usual (DDP reduces the gradients, NaN, once; mace's next step clears
      them), and ``optimizer.step()`` and ``ema.update()`` are not called: the weights, the
      optimizer's moments and the EMA are left as they were. The batches of the other ranks in
      that step are not trained on either (counted). An epoch's worth of consecutive skipped
      steps is an error: nothing is being learnt.
    """

    def __init__(self, config, dist, sources=None):
        binpack = config.is_enabled("binpack")
        mode = (config.get("nonfinite") if binpack else None) or "error"
        self.guard = LossGuard(mode, dist.rank, dist.world_size, "mace_run_train", named=binpack)
        self.world_size = dist.world_size
        self.sources = sources
        self.loader = None
        self.epoch = None
        self.calls = 0  # take_step calls in the current epoch

    # -- where a step is ----------------------------------------------------------------------
    def step(self):
        found = getattr(self.loader, "cfm_step", None)
        return found if found is not None else self.calls - 1

    def structures(self) -> str | None:
        """This rank's current batch, named (with binpack's batches), else None."""
        loader = self.loader
        sampler = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
        step = getattr(loader, "cfm_step", None)
        if sampler is None or step is None or not hasattr(sampler, "batch_at"):
            return None
        leaf = self.sources.of_item if self.sources is not None else None
        try:
            indices = sampler.batch_at(step)
        except IndexError:
            return None
        return name_structures(
            [dataset_source(loader.dataset, i, leaf) for i in indices], "the training set"
        )

    # -- the wrappers -------------------------------------------------------------------------
    def wrap_train_one_epoch(self, stock):
        def train_one_epoch(*args, **kwargs):
            self.loader, self.epoch, self.calls = kwargs.get("data_loader"), kwargs.get("epoch"), 0
            return stock(*args, **kwargs)

        return train_one_epoch

    def wrap_take_step(self, stock):
        def take_step(*args, **kwargs):
            self.calls += 1
            if self.guard.mode == "skip" and "loss_fn" in kwargs and "optimizer" in kwargs:
                return self._skipping(stock, args, kwargs)
            loss, loss_dict = stock(*args, **kwargs)
            value = loss_dict.get("loss") if isinstance(loss_dict, dict) else None
            if value is not None and not LossGuard.finite(value):
                self.guard.stop(value, self.epoch, self.step(), self.structures())
            return loss, loss_dict

        return take_step

    def _skipping(self, stock, args, kwargs):
        loss_fn = kwargs["loss_fn"]
        state = {"skip": False, "own": False, "value": float("nan")}
        world = self.world_size

        def guarded_loss_fn(*a, **k):
            loss = loss_fn(*a, **k)
            own, anyone = agree_not_finite(loss, world)  # the one sync
            if anyone:
                state.update(skip=True, own=own, value=float(loss.detach()))
            return loss

        kwargs = dict(kwargs, loss_fn=guarded_loss_fn, optimizer=_Held(kwargs["optimizer"], state))
        if kwargs.get("ema") is not None:
            kwargs["ema"] = _Held(kwargs["ema"], state)
        out = stock(*args, **kwargs)
        if state["skip"]:
            own = state["own"]
            self.guard.skip(
                state["value"], self.epoch, self.step(), self.structures() if own else None, own
            )
            self.guard.check_not_all_skipped(len(self.loader) if self.loader is not None else None)
        else:
            self.guard.passed()
        return out

    def report(self) -> None:
        """Log which steps were skipped (at the end of the run)."""
        line = self.guard.summary()
        if line:
            log.warning("%s", line)
