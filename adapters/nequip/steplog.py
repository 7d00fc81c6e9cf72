"""Per-rank step records of a nequip-train run (option ``step_log=PATH``, or as a callback).

:class:`StepLog` is a Lightning callback. For every training and validation batch it writes one
JSON line to ``PATH.rank<R>.jsonl``: stage, epoch, step, graphs, atoms, the reference total
energies of the batch's structures (they identify the structures: a test checks every structure
is used once per epoch), the time of the model's forward (energy and forces: compute only, before
DDP's gradient all-reduce makes the ranks wait for each other) and the step's wall time.
:func:`cfm_plugins.steplog.load_imbalance` turns those into the load imbalance factor (LIF)
``sum_steps max_rank / sum_steps mean_rank``.

Under ``cfm-run`` the adapter adds it to the Trainer's callbacks when ``step_log`` is set; in a
config: ``{_target_: cfm_plugins_adapters.nequip.steplog.StepLog, path: PATH}``.
"""
from __future__ import annotations

import json
import time

import lightning


class StepLog(lightning.Callback):
    def __init__(self, path: str):
        super().__init__()
        self.path = str(path)
        self._fh = None
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
        self._fh = open(f"{self.path}.rank{trainer.global_rank}.jsonl", "a")
        # training_step and validation_step call the LightningModule itself (energy and forces)
        self._handles = [pl_module.register_forward_pre_hook(self._pre), pl_module.register_forward_hook(self._post)]

    def teardown(self, trainer, pl_module, stage):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # -- records -----------------------------------------------------------------------------
    def _start(self):
        self._forward_s = 0.0
        self._t_step = time.perf_counter()

    def _write(self, trainer, stage, batch, batch_idx):
        import torch

        energies = batch.get("total_energy")
        ptr = batch.get("ptr")
        graphs = int(ptr.shape[0] - 1) if ptr is not None else (int(energies.shape[0]) if energies is not None else 0)
        rec = {
            "stage": stage, "epoch": int(trainer.current_epoch), "step": int(batch_idx), "graphs": graphs,
            "atoms": int(batch["pos"].shape[0]),
            "energies": energies.detach().flatten().to(torch.float64).tolist() if energies is not None else [],
            "forward_s": self._forward_s, "wall_s": time.perf_counter() - self._t_step,
        }
        self._fh.write(json.dumps(rec) + "\n")
        self._fh.flush()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._write(trainer, "train", batch, batch_idx)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._start()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._write(trainer, "val", batch, batch_idx)
