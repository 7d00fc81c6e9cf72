"""Non-finite training losses: stop at the first one, naming the structures of its batch, or skip
such steps (binpack's ``nonfinite=skip``) and name them at the end.

A label that is NaN or infinite, or a structure the model cannot evaluate (two atoms on one site),
gives a loss that is not finite; one optimizer step with it makes every weight NaN, and a trainer
that does not look trains on and saves a NaN model with exit status 0. The trainer adapters hand
each training step's loss to a :class:`LossGuard` (where their trainer already brings it to the
host, so the check costs no extra synchronisation), together with what they know of the step:
its epoch and step and, with binpack's batches, the structures of this rank's batch (file and
index, :func:`dataset_source`). The guard raises :class:`NonFiniteLossError` (``error``, the
default) or counts the step as skipped (``skip``: the adapter then makes no optimizer step) and
says at the end which steps were skipped (:meth:`LossGuard.summary`).

The module imports no torch; :func:`agree_not_finite` (the ``skip`` mode's one host
synchronisation) imports it when called.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass

log = logging.getLogger("cfm_plugins")

MODES = ("error", "skip")
#: structures named in one message (the rest counted)
SHOWN = 12


class NonFiniteLossError(RuntimeError):
    """A training step's loss is NaN or infinite (``nonfinite=error``)."""


def dataset_source(dataset, index: int, leaf=None):
    """Where sample ``index`` of ``dataset`` comes from: ``(file, index in that file)`` or None.

    Walks torch's ``Subset`` (``.dataset``, ``.indices``) and ``ConcatDataset`` (``.datasets``,
    ``.cumulative_sizes``) down to the dataset that holds the sample, then asks ``leaf(dataset,
    index)`` (an adapter's: mace's in-memory lists) or reads a ``file_path`` attribute (NequIP's
    ``ASEDataset``: the sample's index is its place in the file).
    """
    index = int(index)
    for _ in range(64):  # nested subsets and concatenations
        if hasattr(dataset, "cumulative_sizes") and hasattr(dataset, "datasets"):
            part = bisect.bisect_right(dataset.cumulative_sizes, index)
            index -= dataset.cumulative_sizes[part - 1] if part else 0
            dataset = dataset.datasets[part]
        elif hasattr(dataset, "indices") and hasattr(dataset, "dataset"):
            index = int(dataset.indices[index])
            dataset = dataset.dataset
        else:
            break
    if leaf is not None:
        found = leaf(dataset, index)
        if found is not None:
            return found
    path = getattr(dataset, "file_path", None)
    return (
        (str(path), index)
        if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__")
        else None
    )


def name_structures(
    sources, what: str = "the training set", order: str = "counted from 0, in file order"
) -> str:
    """``[(file, index) or None, ...]`` (None: a structure whose file is not known, counted) as
    one phrase: ``train.xyz: structures 3, 5 (counted from 0, in file order)``; ``what``: the set
    they belong to, for the unknown ones; ``order``: how the indices count."""
    by_file: dict[str, list[int]] = {}
    unknown = 0
    for src in sources:
        if src is None:
            unknown += 1
        else:
            by_file.setdefault(str(src[0]), []).append(int(src[1]))
    parts = []
    for path, idx in by_file.items():
        shown = ", ".join(str(i) for i in idx[:SHOWN])
        more = f" and {len(idx) - SHOWN} more" if len(idx) > SHOWN else ""
        parts.append(f"{path}: structure{'s' if len(idx) > 1 else ''} {shown}{more}")
    if unknown:
        parts.append(f"{unknown} structure(s) of {what} whose file is not known")
    text = "; ".join(parts) or "no structure"
    return text + (f" ({order})" if by_file else "")


def agree_not_finite(loss, world_size: int) -> tuple[bool, bool]:
    """``(this rank's loss is not finite, some rank's is)`` for a training ``loss`` tensor: one
    all-reduce of a flag over torch.distributed's ranks (where there are several) and one copy to
    the host, so that every rank skips the same steps."""
    import torch

    local = (~torch.isfinite(loss.detach()).all()).reshape(1).to(torch.float32)
    shared = local.clone()
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(shared, op=torch.distributed.ReduceOp.MAX)
    own, anyone = (v > 0 for v in torch.cat([local, shared]).tolist())
    return own, anyone


@dataclass
class SkippedStep:
    epoch: int | None
    step: int | None
    value: float
    structures: str | None  # this rank's batch, named; None: this rank's loss was finite


def _where(epoch, step) -> str:
    if epoch is None and step is None:
        return "a training step"
    if step is None:
        return f"epoch {epoch}"
    return f"epoch {epoch}, step {step}" if epoch is not None else f"step {step}"


