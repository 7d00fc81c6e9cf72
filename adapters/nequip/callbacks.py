"""Lightning callbacks the nequip adapter adds to nequip-train's Trainer."""
from __future__ import annotations

import lightning


class FuseOnSetup(lightning.Callback):
    """Fuse the LightningModule's ``TensorProductScatter`` modules when the Trainer sets up.

    ``setup`` runs for every stage (fit, validate, test), after the LightningModule was built or
    restored from a checkpoint (``ckpt_path`` restarts too) and before DDP wraps it and the
    optimizers are made, so the swap (same parameters, same state_dict) is what trains.
    """

    def setup(self, trainer, pl_module, stage):
        from cfm_plugins_adapters.nequip.modifier import fuse

        fuse(pl_module)
