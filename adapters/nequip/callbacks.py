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


class BinPackState(lightning.Callback):
    """Keeps the training sampler's resume state (the ``cost=auto`` fits) in Lightning's
    checkpoints.

    Step times cannot be measured again, so a run restarted from a checkpoint (nequip's
    ``ckpt_path``) must be given the fits of the run that wrote it to plan the same batches.
    Lightning saves a callback's non-empty ``state_dict`` in every checkpoint and gives it back
    to ``load_state_dict`` on restore, before it builds the training loader: the state waits in
    the session (``pending_resume``) and :func:`~.loader.BinPackDataLoader` hands it to the new
    sampler. Checkpoints of runs without ``cost=auto`` get nothing from this callback.

    It also keeps Lightning's count of training batches right: Lightning 2.6 counts them once,
    before the first epoch, and ends every epoch at that count, while a later epoch's plan may
    have a step more (another packing seed, or the fitted cost): without a new count its last
    steps would be dropped unseen. At every epoch start the count is that epoch's plan.
    """

    def on_train_epoch_start(self, trainer, pl_module):
        from cfm_plugins_adapters.nequip import _STATE

        session = _STATE.get("session")
        sampler = session.train_sampler if session is not None else None
        loop = trainer.fit_loop
        if (
            sampler is None
            or not isinstance(loop.max_batches, int)
            or trainer.limit_train_batches != 1.0
        ):
            return
        steps = len(sampler)
        if steps != loop.max_batches:
            loop.max_batches = steps
            if (
                isinstance(trainer.val_check_interval, float)
                and trainer.val_check_batch is not None
            ):
                trainer.val_check_batch = max(1, int(steps * trainer.val_check_interval))

    def state_dict(self):
        from cfm_plugins_adapters.nequip import _STATE

        session = _STATE.get("session")
        sampler = session.train_sampler if session is not None else None
        state = getattr(sampler, "resume_state", lambda: None)()
        return {"sampler": state} if state else {}

    def load_state_dict(self, state_dict):
        from cfm_plugins_adapters.nequip import running_session

        session = running_session("BinPackState")
        state = state_dict.get("sampler")
        sampler = session.train_sampler
        if sampler is not None and hasattr(sampler, "load_resume_state"):
            sampler.load_resume_state(state)
        else:
            session.pending_resume = state
