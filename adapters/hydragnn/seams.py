"""Where cfm-plugins meets HydraGNN 3.0 without forking it.

A HydraGNN training script (HydraGNN's examples, ``hydragnn.run_training``) calls three HydraGNN
functions that decide what this adapter changes. Each is replaced in every ``hydragnn`` module
that holds it (``hydragnn.utils`` re-exports them by value), for this run only:

=========================  =====================================================================
HydraGNN function          what the replacement does
=========================  =====================================================================
``setup_ddp``              returns the ranks cfm-run set up (MPI ranks, torch.distributed
                           rendezvous): HydraGNN's own would re-point ``MASTER_ADDR``/``PORT``
                           at 127.0.0.1:8889 and read the scheduler's variables
``create_dataloaders``     train/validation/test loaders over the ``cfm_batch_sampler``
                           (binpack) with costs from the PyG graphs (see :mod:`.loader`)
``get_distributed_model``  ``cfm_patch_model`` (with ``fused``: MACE-style modules found by
                           their layout are swapped, or the plugin says once that the stack has
                           none); with binpack's ``loss_weighting=per_sample``: scales each
                           head's loss per training batch (see :mod:`.weighting`); then
                           HydraGNN's DDP wrapping; with ``step_log``: attaches the step timer
                           (see :mod:`.steplog`)
=========================  =====================================================================

With ``step_log=PATH`` a :class:`~.steplog.StepTracer` joins HydraGNN's tracer list.
:func:`install` puts everything in place and returns an undo callable.
"""
from __future__ import annotations

import logging
import sys

log = logging.getLogger("cfm_plugins.hydragnn")

def _holders(name: str, stock) -> list:
    """Every loaded hydragnn module that holds ``stock`` under ``name``."""
    return [m for modname, m in list(sys.modules.items())
            if m is not None and (modname == "hydragnn" or modname.startswith("hydragnn."))
            and getattr(m, name, None) is stock]


def make_setup_ddp(stock, dist):
    def setup_ddp(*args, **kwargs):
        import torch.distributed as tdist

        if dist.world_size == 1:
            return stock(*args, **kwargs)
        if not tdist.is_initialized():
            raise RuntimeError("cfm-run set up %d MPI ranks but torch.distributed is not initialised: was the "
                               "process group destroyed before HydraGNN's setup_ddp?" % dist.world_size)
        log.info("HydraGNN setup_ddp: using cfm-run's process group (%s at %s:%s), rank %d of %d",
                 dist.backend, dist.master_addr, dist.master_port, dist.rank, dist.world_size)
        return dist.world_size, dist.rank

    setup_ddp.__wrapped__ = stock
    return setup_ddp


def make_get_distributed_model(stock, session, tracer, scales=None):
    def get_distributed_model(model, *args, **kwargs):
        # fused: the kernel table finds MACE-style modules by their layout, whatever HydraGNN calls them;
        # a stack without any is reported once by the fused plugin, and trains with its own layers
        session.hook.cfm_patch_model(model=model, config=session.config)
        if scales is not None and scales.sampler is not None:
            scales.wrap_loss(model)
        ddp = stock(model, *args, **kwargs)
        if tracer is not None and hasattr(ddp, "register_comm_hook"):
            tracer.attach(ddp)
        return ddp

    get_distributed_model.__wrapped__ = stock
    return get_distributed_model


def install(session) -> callable:
    """Replace the seams in the hydragnn modules; return a function that restores them."""
    import hydragnn  # noqa: F401  (loads every module that re-exports the seams)
    import hydragnn.preprocess.load_data as load_data
    import hydragnn.utils.distributed as hdist
    import hydragnn.utils.tracer as tr

    config, dist = session.config, session.dist
    stock = {"setup_ddp": hdist.setup_ddp, "get_distributed_model": hdist.get_distributed_model,
             "create_dataloaders": load_data.create_dataloaders}

    tracer = None
    if config.get("step_log"):
        from cfm_plugins_adapters.hydragnn.steplog import StepTracer

        tracer = StepTracer(config.get("step_log", type=str), dist.rank)
        tr.__tracer_list__["cfm_plugins.StepTracer"] = tracer

    from cfm_plugins_adapters.hydragnn.weighting import TrainingScales

    scales = TrainingScales()  # from the training loader to the loss, with loss_weighting=per_sample
    replacement = {
        "setup_ddp": make_setup_ddp(stock["setup_ddp"], dist),
        "get_distributed_model": make_get_distributed_model(stock["get_distributed_model"], session, tracer,
                                                            scales),
    }
    if config.is_enabled("binpack"):
        from cfm_plugins_adapters.hydragnn.loader import make_create_dataloaders

        replacement["create_dataloaders"] = make_create_dataloaders(stock["create_dataloaders"],
                                                                    load_data.DataLoader, session, scales)
    done = []
    for name, new in replacement.items():
        for module in _holders(name, stock[name]):
            setattr(module, name, new)
            done.append((module, name, stock[name]))
    log.debug("hydragnn seams installed: %s", ", ".join(sorted({f"{m.__name__}.{n}" for m, n, _ in done})))

    def undo():
        for module, name, value in done:
            setattr(module, name, value)
        if tracer is not None:
            tr.__tracer_list__.pop("cfm_plugins.StepTracer", None)

    return undo
