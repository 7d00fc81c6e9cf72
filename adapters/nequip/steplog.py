"""Per-rank step timings of a nequip-train run (option ``step_log=PATH``, ``cost=auto``, or as a
callback).

:class:`StepLog` is a Lightning callback. It times every training step's compute
(:class:`cfm_plugins.step_timer.StepTimer`: wall time to DDP's last gradient bucket, and the
training thread's CPU time) and hands it with the batch's atoms, edges and graphs to the training
sampler when that wants step times (``cost=auto``). With a ``path``, for every training and
validation batch it writes one JSON line to ``PATH.rank<R>.jsonl`` (the class lists the fields);
:func:`cfm_plugins.steplog.load_imbalance` turns those into the load imbalance factor (LIF)
``sum_steps max_rank / sum_steps mean_rank``. Under ``cfm-run`` the adapter adds it to the Trainer's
callbacks when ``step_log`` is set or a feature needs step times; in a config: ``{_target_:
cfm_plugins_adapters.nequip.steplog.StepLog, path: PATH}``.
"""

from __future__ import annotations

import time

import lightning

from cfm_plugins.api import StepLogWriter, StepTimer, batch_totals, hand_over


def _session():
    from cfm_plugins_adapters.nequip import _STATE

    return _STATE.get("session")  # None when the callback runs in a plain nequip-train


class StepLog(lightning.Callback):
    """Times every training step; hands it to the training sampler (``cost=auto``) and, with a
    ``path``, writes the step log (training and validation batches).

    Each line: stage, epoch, step, graphs, atoms, the reference total energies of the batch's
    structures (they identify the structures: a test checks every structure is used once per
    epoch), the time of the model's forward (energy and forces: compute only, before DDP's
    gradient all-reduce makes the ranks wait for each other), the step's wall time, and for
    training steps ``compute_s``/``compute_cpu_s``."""

    def __init__(self, path: str | None = None):
        super().__init__()
        self.path = None if path is None else str(path)
        self._writer = None
        self.timer = StepTimer()
        self._forward_s = 0.0
        self._t_forward = None
        self._t_step = None
        self._handles = []

    # -- timing of the model's forward -------------------------------------------------------
    def _pre(self, module, args, kwargs=None):
        self._t_forward = time.perf_counter()

    def _post(self, module, args, output):
        if self._t_forward is not None:
            self._forward_s += time.perf_counter() - self._t_forward
            self._t_forward = None

    def setup(self, trainer, pl_module, stage):
        if self.path is not None:
            self._writer = StepLogWriter(self.path, trainer.global_rank, append=True)
        # training_step and validation_step call the LightningModule itself (energy and forces)
        self._handles = [
            pl_module.register_forward_pre_hook(self._pre),
            pl_module.register_forward_hook(self._post),
        ]

    def on_train_start(self, trainer, pl_module):
        self.timer.attach(
            trainer.strategy.model
        )  # DDP: the end of backward compute is its last bucket

    def teardown(self, trainer, pl_module, stage):
        for h in self._handles:
            h.remove()
        self._handles = []
        self._writer = None

    # -- records -----------------------------------------------------------------------------
    def _start(self):
        self._forward_s = 0.0
        self._t_step = time.perf_counter()

    def _write(self, trainer, stage, batch, batch_idx, extra=None, sampler=None):
        import torch

        if self._writer is None:
            return
        energies = batch.get("total_energy")
        atoms, _, graphs = batch_totals(batch)
        if batch.get("ptr") is None and energies is not None:
            graphs = int(energies.shape[0])
        rec = {
            "stage": stage,
            "epoch": int(trainer.current_epoch),
            "step": int(batch_idx),
            "graphs": graphs,
            "atoms": atoms,
            "energies": energies.detach().flatten().to(torch.float64).tolist()
            if energies is not None
            else [],
            "forward_s": self._forward_s,
            "wall_s": time.perf_counter() - self._t_step,
            **(extra or {}),
        }
        self._writer.write(rec, sampler)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start()
        self.timer.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        compute_s, compute_cpu_s = self.timer.stop()
        session = _session()
        sampler = session.train_sampler if session is not None else None
        atoms, edges, graphs = batch_totals(batch)
        hand_over(sampler, atoms, edges, graphs, wall_s=compute_s, cpu_s=compute_cpu_s)
        self._write(
            trainer,
            "train",
            batch,
            batch_idx,
            {"compute_s": compute_s, "compute_cpu_s": compute_cpu_s},
            sampler,
        )

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._start()

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ):
        if not trainer.sanity_checking:
            self._write(trainer, "val", batch, batch_idx)
