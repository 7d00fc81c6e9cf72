"""Where cfm-plugins meets HydraGNN (3.0 from PyPI, or its source with the MACE stack) without
forking it.

A HydraGNN training script (HydraGNN's examples, ``hydragnn.run_training``) calls the HydraGNN
functions this adapter replaces: ``setup_ddp`` (the ranks cfm-run set up), ``create_dataloaders``
(binpack loaders), ``get_distributed_model`` (patching, loss weighting, the non-finite loss
check, the step timer), ``save_model`` and ``load_existing_model`` (the sampler's resume state).
Each is replaced in every ``hydragnn`` module that holds it (3.0's ``hydragnn.utils`` and the
source's ``hydragnn.utils.distributed`` package re-export them by value), for this run only.
:func:`install` says what each replacement does, puts everything in place and returns an undo
callable.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from cfm_plugins.api import SamplerStateFile, wants_step_times

log = logging.getLogger("cfm_plugins.hydragnn")

#: HydraGNN's tracer module: 3.0 has it in ``hydragnn.utils``, the source in
# ``profiling_and_tracing``
TRACER_MODULES = ("hydragnn.utils.profiling_and_tracing.tracer", "hydragnn.utils.tracer")


def tracer_module():
    """HydraGNN's tracer module (start/stop regions and ``__tracer_list__``) of the installed
    version."""
    for name in TRACER_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        f"HydraGNN has none of the tracer modules {', '.join(TRACER_MODULES)}: "
        "step_log needs HydraGNN's tracer"
    )


def _holders(name: str, stock) -> list:
    """Every loaded hydragnn module that holds ``stock`` under ``name``."""
    return [
        m
        for modname, m in list(sys.modules.items())
        if m is not None
        and (modname == "hydragnn" or modname.startswith("hydragnn."))
        and getattr(m, name, None) is stock
    ]


def make_setup_ddp(stock, dist):
    def setup_ddp(*args, **kwargs):
        import torch.distributed as tdist

        if dist.world_size == 1:
            return stock(*args, **kwargs)
        if not tdist.is_initialized():
            raise RuntimeError(
                f"cfm-run set up {dist.world_size} ranks but torch.distributed is not "
                "initialised: was the process group destroyed before HydraGNN's setup_ddp?"
            )
        log.info(
            "HydraGNN setup_ddp: using cfm-run's process group (%s at %s:%s), rank %d of %d",
            dist.backend,
            dist.master_addr,
            dist.master_port,
            dist.rank,
            dist.world_size,
        )
        return dist.world_size, dist.rank

    setup_ddp.__wrapped__ = stock
    return setup_ddp


def make_get_distributed_model(stock, session, tracer, scales=None, guard=None):
    def get_distributed_model(model, *args, **kwargs):
        # fused: the kernel table finds MACE-style modules by their layout, whatever HydraGNN calls
        # them; a stack without any is reported once by the fused plugin, and trains with its own
        # layers
        session.hook.cfm_patch_model(model=model, config=session.config)
        if scales is not None and scales.sampler is not None:
            scales.wrap_loss(model)
        if guard is not None:  # after the weighting: the loss HydraGNN's backward takes
            guard.wrap_loss(model)
        ddp = stock(model, *args, **kwargs)
        if tracer is not None and hasattr(ddp, "register_comm_hook"):
            tracer.attach(ddp)
        return ddp

    get_distributed_model.__wrapped__ = stock
    return get_distributed_model


STATE_SUFFIX = ".cfm-binpack.json"


def make_save_model(stock, session, files, guard=None):
    """HydraGNN's ``save_model(model, optimizer, name, path="./logs/")`` that first reads every
    training loss not read yet (``guard``: a non-finite one stops the run before the file is
    written) and also keeps the training sampler's resume state beside the checkpoint (rank 0,
    when it changed)."""

    def save_model(model, optimizer, name, path="./logs/", *args, **kwargs):
        if guard is not None:
            guard.before_checkpoint()
        out = stock(model, optimizer, name, path, *args, **kwargs)
        if session.train_sampler is not None:
            keeper = files.setdefault(
                state_path(path, name), SamplerStateFile(state_path(path, name), session.dist.rank)
            )
            keeper.save(session.train_sampler)
        return out

    save_model.__wrapped__ = stock
    return save_model


def make_load_existing_model(stock, session):
    """HydraGNN's ``load_existing_model(model, model_name, path="./logs/", optimizer=None)`` that
    also gives the training sampler the fits saved with that checkpoint, applying from epoch 0."""

    def load_existing_model(model, model_name, path="./logs/", *args, **kwargs):
        out = stock(model, model_name, path, *args, **kwargs)
        sampler = session.train_sampler
        if sampler is not None:
            SamplerStateFile(state_path(path, model_name), session.dist.rank).load(
                sampler, restart_at_zero=True
            )
        elif os.path.exists(state_path(path, model_name)):
            log.warning(
                "load_existing_model(%r) before the loaders were made: the saved cost=auto fits "
                "are not used (make the loaders first, as hydragnn.run_training does)",
                model_name,
            )
        return out

    load_existing_model.__wrapped__ = stock
    return load_existing_model


def state_path(path: str, name: str) -> str:
    return os.path.join(path, name, name + STATE_SUFFIX)


def install(session) -> callable:
    """Replace the seams in the hydragnn modules; return a function that restores them.

    - ``setup_ddp``: returns the ranks cfm-run set up (MPI ranks, torch.distributed rendezvous):
      HydraGNN's own would re-point ``MASTER_ADDR``/``PORT`` at 127.0.0.1:8889 and read the
      scheduler's variables;
    - ``create_dataloaders``: train/validation/test loaders over the ``cfm_batch_sampler``
      (binpack) with costs from the PyG graphs (see :mod:`.loader`);
    - ``get_distributed_model``: ``cfm_patch_model`` (with ``fused``: MACE-style modules found by
      their layout are swapped, HydraGNN's MACE interaction blocks whole, :mod:`.interaction`; or
      the plugin says once that the stack has none); with binpack's
      ``loss_weighting=per_sample``: scales each head's loss per training batch (see
      :mod:`.weighting`); checks each training loss is finite (``nonfinite``, :mod:`.guard`);
      then HydraGNN's DDP wrapping; with ``step_log=PATH`` or ``cost=auto``: a
      :class:`~.steplog.StepTracer` joins HydraGNN's tracer list (see :mod:`.steplog`). The
      source's ``distributed_model_wrapper`` calls it too;
    - ``save_model``: every training loss not yet read is checked first (a non-finite one stops
      the run before the file, :mod:`.guard`); HydraGNN's checkpoint (``logs/NAME/NAME.pk``);
      binpack: then the training sampler's resume state beside it (``NAME.cfm-binpack.json``: the
      ``cost=auto`` fits);
    - ``load_existing_model``: binpack: HydraGNN's ``Training.continue``/``startfrom``, then the
      saved fits of the run continued from: HydraGNN 3.0 counts epochs from 0 again, so the last
      fit plans from epoch 0 (no new calibration epoch)."""
    import hydragnn  # noqa: F401  (loads every module that re-exports the seams)
    import hydragnn.preprocess.load_data as load_data
    import hydragnn.utils.distributed as hdist
    import hydragnn.utils.model as hmodel

    config, dist = session.config, session.dist
    stock = {
        "setup_ddp": hdist.setup_ddp,
        "get_distributed_model": hdist.get_distributed_model,
        "create_dataloaders": load_data.create_dataloaders,
        "save_model": hmodel.save_model,
        "load_existing_model": hmodel.load_existing_model,
    }

    tracer = None
    if config.get("step_log") or wants_step_times(config):
        from cfm_plugins_adapters.hydragnn.steplog import StepTracer

        tr = tracer_module()
        tracer = StepTracer(
            config.get("step_log", type=str) if config.get("step_log") else None, dist.rank, session
        )
        tr.__tracer_list__["cfm_plugins.StepTracer"] = tracer

    if config.is_enabled("fused"):
        from cfm_plugins_adapters.hydragnn.interaction import register_form

        # HydraGNN's MACE interaction blocks: product and scatter fused (see .interaction)
        register_form()
    from cfm_plugins_adapters.hydragnn.guard import HydraLossGuard
    from cfm_plugins_adapters.hydragnn.weighting import TrainingScales

    # from the training loader to the loss, with loss_weighting=per_sample
    scales = TrainingScales()
    guard = HydraLossGuard(config, dist)  # non-finite training losses (binpack: named)
    replacement = {
        "setup_ddp": make_setup_ddp(stock["setup_ddp"], dist),
        "get_distributed_model": make_get_distributed_model(
            stock["get_distributed_model"], session, tracer, scales, guard
        ),
        "save_model": make_save_model(stock["save_model"], session, {}, guard),
    }
    if config.is_enabled("binpack"):
        from cfm_plugins_adapters.hydragnn.loader import make_create_dataloaders

        replacement["create_dataloaders"] = make_create_dataloaders(
            stock["create_dataloaders"], load_data.DataLoader, session, scales, guard
        )
        replacement["load_existing_model"] = make_load_existing_model(
            stock["load_existing_model"], session
        )
    done = []
    for name, new in replacement.items():
        for module in _holders(name, stock[name]):
            setattr(module, name, new)
            done.append((module, name, stock[name]))
    log.debug(
        "hydragnn seams installed: %s", ", ".join(sorted({f"{m.__name__}.{n}" for m, n, _ in done}))
    )

    def undo():
        guard.close()
        for module, name, value in done:
            setattr(module, name, value)
        if tracer is not None:
            tr.__tracer_list__.pop("cfm_plugins.StepTracer", None)

    return undo
