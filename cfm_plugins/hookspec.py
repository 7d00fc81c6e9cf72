"""The hook specifications: the contract between cfm-plugins' core, its features and adapters.

A plugin (a feature such as ``binpack``, or a trainer adapter such as ``mace``) is registered under
the entry-point group ``cfm_plugins`` and implements the hooks it needs with :data:`hookimpl`:

1. **Start-up** (``cfm-run``, before any rank talks to another): :func:`cfm_declare_options`,
   :func:`cfm_adapter_serves`, :func:`cfm_needs_adapter`, :func:`cfm_configure`.
2. **Ranks**: :func:`cfm_init_distributed`.
3. **Trainer run** (every rank): :func:`cfm_before_trainer`, :func:`cfm_trainer_settings`,
   :func:`cfm_after_trainer`.
4. **Data** (adapters, when the trainer builds its loaders): :func:`cfm_graph_sizes`,
   :func:`cfm_needs_edges`, :func:`cfm_needs_step_times`, :func:`cfm_batch_sampler`,
   :func:`cfm_batch_budget`.
5. **Model** (adapters, around building and saving it): :func:`cfm_patch_model`,
   :func:`cfm_static_forward`, :func:`cfm_unpatch_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the types of the hook arguments, for readers and type checkers only
    from cfm_plugins.config import Config
    from cfm_plugins.distributed import DistInfo
    from cfm_plugins.graph_sizes import GraphSizes
    from cfm_plugins.options import Option, TrainerSettings
    from cfm_plugins.static_shapes.forward import ModelSpec

PROJECT = "cfm_plugins"

# A plugin is a module or object. Every hook that gets ``config`` can reach the others through
# ``config.pm.hook``: the configuration carries the plugin manager, there is no process-wide
# session. ``firstresult`` hooks stop at the first plugin returning something other than ``None``.
hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- 1. start-up ---------------------------------------------------------------------------------


@hookspec
def cfm_declare_options() -> list[Option]:
    """Every option this plugin reads.

    Called for every *installed* plugin (enabled or not), so ``cfm-run --list`` shows all of
    them and a misspelled name is refused with the closest known one. The default given here is
    the only default: read values with ``config.get(name)``. Keep the module's import cheap
    (import heavy modules inside the functions that need them): listing imports every plugin.

    Returns:
        A list of :class:`cfm_plugins.options.Option` (name, type, default, help, choices).
    """


@hookspec
def cfm_adapter_serves(argv: list[str]) -> bool:
    """Whether this trainer adapter serves the trainer command ``argv``.

    ``cfm-run`` asks every installed adapter; the one that serves the command is enabled (with a
    log line) even if the user did not name it, so that several ranks always train one model
    together. Only adapters implement this.

    Args:
        argv: the trainer command; ``argv[0]`` is the program as the user typed it
            (``mace_run_train``, a path to it, ``python`` followed by a script or ``-m module``).

    Returns:
        ``True`` when this adapter serves it.
    """


@hookspec
def cfm_needs_adapter() -> bool:
    """Whether this feature works only through a trainer adapter's seams.

    ``binpack`` and ``fused`` act when an adapter calls :func:`cfm_batch_sampler` or
    :func:`cfm_patch_model`; without an adapter they would silently do nothing, so ``cfm-run``
    stops at start and names the installed adapters instead.

    Returns:
        ``True`` for such a feature.
    """


@hookspec
def cfm_configure(config: Config) -> None:
    """Check this plugin's options together, once, after the plugins are enabled and before
    ranks exist.

    Single values are already converted to their declared type and checked against their
    ``choices``; here a plugin refuses combinations.

    Args:
        config: the run's :class:`cfm_plugins.config.Config` (``config.get(name)``).

    Raises:
        ValueError: a combination of options the plugin cannot serve, saying what to change.
    """


# --- 2. ranks ------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def cfm_init_distributed(config: Config) -> DistInfo:
    """Set up the ranks and the torch.distributed process group.

    The built-in implementation (:mod:`cfm_plugins.plugins.core`, over
    :func:`cfm_plugins.distributed.init_distributed`) takes the ranks from the launcher (mpirun
    through mpi4py, srun's or torchrun's variables) and opens the rendezvous; it runs last, so a
    plugin may replace it (e.g. for a scheduler of its own). ``firstresult``: the first plugin
    returning a value wins.

    Args:
        config: the run's configuration (options ``device``, ``backend``, ``master_addr``,
            ``master_port``, ``rendezvous_interface``, ``collective_timeout``).

    Returns:
        A :class:`cfm_plugins.distributed.DistInfo` (rank, world size, device, ...).

    Raises:
        cfm_plugins.distributed.SetupError: a rank that cannot take the device asked for (the
            same error on every rank, naming the ranks and the cause).
    """


# --- 3. trainer run ------------------------------------------------------------------------------


@hookspec
def cfm_before_trainer(
    config: Config, dist: DistInfo, argv: list[str]
) -> Callable[[], None] | None:
    """Install an adapter's seams just before the trainer's entry point runs, in every rank.

    Adapters patch the trainer's loader construction, model build and distributed set-up here.
    ``cfm-run`` calls the returned callable after the trainer returned or raised, before
    :func:`cfm_after_trainer`, so an adapter keeps no state of its own between the two.

    Args:
        config: the run's configuration.
        dist: this rank's :class:`cfm_plugins.distributed.DistInfo`.
        argv: the trainer's command line (a list, modifiable in place).

    Returns:
        A callable that undoes the seams, or ``None``.
    """


@hookspec
def cfm_trainer_settings(config: Config, trainer: TrainerSettings) -> None:
    """Hand the trainer's own settings to the features, once the adapter has read them, before
    data or model.

    Args:
        config: the run's configuration.
        trainer: the trainer's batch size, seed, dtype, device and the kernel swaps it makes
            itself (:class:`cfm_plugins.options.TrainerSettings`).

    Raises:
        ValueError: a combination a feature cannot serve, saying what to change.
    """


@hookspec
def cfm_after_trainer(config: Config, dist: DistInfo, exit_code: int) -> None:
    """Called after the trainer's entry point returned (or raised), in every rank; the undo
    callables of :func:`cfm_before_trainer` have run. Features write their reports here.

    Args:
        config: the run's configuration.
        dist: this rank's :class:`cfm_plugins.distributed.DistInfo`.
        exit_code: the trainer's exit status (its ``SystemExit`` code; 1 when it raised, 130
            when interrupted).
    """


# --- 4. data -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def cfm_graph_sizes(dataset, indices, need_edges: bool) -> GraphSizes | None:
    """Graph sizes of some samples of a trainer's dataset. Adapters implement it for their
    trainer's datasets; under MPI each rank asks for its own shard only and the sampler
    gathers them. ``firstresult``.

    Args:
        dataset: the trainer's dataset object.
        indices: the samples to size (global dataset indices).
        need_edges: whether edge counts are needed (from :func:`cfm_needs_edges`); without, the
            edges may be left out where counting them is costly.

    Returns:
        A :class:`cfm_plugins.graph_sizes.GraphSizes` (atoms, edges, the indices), or ``None`` if
        this plugin does not know the dataset type.
    """


@hookspec
def cfm_needs_edges(config: Config) -> bool:
    """Whether this feature's batch sampler needs per-graph edge counts.

    Adapters pass ``any(config.pm.hook.cfm_needs_edges(config=config))`` as ``need_edges`` to
    :func:`cfm_graph_sizes`, so they never read a feature's options themselves.

    Args:
        config: the run's configuration.

    Returns:
        ``True`` when edges are needed; ``"wanted"`` when they are used where the sizes carry
        them (an adapter counts them, but a graph without edges is no error: its sizes then
        come without edges, ``None``); ``False`` when not used.
    """


@hookspec
def cfm_needs_step_times(config: Config) -> bool:
    """Whether this feature's training batch sampler needs each training step's compute time.

    ``binpack`` with ``cost=auto`` fits its cost on them. An adapter that can time its trainer's
    steps asks ``any(config.pm.hook.cfm_needs_step_times(config=config))`` when it installs its
    seams; if true it times every training step (forward + backward of this rank, without the
    waits for other ranks) and hands it to the training loader's batch sampler as
    ``batch_sampler.record_step(atoms=, edges=, graphs=, wall_s=, cpu_s=)`` (totals of the batch
    it trained; a clock it cannot take is ``None``), in step order, every step of every rank.
    It also keeps what ``batch_sampler.resume_state()`` returns beside the trainer's
    checkpoints and gives it back with ``batch_sampler.load_resume_state(state, epoch=...)``
    when the trainer resumes, so a resumed run plans the same batches.

    Args:
        config: the run's configuration.

    Returns:
        ``True`` when step times are needed.
    """


@hookspec(firstresult=True)
def cfm_batch_sampler(
    dataset, sizes: GraphSizes, config: Config, dist: DistInfo, role: str, trainer: TrainerSettings
):
    """The batch sampler to use for one of the trainer's datasets. ``firstresult``.

    The ``binpack`` feature returns a :class:`cfm_plugins.sampler.BinPackBatchSampler` sharing
    the work evenly over the ranks. Loss weighting: a training sampler whose
    ``loss_weighting`` is not ``"stock"`` gives the factors of every batch it yielded through
    ``next_loss_scale(reduction)`` (a :class:`cfm_plugins.sampler.weighting.LossScale`, in yield
    order); the adapter applies them to the trainer's per-graph and per-atom loss terms.
    Binpack asks for it only where ``trainer.loss_weightings`` offers it.

    Args:
        dataset: the trainer's dataset.
        sizes: its :class:`cfm_plugins.graph_sizes.GraphSizes` from :func:`cfm_graph_sizes` (maybe
            this rank's shard).
        config: the run's configuration.
        dist: this rank's :class:`cfm_plugins.distributed.DistInfo`.
        role: ``"train"`` (shuffled, re-packed every epoch), ``"valid"`` or ``"test"``
            (evaluation loaders, prediction included: a fixed plan, every structure exactly once
            over the ranks).
        trainer: the trainer's batch size, seed, dtype and device as the adapter read them
            (:class:`cfm_plugins.options.TrainerSettings`).

    Returns:
        A batch sampler (iterable of index lists, with ``set_epoch`` and ``len``), or ``None``
        to keep the trainer's own.

    Raises:
        ValueError: sizes the feature cannot plan with (a graph over the capacity, too few
            samples for the ranks, missing edges), saying what to change.
    """


@hookspec(firstresult=True)
def cfm_batch_budget(batch_sampler, sizes: GraphSizes, config: Config, dist: DistInfo, role: str):
    """The budget every batch of a loader is padded to. ``firstresult``.

    Called by an adapter after :func:`cfm_batch_sampler`. The ``static`` feature returns a
    :class:`cfm_plugins.static_shapes.budget.BudgetTracker` whose budget (atoms, edges, graphs)
    covers the bins of the first epochs' plans; the adapter pads each batch to
    ``tracker.fit(atoms, edges, graphs)`` with inert pad graphs (a batch over the budget raises
    it, logged, never truncated) and gives the model the real sizes beside the padded batch (see
    :func:`cfm_static_forward`).

    Args:
        batch_sampler: the loader's batch sampler (from :func:`cfm_batch_sampler`).
        sizes: the same :class:`cfm_plugins.graph_sizes.GraphSizes` (edge counts included when a
            plugin's :func:`cfm_needs_edges` asked for them).
        config: the run's configuration.
        dist: this rank's :class:`cfm_plugins.distributed.DistInfo`.
        role: ``"train"``, ``"valid"`` or ``"test"``.

    Returns:
        The tracker, or ``None`` to leave batches as they are.
    """


# --- 5. model ------------------------------------------------------------------------------------


@hookspec
def cfm_patch_model(model, config: Config):
    """Swap modules of a built model for faster ones, in place.

    Every adapter calls this where its trainer has built the model (before DDP wraps it). Swaps
    keep the state_dict (same keys, shapes and values: shared parameters), so a checkpoint loads
    with or without the plugin. The ``fused`` feature swaps the modules of the kernels in its
    ``fused_kernels`` option through the kernel table (:mod:`cfm_plugins.ops.kernel_table`); a
    kernel that finds no module in the model is reported in the log, never dropped silently.

    Args:
        model: the trainer's model (a ``torch.nn.Module``), changed in place.
        config: the run's configuration.

    Returns:
        A report of what was swapped (``fused``: a
        :class:`cfm_plugins.ops.patching.PatchReport`), or ``None``.

    Raises:
        ValueError: an unknown kernel name, or a model that is itself the module to swap
            (``fused``), saying what to do.
    """


@hookspec(firstresult=True)
def cfm_static_forward(model, config: Config, spec: ModelSpec):
    """Install the forward that runs padded batches and compiles. ``firstresult``.

    Every adapter calls this after :func:`cfm_patch_model`. The ``static`` feature installs a
    :class:`cfm_plugins.static_shapes.forward.StaticForward` as ``model.forward``, compiled per its
    ``compile`` option; :func:`cfm_unpatch_model` takes it off (before pickling).

    Args:
        model: the (patched) model, changed in place.
        config: the run's configuration.
        spec: the :class:`cfm_plugins.static_shapes.forward.ModelSpec` of the trainer's models
            (which outputs are per graph, per atom, per edge; what a model needs around a compiled
            call).

    Returns:
        The installed forward, or ``None`` where no plugin installs one.
    """


@hookspec
def cfm_unpatch_model(model, config: Config) -> None:
    """Undo :func:`cfm_patch_model` (and :func:`cfm_static_forward`) in place, before a whole
    model is pickled for users who do not have cfm-plugins installed.

    Args:
        model: the patched model; afterwards it holds the stock modules (same state_dict).
        config: the run's configuration.
    """
