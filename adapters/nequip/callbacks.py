"""Lightning callbacks the nequip adapter adds to nequip-train's Trainer."""
from __future__ import annotations

import lightning


class FuseOnSetup(lightning.Callback):
    """Ask ``cfm_patch_model`` (the ``fused`` plugin) to swap the LightningModule's modules when the
    Trainer sets up (nequip's ``TensorProductScatter`` through the form the adapter registers).

    ``setup`` runs for every stage (fit, validate, test), after the LightningModule was built or
    restored from a checkpoint (``ckpt_path`` restarts too) and before DDP wraps it and the
    optimizers are made, so the swap (same parameters, same state_dict) is what trains.
    """

    def setup(self, trainer, pl_module, stage):
        from cfm_plugins_adapters.nequip import running_session
        from cfm_plugins_adapters.nequip.modifier import register_form

        session = running_session("FuseOnSetup")
        register_form()
        session.hook.cfm_patch_model(model=pl_module, config=session.config)
