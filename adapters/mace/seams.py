"""Where cfm-plugins meets an unmodified ``mace_run_train`` (mace-torch 0.3.16).

``mace.cli.run_train`` imports the names its ``run(args)`` calls (``init_distributed``,
``torch_geometric``, ``configure_model``, ``DDP``, ``deepcopy``, ``get_loss_fn``,
``get_dataset_from_xyz``, ``load_dataset_for_path``) into its own namespace and looks them up at
call time, so replacing them *in that module* changes only that training run and nothing else in
mace; a few names of ``mace.tools.train`` and ``mace.data.utils`` are wrapped the same way.

:func:`install` puts the replacements in place (its docstring says what each one does) and returns
an undo callable; nothing else is changed. :func:`trainer_settings` is what the plugins are told of
mace's parsed arguments.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import types

from cfm_plugins.api import SamplerStateFile, Session, TrainerSettings, wants_step_times

#: the file beside mace's checkpoints (``<checkpoints_dir>/<name>_run-<seed><suffix>``) that keeps
#: the training sampler's resume state; mace's checkpoint names end in ``_epoch-<n>.pt``, so it
#: never reads it
STATE_SUFFIX = ".cfm-binpack.json"

log = logging.getLogger("cfm_plugins.mace")


def trainer_settings(args, given_loss=None) -> TrainerSettings:
    """What the plugins need to know of mace_run_train's parsed arguments.

    ``args.loss`` is the loss mace builds once it has made its own changes (multihead
    fine-tuning switches it to ``universal``); ``given_loss``: the ``--loss`` of the command line,
    named in the messages where mace changed it."""
    from cfm_plugins_adapters.mace.loader import LINEAR_WEIGHT_LOSSES

    swaps = tuple(name for name in ("cueq", "oeq") if getattr(args, f"enable_{name}", False))
    loss = getattr(args, "loss", None)
    label = f"mace_run_train --loss {loss}"
    if given_loss is not None and given_loss != loss:
        multihead = getattr(args, "multiheads_finetuning", False)
        why = " for --multiheads_finetuning" if multihead else ""
        label = f"mace_run_train's {loss} loss (mace's choice{why}, over --loss {given_loss})"
    return TrainerSettings(
        batch_size=args.batch_size,
        seed=args.seed,
        dtype=args.default_dtype,
        device=args.device,
        kernel_swaps=swaps,
        loss=label,
        loss_weightings=("stock", "per_sample") if loss in LINEAR_WEIGHT_LOSSES else ("stock",),
    )


#: the classes of mace's loss modules that are linear in the per-configuration weights (those
#: ``mace.tools.scripts_utils.get_loss_fn`` builds for :data:`.loader.LINEAR_WEIGHT_LOSSES`)
LINEAR_LOSS_CLASSES = (
    "WeightedEnergyForcesLoss",
    "WeightedForcesLoss",
    "WeightedEnergyForcesStressLoss",
    "WeightedEnergyForcesVirialsLoss",
)


def check_built_loss(loss_fn, weightings) -> None:
    """Refuse a loss module built after the training loader scales per-sample weights
    (``weightings``: the loss weighting of every training loader built) that is not linear in
    them: its training would be weighted by factors the loss does not read linearly."""
    from cfm_plugins.api import UsageError

    name = type(loss_fn).__name__
    if "per_sample" in weightings and name not in LINEAR_LOSS_CLASSES:
        raise UsageError(
            f"binpack loss_weighting=per_sample: mace_run_train built a {name} after its training "
            "loader was made to scale per-sample weights, and that loss is not linear in them: "
            "set loss_weighting=stock"
        )


def install(config) -> callable:
    """Replace the seams in ``mace.cli.run_train``; return a function that restores them.

    The names replaced in ``mace.cli.run_train``:

    =====================  =====================================================================
    name in run_train      what the replacement does
    =====================  =====================================================================
    ``init_distributed``   returns the ranks cfm-run already set up (MPI + process group); under
                           several ranks turns ``--distributed`` on if it was not given
    ``torch_geometric``    a stand-in whose ``dataloader.DataLoader`` builds loaders with the
                           ``cfm_batch_sampler`` (binpack) for training, validation and test;
                           with binpack's ``loss_weighting=per_sample`` the training loader
                           scales each batch's ``energy_weight``/``forces_weight``/... (see
                           :mod:`.loader`)
    ``configure_model``    calls mace's, then ``cfm_patch_model`` (fused kernels) and
                           ``cfm_static_forward`` (padded batches, compile) before DDP wraps it
    ``DDP``                DistributedDataParallel with ``device_ids=None`` for CPU models
    ``deepcopy``           the copy mace pickles as ``.model`` is un-patched
                           (``cfm_unpatch_model``): a stock model file
    ``get_loss_fn``        calls mace's; with binpack, refuses a loss not linear in the
                           per-sample weights where the training loader scales them
    =====================  =====================================================================

    The loss the plugins are told of (``cfm_trainer_settings``) is ``--loss`` when mace's
    arguments are parsed, then, before the first loader is built, the loss mace builds (multihead
    fine-tuning switches it to ``universal``): binpack decides its loss weighting on that one.
    With binpack, ``MACELoss`` in ``mace.tools.train`` (the metric ``evaluate`` makes) becomes one
    whose ``loss`` is the mean over structures, whatever the batches and ranks
    (:func:`.loader.structure_mean_metric_class`).

    Two more names in run_train check the data before training: ``get_dataset_from_xyz`` (calls
    mace's, then checks the labels of every structure read, :func:`.data_checks.check_labels`: a
    NaN in the training file stops the run) and ``load_dataset_for_path`` (at its first call, when
    mace's atomic number table is final, checks the elements of every file,
    :func:`.data_checks.check_elements`; it also ties the training AtomicData to their file and
    index, and tells each HDF5/LMDB dataset which loader it feeds, the ranks and the sizes cache's
    folders, :func:`.sizes.tag`: their data is checked where binpack reads their sizes). In
    ``mace.data.utils`` (where ``load_from_xyz`` reads the ASE files), the name ``ase`` becomes a
    stand-in whose ``io.read`` numbers the frames it reads, and ``config_from_atoms_list`` gives
    each configuration its file and index (:class:`.data_checks.Sources`).
    ``mace.tools.train.take_step`` and ``train_one_epoch`` are wrapped to check every training
    step's loss (:class:`.guard.MaceLossGuard`: stop, naming the batch's structures, or binpack's
    ``nonfinite=skip``).

    With the option ``step_log=PATH``, or when a feature needs step times (binpack's
    ``cost=auto``), ``mace.tools.train.take_step`` is wrapped to time each step (see
    :mod:`.steplog`). With binpack, ``mace.tools.train.train_one_epoch`` is wrapped to tell the
    training sampler which epoch mace trains (resumes included) and to keep its resume state (the
    ``cost=auto`` fits) in ``<checkpoints_dir>/<name>_run-<seed>.cfm-binpack.json`` beside mace's
    checkpoints (see :mod:`.loader`). With the ``static`` feature (a ``cfm_static_forward`` hook),
    the loaders pad their batches (``cfm_batch_budget``) and the model is built without e3nn's
    TorchScript code generation (dynamo cannot trace TorchScript; see
    :mod:`cfm_plugins.static_shapes.mace`).
    """
    import mace.cli.run_train as rt

    from cfm_plugins.api import installed_static_forward, is_patched

    saved = {
        name: getattr(rt, name)
        for name in (
            "init_distributed",
            "torch_geometric",
            "configure_model",
            "DDP",
            "deepcopy",
            "get_dataset_from_xyz",
            "load_dataset_for_path",
            "get_loss_fn",
        )
    }
    stock_init, stock_tg, stock_configure, stock_ddp = (
        saved["init_distributed"],
        saved["torch_geometric"],
        saved["configure_model"],
        saved["DDP"],
    )
    state = Session(config)
    hook, dist = state.hook, state.dist
    static = bool(hook.cfm_static_forward.get_hookimpls())
    r_max = []  # mace's --r_max, once parsed: pad edges are twice as long
    resume = {}  # the sampler state file beside mace's checkpoints, known once mace's arguments are
    parsed = {}  # mace's parsed arguments, once init_distributed has them

    def init_distributed(args):
        state.trainer = trainer_settings(args)
        parsed["loss"] = getattr(args, "loss", None)
        r_max.append(float(args.r_max))
        parsed["args"] = args
        resume["file"] = SamplerStateFile(
            os.path.join(args.checkpoints_dir, f"{args.name}_run-{args.seed}{STATE_SUFFIX}"),
            dist.rank,
        )
        hook.cfm_trainer_settings(config=config, trainer=state.trainer)
        if dist.world_size == 1:
            return stock_init(args)
        if args.device != dist.device_type:
            raise ValueError(
                f"mace_run_train --device {args.device} but cfm-run set up the ranks for "
                f"{dist.device}: pass `cfm-run --device {args.device}` too"
            )
        if not args.distributed:
            log.info(
                "%d ranks: turning on mace's --distributed (each rank trains on its share)",
                dist.world_size,
            )
            args.distributed = True
        # mace selects the GPU (and DDP's device) by the local rank it gets here: give it ours
        return (
            dist.rank,
            dist.device_index if dist.device_type == "cuda" else dist.local_rank,
            dist.world_size,
        )

    loader_factory = undo_epochs = None
    if hook.cfm_batch_sampler.get_hookimpls():  # a feature offers batch samplers (binpack)
        from cfm_plugins_adapters.mace.loader import follow_mace_epochs, make_dataloader_factory

        loader_factory = make_dataloader_factory(
            stock_tg.dataloader.DataLoader, state, pad_distance=lambda: 2.0 * max(r_max[-1], 1.0)
        )
        undo_epochs = follow_mace_epochs(state, lambda: resume.get("file"))

    def settle_loss():
        """Once mace has made its own changes to ``args.loss`` (it does before building any loader
        or loss), give the features the loss it builds (binpack checks its loss weighting again:
        an explicit per_sample on a loss it cannot scale is an error, the default falls back)."""
        args = parsed.get("args")
        if args is None or parsed.get("loss settled") == getattr(args, "loss", None):
            return
        parsed["loss settled"] = getattr(args, "loss", None)
        settled = trainer_settings(args, parsed.get("loss"))
        if (settled.loss_weightings, settled.loss) != (
            state.trainer.loss_weightings,
            state.trainer.loss,
        ):
            state.trainer = dataclasses.replace(
                state.trainer, loss=settled.loss, loss_weightings=settled.loss_weightings
            )
            hook.cfm_trainer_settings(config=config, trainer=state.trainer)

    def DataLoader(*args, **kwargs):
        settle_loss()
        return loader_factory(*args, **kwargs)

    tg = (
        types.SimpleNamespace(
            dataloader=types.SimpleNamespace(DataLoader=DataLoader), __wrapped__=stock_tg
        )
        if loader_factory
        else stock_tg
    )
    undo_metric = None
    if loader_factory is not None:  # binpack: the validation loss does not depend on its batches
        from cfm_plugins_adapters.mace.loader import use_structure_mean_loss

        undo_metric = use_structure_mean_loss()
    stock_get_loss_fn = saved["get_loss_fn"]

    def get_loss_fn(*args, **kwargs):
        settle_loss()
        loss_fn = stock_get_loss_fn(*args, **kwargs)
        if loader_factory is not None:
            check_built_loss(loss_fn, loader_factory.training_weightings)
        return loss_fn

    import importlib

    # the module (mace.tools.train is also a function): the step timer and the loss guard wrap it
    mace_train = importlib.import_module("mace.tools.train")
    recorder = None
    if config.get("step_log") or wants_step_times(config):
        from cfm_plugins_adapters.mace.steplog import StepRecorder

        recorder = StepRecorder(
            state, config.get("step_log", type=str) if config.get("step_log") else None
        )
        saved_take_step = mace_train.take_step
        mace_train.take_step = recorder.wrap_take_step(saved_take_step)

    # the data: structures numbered by file, labels and elements checked before training
    import mace.data.utils as mace_data_utils

    from cfm_plugins_adapters.mace import data_checks
    from cfm_plugins_adapters.mace.guard import MaceLossGuard

    sources = data_checks.Sources()
    saved_utils = {
        name: getattr(mace_data_utils, name) for name in ("ase", "config_from_atoms_list")
    }
    mace_data_utils.ase = sources.ase_proxy(saved_utils["ase"])
    mace_data_utils.config_from_atoms_list = sources.wrap_configs(
        saved_utils["config_from_atoms_list"]
    )
    heads = []  # (collections, files) of every head, as mace loaded them
    stock_get_dataset, stock_load_dataset = (
        saved["get_dataset_from_xyz"],
        saved["load_dataset_for_path"],
    )

    def get_dataset_from_xyz(*args, **kwargs):
        collections, atomic_energies = stock_get_dataset(*args, **kwargs)

        def names(key):
            paths = kwargs.get(key)
            paths = [paths] if isinstance(paths, str) else list(paths or [])
            return ", ".join(str(p) for p in paths) or None

        files = {
            "train": names("train_path") or "the training file",
            "valid": names("valid_path") or f"the validation split of {names('train_path')}",
            "test": names("test_path") or "the test file",
        }
        data_checks.check_labels(collections, files, atomic_energies)
        heads.append((collections, files))
        return collections, atomic_energies

    def load_dataset_for_path(*args, **kwargs):
        # the first call: mace's atomic number table is final
        if not parsed.get("elements checked"):
            parsed["elements checked"] = True
            z_table = kwargs.get("z_table", args[2] if len(args) > 2 else None)
            margs = parsed.get("args")
            if z_table is not None:
                data_checks.check_elements(
                    heads,
                    z_table.zs,
                    getattr(margs, "test_dir", None),
                    bool(getattr(margs, "multi_processed_test", False)),
                )
        out = stock_load_dataset(*args, **kwargs)
        sources.register_dataset(out, kwargs.get("collection"))
        # HDF5/LMDB data: checked where the loaders read its sizes (which loader, the ranks, the
        # sizes cache's folders)
        from cfm_plugins_adapters.mace import sizes as mace_sizes

        path = kwargs.get("file_path", args[0] if args else None)
        head = kwargs.get("head_config")
        role = next(
            (
                r
                for r, key in (("train", "train_file"), ("valid", "valid_file"))
                if path in (getattr(head, key, None) or [])
            ),
            "test",
        )
        margs = parsed.get("args")
        dirs = mace_sizes.cache_dirs(getattr(margs, "work_dir", None))
        mace_sizes.tag(out, role, dist, dirs)
        return out

    # non-finite training losses: stop (naming the batch's structures) or skip (binpack)
    loss_guard = MaceLossGuard(config, dist, sources)
    guarded = {name: getattr(mace_train, name) for name in ("take_step", "train_one_epoch")}
    mace_train.take_step = loss_guard.wrap_take_step(guarded["take_step"])
    mace_train.train_one_epoch = loss_guard.wrap_train_one_epoch(guarded["train_one_epoch"])

    def configure_model(*args, **kwargs):
        if not static:
            model, output_args = stock_configure(*args, **kwargs)
            hook.cfm_patch_model(model=model, config=config)
        else:
            from cfm_plugins.api import MACE_SPEC, e3nn_codegen_off, without_torchscript

            with e3nn_codegen_off():
                model, output_args = stock_configure(*args, **kwargs)
            model = without_torchscript(model)
            hook.cfm_patch_model(model=model, config=config)
            hook.cfm_static_forward(model=model, config=config, spec=MACE_SPEC)
        if recorder is not None:
            recorder.attach(model)
        return model, output_args

    def DDP(module, device_ids=None, **kwargs):
        on_cpu = next(module.parameters()).device.type == "cpu"
        ddp = stock_ddp(module, device_ids=None if on_cpu else device_ids, **kwargs)
        if recorder is not None:
            recorder.attach_ddp(ddp)
        return ddp

    def deepcopy(obj, memo=None):
        out = copy.deepcopy(obj, memo)
        if hasattr(out, "modules"):
            if recorder is not None:
                recorder.detach_copy(out)
            if is_patched(out) or installed_static_forward(out) is not None:
                hook.cfm_unpatch_model(model=out, config=config)
        return out

    for name, value in dict(
        init_distributed=init_distributed,
        torch_geometric=tg,
        configure_model=configure_model,
        DDP=DDP,
        deepcopy=deepcopy,
        get_dataset_from_xyz=get_dataset_from_xyz,
        load_dataset_for_path=load_dataset_for_path,
        get_loss_fn=get_loss_fn,
    ).items():
        setattr(rt, name, value)

    def undo():
        for name, value in guarded.items():  # wrapped last: undone first
            setattr(mace_train, name, value)
        for name, value in saved_utils.items():
            setattr(mace_data_utils, name, value)
        loss_guard.report()
        sources.clear()
        for name, value in saved.items():
            setattr(rt, name, value)
        if recorder is not None:
            mace_train.take_step = saved_take_step
        if undo_epochs is not None:
            undo_epochs()
        if undo_metric is not None:
            undo_metric()

    return undo
