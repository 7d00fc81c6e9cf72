"""The hook specifications: the contract between cfm-plugins' core, its features and adapters.

Every plugin (a feature such as ``binpack`` or ``fused``, or a trainer adapter such as ``mace``)
is a module or object registered under the entry-point group ``cfm_plugins`` that implements some
of these hooks with :data:`hookimpl`. A plugin that does not care about a hook does not implement
it. The hooks are grouped by the phase of a run in which they are called:

1. **Start-up** (in ``cfm-run``, before any rank talks to another): :func:`cfm_declare_options`,
   :func:`cfm_adapter_serves`, :func:`cfm_needs_adapter`, :func:`cfm_configure`.
2. **Ranks**: :func:`cfm_init_distributed`.
3. **Trainer run** (every rank): :func:`cfm_before_trainer`, :func:`cfm_trainer_settings`,
   :func:`cfm_after_trainer`.
4. **Data** (called by adapters when the trainer builds its loaders): :func:`cfm_graph_sizes`,
   :func:`cfm_needs_edges`, :func:`cfm_needs_step_times`, :func:`cfm_batch_sampler`,
   :func:`cfm_batch_budget`.
5. **Model** (called by adapters around model construction and saving): :func:`cfm_patch_model`,
   :func:`cfm_static_forward`, :func:`cfm_unpatch_model`.

Every hook that gets ``config`` can reach the others through ``config.pm.hook``: the
configuration carries the plugin manager, there is no process-wide session.
``firstresult`` hooks stop at the first plugin returning something other than ``None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # the types of the hook arguments, for readers and type checkers only
    from cfm_plugins.config import Config
    from cfm_plugins.distributed import DistInfo
    from cfm_plugins.options import Option, TrainerSettings
    from cfm_plugins.sizes import GraphSizes
    from cfm_plugins.static.forward import ModelSpec

PROJECT = "cfm_plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


# --- 1. start-up ---------------------------------------------------------------------------------


@hookspec
def cfm_declare_options() -> list[Option]:
    """Every option this plugin reads, as :class:`cfm_plugins.options.Option` objects.

    Called for every *installed* plugin (enabled or not), so ``cfm-run --list`` shows all of
    them and a misspelled name is refused with the closest known one. The default given here is
    the only default: read values with ``config.get(name)``. Import ``Option`` inside the
    function so that listing plugins stays cheap.
    """


@hookspec
def cfm_adapter_serves(argv: list[str]) -> bool:
    """True when this trainer adapter serves the trainer command ``argv``.

    ``argv[0]`` is the program as the user typed it (``mace_run_train``, a path to it,
    ``python`` followed by a script or ``-m module``). ``cfm-run`` asks every installed adapter;
    the one that serves the command is enabled (with a log line) even if the user did not name
    it, so that several ranks always train one model together. Only adapters implement this.
    """


@hookspec
def cfm_needs_adapter() -> bool:
    """True when this feature works only through a trainer adapter's seams.

    ``binpack`` and ``fused`` act when an adapter calls :func:`cfm_batch_sampler` or
    :func:`cfm_patch_model`; without an adapter they would silently do nothing, so ``cfm-run``
    stops at start and names the installed adapters instead.
    """


@hookspec
def cfm_configure(config: Config) -> None:
    """Called once after the plugins are enabled and the options checked, before ranks exist.

    ``config`` is the :class:`cfm_plugins.config.Config`. A plugin validates combinations of its
    options here (raise ``ValueError`` with a clear message). Single values are already converted
    to their declared type and checked against their ``choices``.
    """


# --- 2. ranks ------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def cfm_init_distributed(config: Config) -> DistInfo:
    """Set up ranks and the torch.distributed process group.

    Returns a :class:`cfm_plugins.distributed.DistInfo` (rank, world size, device, ...). The
    built-in implementation (``cfm_plugins.distributed``) uses MPI through mpi4py and a rendezvous
    that rank 0 opens and broadcasts; a plugin may replace it (e.g. for a scheduler of its own).
    """


# --- 3. trainer run ------------------------------------------------------------------------------


@hookspec
def cfm_before_trainer(
    config: Config, dist: DistInfo, argv: list[str]
) -> Callable[[], None] | None:
    """Called just before the trainer's entry point runs, in every rank.

    Adapters install their seams here (patch the trainer's loader construction, model build,
    distributed set-up) and return a callable that undoes them: cfm-run calls it after the
    trainer returned or raised, before :func:`cfm_after_trainer`, so an adapter keeps no state of
    its own between the two. ``argv`` is the trainer's command line (a list, modifiable in place).
    """


@hookspec
def cfm_trainer_settings(config: Config, trainer: TrainerSettings) -> None:
    """Called by an adapter once it has read the trainer's own arguments, before data or model.

    ``trainer`` (:class:`cfm_plugins.options.TrainerSettings`) has the batch size, seed, dtype,
    device and the kernel swaps the trainer makes itself; a feature refuses combinations it
    cannot serve here (raise ``ValueError`` saying what to change).
    """


@hookspec
def cfm_after_trainer(config: Config, dist: DistInfo, exit_code: int) -> None:
    """Called after the trainer's entry point returned (or raised), in every rank.

    The undo callables of :func:`cfm_before_trainer` have run; features write their reports here.
    """


# --- 4. data -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def cfm_graph_sizes(dataset, indices, need_edges: bool) -> GraphSizes | None:
    """Graph sizes of the samples ``indices`` of a trainer's dataset.

    Returns a :class:`cfm_plugins.sizes.GraphSizes` (atoms, edges, the indices), or ``None`` if
    this plugin does not know the dataset type. Under MPI each rank asks for its own shard only
    and the sampler gathers them. ``need_edges`` (from :func:`cfm_needs_edges`) is false when the
    cost uses atoms alone (edges may then be left out where they are costly). Adapters implement
    it for their trainer's datasets.
    """


@hookspec
def cfm_needs_edges(config: Config) -> bool:
    """True when this feature's batch sampler needs per-graph edge counts.

    Adapters pass ``any(config.pm.hook.cfm_needs_edges(config=config))`` as ``need_edges`` to
    :func:`cfm_graph_sizes`, so they never read a feature's options themselves.
    """


@hookspec
def cfm_needs_step_times(config: Config) -> bool:
    """True when this feature's training batch sampler needs each training step's compute time.

    ``binpack`` with ``cost=auto`` fits its cost on them. An adapter that can time its trainer's
    steps asks ``any(config.pm.hook.cfm_needs_step_times(config=config))`` when it installs its
    seams; if true it times every training step (forward + backward of this rank, without the
    waits for other ranks: up to the last gradient bucket handed to DDP's all-reduce, and/or the
    training thread's CPU time) and hands it to the training loader's batch sampler as
    ``batch_sampler.record_step(atoms=, edges=, graphs=, wall_s=, cpu_s=)`` (totals of the batch it
    trained; a clock it cannot take is ``None``), in step order, every step of every rank.
    An adapter also keeps what ``batch_sampler.resume_state()`` returns beside the trainer's
    checkpoints (or in them) and gives it back with ``batch_sampler.load_resume_state(state,
    epoch=...)`` when the trainer resumes, so a resumed run plans the same batches.
    """


@hookspec(firstresult=True)
def cfm_batch_sampler(
    dataset, sizes: GraphSizes, config: Config, dist: DistInfo, role: str, trainer: TrainerSettings
):
    """The batch sampler to use for ``dataset``, or ``None`` to keep the trainer's own.

    ``sizes`` is the :class:`cfm_plugins.sizes.GraphSizes` from :func:`cfm_graph_sizes` (maybe
    one shard of the dataset); ``role`` is ``"train"`` (shuffled, re-packed every epoch),
    ``"valid"`` or ``"test"`` (evaluation loaders, prediction included: a fixed plan, every
    structure exactly once over the ranks); ``trainer`` holds the trainer's batch size, seed, dtype
    and device as the adapter read them (:class:`cfm_plugins.options.TrainerSettings`). The
    ``binpack`` feature returns a :class:`cfm_plugins.sampler.BinPackBatchSampler` sharing the work
    evenly over the ranks.

    Loss weighting: a training sampler whose ``loss_weighting`` is not ``"stock"`` gives the factors
    of every batch it yielded through ``next_loss_scale(reduction)`` (a
    :class:`cfm_plugins.sampler.weighting.LossScale`, in yield order); the adapter applies them to
    the trainer's per-graph and per-atom loss terms. Binpack asks for it only where
    ``trainer.loss_weightings`` offers it.
    """


@hookspec(firstresult=True)
def cfm_batch_budget(batch_sampler, sizes: GraphSizes, config: Config, dist: DistInfo, role: str):
    """The budget every batch of ``batch_sampler`` is padded to, or ``None`` to leave batches as
    they are.

    Called by an adapter after :func:`cfm_batch_sampler`, with the same ``sizes`` (edge counts
    included when a plugin's :func:`cfm_needs_edges` asked for them) and ``role``. The ``static``
    feature returns a :class:`cfm_plugins.static.budget.BudgetTracker` whose budget (atoms, edges,
    graphs) covers the bins of the first epochs' plans; the adapter pads each batch to
    ``tracker.fit(atoms, edges, graphs)`` with inert pad graphs (a batch over the budget raises it,
    logged, never truncated) and gives the model the real sizes beside the padded batch (see
    :func:`cfm_static_forward`).
    """


# --- 5. model ------------------------------------------------------------------------------------


@hookspec
def cfm_patch_model(model, config: Config):
    """Swap modules of a built model for faster ones, in place; return a report (or ``None``).

    Every adapter calls this where its trainer has built the model (before DDP wraps it). Swaps
    must keep the state_dict (same keys, shapes and values: shared parameters), so a checkpoint
    loads with or without the plugin. The ``fused`` feature swaps the modules of the kernels in
    its ``fused_kernels`` option with the kernel table (:mod:`cfm_plugins.ops.kernel_table`) and
    returns a :class:`cfm_plugins.ops.patching.PatchReport`; a kernel that finds no module in the
    model is reported in the log, never dropped silently.
    """


@hookspec(firstresult=True)
def cfm_static_forward(model, config: Config, spec: ModelSpec):
    """Install the forward that runs padded batches and compiles (or ``None`` where no plugin does).

    Every adapter calls this after :func:`cfm_patch_model`, with the
    :class:`cfm_plugins.static.forward.ModelSpec` of its trainer's models (which outputs are per
    graph, per atom, per edge; what a model needs around a compiled call). The ``static`` feature
    installs a :class:`cfm_plugins.static.forward.StaticForward` as ``model.forward``, compiled per
    its ``compile`` option, and returns it; :func:`cfm_unpatch_model` takes it off (before
    pickling).
    """


@hookspec
def cfm_unpatch_model(model, config: Config) -> None:
    """Undo :func:`cfm_patch_model` in place (before a whole model is pickled for users who do
    not have cfm-plugins installed)."""
