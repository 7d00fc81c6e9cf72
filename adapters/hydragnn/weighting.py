"""Loss weighting inside HydraGNN 3.0's training loop (binpack's ``loss_weighting=per_sample``).

HydraGNN's loss (``Base.loss_hpweighted``) is, per head, ``loss_function(pred, target)`` times the
head's task weight: with ``mse`` or ``mae`` a mean over the batch's graphs (a ``graph`` head) or
its nodes (a ``node`` head); DDP then averages the gradients over the ranks (reduction ``"batch"``
of :mod:`cfm_plugins.sampler.weighting`). Its batches carry no per-sample weights, so the seam is
the loss itself: each head's term is multiplied by the batch's graph or atom factor, which is
exact because the factor is the same for every element of the batch. :class:`TrainingScales`
carries the factor from the loader to the loss. Only the gradient is scaled: the loss keeps the
value HydraGNN computes (its "Train Loss" stays its own definition), and in ``eval()`` mode, or
with no training batch under way (validation, test), the loss is HydraGNN's own.
"""

from __future__ import annotations

import json
import logging

log = logging.getLogger("cfm_plugins.hydragnn")

#: HydraGNN loss_function_type values that are means over the batch's elements (linear in a
#: per-batch factor); rmse is the root of a mean and smooth_l1 is not a function in HydraGNN 3.0
MEAN_LOSSES = ("mse", "mae")
REDUCTION = "batch"  # each rank's mean, then DDP's average


def loss_from_config(argv) -> str | None:
    """``NeuralNetwork.Training.loss_function_type`` of the HydraGNN JSON config in ``argv``, if
    any."""
    for arg in argv[1:]:
        if not str(arg).endswith(".json"):
            continue
        try:
            with open(arg) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        training = (
            data.get("NeuralNetwork", {}).get("Training", {}) if isinstance(data, dict) else {}
        )
        if "loss_function_type" in training:
            return str(training["loss_function_type"])
    return None


def loss_weightings(loss: str | None) -> tuple[str, ...]:
    return ("stock", "per_sample") if loss in MEAN_LOSSES else ("stock",)


class TrainingScales:
    """The loss factors of the training batch HydraGNN is working on (``None``: no training
    batch).

    Set by the loader (a subclass of the PyG DataLoader that sets it as it yields each batch, and
    clears it when the pass ends) and read by the loss (:meth:`wrap_loss`, installed by the
    ``get_distributed_model`` seam on the model HydraGNN calls ``model.module.loss`` on)."""

    def __init__(self):
        self.sampler = None  # the training batch sampler, when it weighs per sample
        self.current = None  # cfm_plugins.sampler.weighting.LossScale of the batch under way

    def loader_class(self, loader_cls):
        """A subclass of ``loader_cls`` that sets :attr:`current` for each batch it yields."""
        scales = self

        class LossScaledDataLoader(loader_cls):
            def __iter__(self):
                try:
                    for batch in super().__iter__():
                        scales.current = scales.sampler.next_loss_scale(REDUCTION)
                        yield batch
                finally:
                    scales.current = None

        return LossScaledDataLoader

    def wrap_loss(self, model) -> None:
        """Scale the gradient of ``model.loss`` per head with the batch's factor (value
        unchanged)."""
        import torch.nn.functional as F

        if getattr(model, "loss_function", None) not in (F.mse_loss, F.l1_loss):
            raise ValueError(
                f"binpack loss_weighting=per_sample: the HydraGNN model's loss function "
                f"{getattr(model, 'loss_function', None)!r} is not a mean (mse or mae); "
                "set loss_weighting=stock"
            )
        stock = model.loss
        scales = self

        def loss(pred, value, head_index):
            total, tasks = stock(pred, value, head_index)
            scale = scales.current
            if scale is None or not model.training:
                return total, tasks
            scaled = sum(
                task * weight * (scale.atoms if kind == "node" else scale.graphs)
                for task, weight, kind in zip(tasks, model.loss_weights, model.head_type)
            )
            # HydraGNN's value (what it logs as the train loss), the per-sample gradient
            return scaled + (total - scaled).detach(), tasks

        model.loss = loss
        log.info(
            "binpack loss_weighting=per_sample: HydraGNN's head losses are scaled per training "
            "batch (graph heads by the graph factor, node heads by the atom factor)"
        )
