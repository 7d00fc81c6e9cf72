"""Lightning callbacks that the NequIP tests put into a nequip-train config (``_target_``);
import only where lightning is installed (.venv-nequip)."""

from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class KillAtEpoch(Callback):
    """Kill this process with SIGKILL when epoch ``epoch`` starts, as a scheduler or the OOM killer
    ends a run: nothing of Lightning's own clean-up runs, only what was written before stays."""

    def __init__(self, epoch: int):
        self.epoch = int(epoch)

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)
