"""Where cfm-plugins meets an unmodified ``mace_run_train`` (mace-torch 0.3.16).

``mace.cli.run_train`` imports these names into its own namespace and looks them up when
``run(args)`` calls them, so replacing them *in that module* changes only that training run
and nothing else in mace:

=====================  =========================================================================
name in run_train      what the replacement does
=====================  =========================================================================
``init_distributed``   returns the ranks cfm-run already set up (MPI + process group); under
                       several ranks turns ``--distributed`` on if it was not given
``torch_geometric``    a stand-in whose ``dataloader.DataLoader`` builds loaders with the
                       ``cfm_batch_sampler`` (binpack) for training, validation and test;
                       with binpack's ``loss_weighting=per_sample`` the training loader scales
                       each batch's ``energy_weight``/``forces_weight``/... (see :mod:`.loader`)
``configure_model``    calls mace's, then ``cfm_patch_model`` (fused kernels) before DDP wraps it
``DDP``                DistributedDataParallel with ``device_ids=None`` for CPU models
``deepcopy``           the copy mace pickles as ``.model`` is un-patched: a stock model file
=====================  =========================================================================

With the option ``step_log=PATH``, ``mace.tools.train.take_step`` is wrapped to record each
step (see :mod:`.steplog`). With binpack, ``mace.tools.train.train_one_epoch`` is wrapped to
tell the training sampler which epoch mace trains (resumes included, see :mod:`.loader`).

:func:`install` puts them in place and returns an undo callable; nothing else is changed.
"""
from __future__ import annotations

import copy
import logging
import types

from cfm_plugins.manager import Session
from cfm_plugins.options import TrainerSettings

log = logging.getLogger("cfm_plugins.mace")


def trainer_settings(args) -> TrainerSettings:
    """What the plugins need to know of mace_run_train's parsed arguments."""
    from cfm_plugins_adapters.mace.loader import LINEAR_WEIGHT_LOSSES

    swaps = tuple(name for name in ("cueq", "oeq") if getattr(args, f"enable_{name}", False))
    loss = getattr(args, "loss", None)
    return TrainerSettings(batch_size=args.batch_size, seed=args.seed, dtype=args.default_dtype,
                           device=args.device, kernel_swaps=swaps, loss=f"mace_run_train --loss {loss}",
                           loss_weightings=("stock", "per_sample") if loss in LINEAR_WEIGHT_LOSSES else ("stock",))


def install(config) -> callable:
    """Replace the seams in ``mace.cli.run_train``; return a function that restores them."""
    import mace.cli.run_train as rt

    from cfm_plugins.ops.patching import is_patched

    saved = {name: getattr(rt, name) for name in ("init_distributed", "torch_geometric", "configure_model", "DDP", "deepcopy")}
    stock_init, stock_tg, stock_configure, stock_ddp = (
        saved["init_distributed"], saved["torch_geometric"], saved["configure_model"], saved["DDP"])
    state = Session(config)
    hook, dist = state.hook, state.dist

    def init_distributed(args):
        state.trainer = trainer_settings(args)
        hook.cfm_trainer_settings(config=config, trainer=state.trainer)
        if dist.world_size == 1:
            return stock_init(args)
        if args.device != dist.device_type:
            raise ValueError(f"mace_run_train --device {args.device} but cfm-run set up the ranks for {dist.device}: "
                             f"pass `cfm-run --device {args.device}` too")
        if not args.distributed:
            log.info("%d MPI ranks: turning on mace's --distributed (each rank trains on its share)", dist.world_size)
            args.distributed = True
        # mace selects the GPU (and DDP's device) by the local rank it gets here: give it ours
        return dist.rank, dist.device_index if dist.device_type == "cuda" else dist.local_rank, dist.world_size

    loader_factory = undo_epochs = None
    if hook.cfm_batch_sampler.get_hookimpls():  # a feature offers batch samplers (binpack)
        from cfm_plugins_adapters.mace.loader import follow_mace_epochs, make_dataloader_factory

        loader_factory = make_dataloader_factory(stock_tg.dataloader.DataLoader, state)
        undo_epochs = follow_mace_epochs()
    tg = types.SimpleNamespace(dataloader=types.SimpleNamespace(DataLoader=loader_factory), __wrapped__=stock_tg) \
        if loader_factory else stock_tg

    step_log = None
    if config.get("step_log"):
        import importlib

        mace_train = importlib.import_module("mace.tools.train")  # the module (mace.tools.train is also a function)

        from cfm_plugins_adapters.mace.steplog import StepLog

        step_log = StepLog(config.get("step_log", type=str), dist.rank)
        saved_take_step = mace_train.take_step
        mace_train.take_step = step_log.wrap_take_step(saved_take_step)

    def configure_model(*args, **kwargs):
        model, output_args = stock_configure(*args, **kwargs)
        hook.cfm_patch_model(model=model, config=config)
        if step_log is not None:
            step_log.attach(model)
        return model, output_args

    def DDP(module, device_ids=None, **kwargs):
        on_cpu = next(module.parameters()).device.type == "cpu"
        return stock_ddp(module, device_ids=None if on_cpu else device_ids, **kwargs)

    def deepcopy(obj, memo=None):
        out = copy.deepcopy(obj, memo)
        if hasattr(out, "modules"):
            if step_log is not None:
                step_log.detach_copy(out)
            if is_patched(out):
                hook.cfm_unpatch_model(model=out, config=config)
        return out

    for name, value in dict(init_distributed=init_distributed, torch_geometric=tg,
                            configure_model=configure_model, DDP=DDP, deepcopy=deepcopy).items():
        setattr(rt, name, value)

    def undo():
        for name, value in saved.items():
            setattr(rt, name, value)
        if step_log is not None:
            mace_train.take_step = saved_take_step
        if undo_epochs is not None:
            undo_epochs()

    return undo
