"""Loss weighting inside nequip-train (binpack's ``loss_weighting=per_sample``, nequip 0.19).

NequIP's training loss is a ``MetricsManager``: a weighted sum (normalised coefficients) of
metrics such as ``per_atom_energy_mse`` (a graph field) and ``forces_mse`` (a node field). For the
loss, nequip sets ``dist_sync_on_step``: each metric is the mean over the whole step, all ranks
together, and ``training_step`` multiplies by the world size to cancel DDP's average (reduction
``"step"`` of :mod:`cfm_plugins.sampler.weighting`, as in mace). nequip batches carry no
per-sample weights, so the seam is the loss: each metric's term of the weighted sum is multiplied
by the step's graph factor (graph fields) or atom factor (node fields), exact because the factor
is the same for every element of the step. :func:`loss_weightings` says whether a training
module's loss allows it; :class:`LossWeighting` (a Lightning callback) applies it.
"""

from __future__ import annotations

import logging

try:  # the callback base class; importable without Lightning for the helpers below
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - nequip always brings Lightning
    Callback = object

log = logging.getLogger("cfm_plugins.nequip")

REDUCTION = "step"  # dist_sync_on_step means over all ranks, times world size (see module doc)
KINDS = {"graph": "graphs", "node": "atoms"}


def loss_terms(manager) -> tuple[dict[str, str], str | None]:
    """``({metric name: "graphs" | "atoms"}, None)`` for the metrics of the weighted sum, or
    ``({}, reason)`` when one of them cannot be reweighted per sample."""
    from nequip.train import MeanAbsoluteError, MeanSquaredError

    kinds = {}
    for name, entry in manager.entries.items():
        if entry.coeff is None:
            continue  # logged, not in the loss
        metric = manager[name]
        if entry.field is None:
            return {}, f"{name} is a custom metric without a field"
        if entry.per_type:
            return {}, f"{name} averages per-type means (per_type: true)"
        if type(metric) not in (MeanSquaredError, MeanAbsoluteError):
            return (
                {},
                f"{name} is a {type(metric).__name__}, not a mean (MeanSquaredError or "
                "MeanAbsoluteError)",
            )
        kind = KINDS.get(entry.field.type)
        if kind is None:
            return {}, f"{name} is a metric of an {entry.field.type} field"
        kinds[name] = kind
    return kinds, None


def loss_weightings(module) -> tuple[str, tuple[str, ...]]:
    """``(description, weightings)`` of a nequip training module's loss, for ``TrainerSettings``.

    The loss can be reweighted where every metric in the weighted sum is a plain mean
    (``MeanSquaredError``, ``MeanAbsoluteError``) of a graph or node field, not ``per_type``
    (those average per-type means, a weighting of their own)."""
    manager = getattr(module, "loss", None)
    if manager is None or not hasattr(manager, "entries"):
        return "nequip-train's loss", ("stock",)
    kinds, reason = loss_terms(manager)
    names = ", ".join(n for n, e in manager.entries.items() if e.coeff is not None)
    if reason is not None:
        return f"nequip-train's loss ({reason})", ("stock",)
    return f"nequip-train's loss ({names})", ("stock", "per_sample")


def training_sampler(trainer):
    """The binpack sampler behind Lightning's training loader, if it weighs per sample."""
    loader = getattr(trainer, "train_dataloader", None)
    wrapper = getattr(loader, "batch_sampler", None)
    sampler = getattr(wrapper, "batch_sampler", wrapper)
    return sampler if getattr(sampler, "loss_weighting", "stock") != "stock" else None


class LossWeighting(Callback):
    """Scales each training step's loss terms by the binpack sampler's factors (see module doc).

    The adapter adds it to the Trainer under binpack. With a per-sample training sampler it takes
    each batch's factors at ``on_train_batch_start`` (in the order the DataLoader yields them) and
    scales the weighted sum's gradient; the value nequip logs stays its own. Validation uses
    nequip's ``val_metrics``, never touched."""

    def __init__(self):
        self.sampler = None
        self.current = None
        self._wrapped = None

    def setup(self, trainer, pl_module, stage):
        """Tell binpack what the training module's loss allows, before Lightning makes the
        training loader: a run restarted from a checkpoint (``ckpt_path``) builds its module with
        ``load_from_checkpoint``, never through the config the adapter reads (``instantiate``), so
        this is where such a run's loss is seen, and weighed as the first run's was."""
        import dataclasses

        from cfm_plugins_adapters.nequip import _STATE

        session = _STATE.get("session")
        if session is None or not hasattr(pl_module, "loss"):
            return
        loss, weightings = loss_weightings(pl_module)
        session.trainer = dataclasses.replace(
            session.trainer, loss=loss, loss_weightings=weightings
        )

    def on_train_start(self, trainer, pl_module):
        self.sampler = training_sampler(trainer)
        if self.sampler is None or self._wrapped is pl_module.loss:
            return
        kinds, reason = loss_terms(pl_module.loss)
        if (
            reason is not None
        ):  # binpack chose per_sample from TrainerSettings; the module changed since
            raise ValueError(
                f"binpack loss_weighting=per_sample: {reason}; set loss_weighting=stock"
            )
        self._wrap(pl_module.loss, kinds)
        log.info(
            "binpack loss_weighting=per_sample: nequip's loss terms scaled per step (%s)",
            ", ".join(f"{n}: {k}" for n, k in kinds.items()),
        )

    def _wrap(self, manager, kinds):
        stock = manager.forward
        callback = self

        def forward(preds, target, prefix="", suffix=""):
            out = stock(preds, target, prefix=prefix, suffix=suffix)
            scale, key = callback.current, f"{prefix}weighted_sum{suffix}"
            if scale is None or key not in out:
                return out
            scaled = sum(
                out[f"{prefix}{name}{suffix}"]
                * manager.entries[name].coeff
                * (scale.graphs if kind == "graphs" else scale.atoms)
                for name, kind in kinds.items()
            )
            out[key] = (
                scaled + (out[key] - scaled).detach()
            )  # nequip's value, the per-sample gradient
            return out

        manager.forward = forward
        self._wrapped = manager

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.sampler is not None:
            self.current = self.sampler.next_loss_scale(REDUCTION)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.current = None
