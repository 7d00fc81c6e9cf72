"""The hook specifications: the contract between cfm-plugins' core, its features and adapters.

Every plugin (a feature such as ``binpack`` or ``fused``, or a trainer adapter such as ``mace``)
is a module or object registered under the entry-point group ``cfm_plugins`` that implements some
of these hooks with :data:`hookimpl`. The core calls them; adapters call them at the right moment
of their trainer. A plugin that does not care about a hook simply does not implement it.

``firstresult`` hooks stop at the first plugin returning something other than ``None``.
"""
from __future__ import annotations

import pluggy

PROJECT = "cfm_plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def cfm_configure(config) -> None:
    """Called once after the plugins are enabled, before any trainer code runs.

    ``config`` is the :class:`cfm_plugins.config.Config`. A plugin validates its own options here
    (raise ``ValueError`` with a clear message) and may fill in defaults in ``config.options``.
    """


@hookspec(firstresult=True)
def cfm_init_distributed(config):
    """Set up ranks and the torch.distributed process group.

    Returns a :class:`cfm_plugins.distributed.DistInfo` (rank, world size, ...). The built-in
    implementation (``cfm_plugins.distributed``) uses MPI through mpi4py and a rendezvous that
    rank 0 chooses and broadcasts; a plugin may replace it (e.g. for a scheduler of its own).
    """


@hookspec
def cfm_before_trainer(config, dist, argv) -> None:
    """Called just before the trainer's entry point runs, in every rank.

    Adapters install their seams here (patch the trainer's loader construction, model build,
    distributed set-up). ``argv`` is the trainer's command line (a list, modifiable in place:
    an adapter may remove its own ``--cfm-*`` options from it).
    """


@hookspec
def cfm_after_trainer(config, dist, exit_code) -> None:
    """Called after the trainer's entry point returned (or raised), in every rank.

    Adapters undo their seams here; features write their reports.
    """


@hookspec(firstresult=True)
def cfm_graph_sizes(dataset, indices, need_edges):
    """Graph sizes of the samples ``indices`` of a trainer's dataset.

    Returns a :class:`cfm_plugins.sizes.GraphSizes` (atoms, edges, the indices), or ``None`` if
    this plugin does not know the dataset type. Under MPI each rank asks for its own shard only
    and the sampler gathers them. ``need_edges`` is false when the cost uses atoms alone (edges
    may then be left out where they are costly). Adapters implement it for their trainer's
    datasets.
    """


@hookspec(firstresult=True)
def cfm_batch_sampler(dataset, sizes, config, dist, role):
    """The batch sampler to use for ``dataset``, or ``None`` to keep the trainer's own.

    ``sizes`` is the :class:`cfm_plugins.sizes.GraphSizes` from :func:`cfm_graph_sizes` (maybe
    one shard of the dataset); ``role`` is
    ``"train"``, ``"valid"`` or ``"test"`` (validation may want no shuffling). The ``binpack``
    feature returns a :class:`cfm_plugins.sampler.BinPackBatchSampler` sharing the work evenly
    over the ranks of ``dist``.
    """


@hookspec
def cfm_patch_model(model, config) -> None:
    """Swap modules of a built model for faster ones, in place.

    Swaps must keep the state_dict (same keys, shapes and values: shared parameters), so a
    checkpoint loads with or without the plugin. The ``fused`` feature swaps the symmetric
    contractions and the conv tensor products for the fused kernels.
    """


@hookspec
def cfm_unpatch_model(model, config) -> None:
    """Undo :func:`cfm_patch_model` in place (before a whole model is pickled for users who do
    not have cfm-plugins installed)."""