class LossGuard:
    """What to do with a non-finite training loss on this rank (see the module doc).

    Args:
        mode: ``"error"`` or ``"skip"``.
        rank, world_size: this rank, for the messages.
        trainer: the trainer's name, for the messages (``"mace_run_train"``).
        named: whether the adapter can name a batch's structures (binpack's batches); without,
            the message says how to have them named.
    """

    def __init__(
        self,
        mode: str = "error",
        rank: int = 0,
        world_size: int = 1,
        trainer: str = "the trainer",
        named: bool = True,
    ):
        if mode not in MODES:
            raise ValueError(f"nonfinite={mode!r}: expected one of {', '.join(MODES)}")
        self.mode, self.rank, self.world_size = mode, int(rank), int(world_size)
        self.trainer, self.named = trainer, bool(named)
        self.skipped: list[SkippedStep] = []
        self.run_of_skips = 0  # consecutive steps skipped

    @staticmethod
    def finite(value) -> bool:
        try:
            return math.isfinite(float(value))
        except (TypeError, ValueError):
            return False

    def _batch(self, structures: str | None, own: bool = True) -> str:
        if not own:
            held = f" ({structures})" if structures else ""
            return (
                f"this rank's batch{held} gave finite values: the loss is averaged over the "
                "ranks, and another rank's batch is the one (its rank names it)"
            )
        if structures is not None:
            return f"this rank's batch holds {structures}"
        if not self.named:
            return (
                "the structures of the batch are not known with the trainer's own batches "
                "(with binpack's batches they are named: --enable ...,binpack)"
            )
        return "the structures of the batch could not be told"

    def stop(
        self,
        value,
        epoch=None,
        step=None,
        structures: str | None = None,
        note: str = "",
        own: bool = True,
    ):
        """Raise :class:`NonFiniteLossError` for loss ``value`` at ``epoch``/``step``; ``own``:
        whether this rank's batch gave the non-finite value (False: another rank's did, in a loss
        averaged over the ranks)."""
        who = f"rank {self.rank} of {self.world_size}: " if self.world_size > 1 else ""
        raise NonFiniteLossError(
            f"{who}the training loss of {self.trainer} is {float(value)} at "
            f"{_where(epoch, step)}, so training stopped before any checkpoint was written with "
            f"it; {self._batch(structures, own)}{note}. Look there for labels that are not "
            "finite or far off, or atoms on top of one another, and remove such structures; or "
            "let binpack skip such steps (-o nonfinite=skip: no optimizer step for them, named at "
            "the end)"
        )

    def skip(self, value, epoch=None, step=None, structures: str | None = None, own=True) -> None:
        """Count a skipped step (``own``: this rank's loss was the non-finite one)."""
        self.skipped.append(SkippedStep(epoch, step, float(value), structures if own else None))
        self.run_of_skips += 1
        if own:
            log.warning(
                "nonfinite=skip: %s: the training loss is %s; no optimizer step on any rank (%s)",
                _where(epoch, step),
                float(value),
                self._batch(structures),
            )

    def passed(self) -> None:
        """A step whose loss was finite on every rank."""
        self.run_of_skips = 0

    def check_not_all_skipped(self, steps_per_epoch: int | None) -> None:
        """Raise when a whole epoch's worth of consecutive steps was skipped: nothing is learnt
        any more, and skipping cannot help."""
        if steps_per_epoch and self.run_of_skips >= steps_per_epoch:
            raise NonFiniteLossError(
                f"nonfinite=skip: the last {self.run_of_skips} training step(s) of {self.trainer} "
                "(an epoch's worth) were all skipped for a non-finite loss, so nothing is learnt: "
                "either the model itself no longer gives finite values (it diverged: lower the "
                "learning rate) or the structures named above are in every step (remove them "
                "from the training file)"
            )

    def summary(self) -> str | None:
        """One line naming the skipped steps, or None when none was."""
        if not self.skipped:
            return None
        own = [s for s in self.skipped if s.structures is not None]
        shown = "; ".join(
            f"{_where(s.epoch, s.step)} (loss {s.value}: {s.structures})" for s in own[:SHOWN]
        )
        more = f"; and {len(own) - SHOWN} more" if len(own) > SHOWN else ""
        return (
            f"nonfinite=skip: {len(self.skipped)} training step(s) of {self.trainer} skipped on "
            f"rank {self.rank} (no optimizer step); {len(own)} for a non-finite loss of this "
            f"rank's batch{': ' + shown + more if own else ''}"
            + (
                f", {len(self.skipped) - len(own)} for another rank's"
                if len(self.skipped) > len(own)
                else ""
            )
        )
