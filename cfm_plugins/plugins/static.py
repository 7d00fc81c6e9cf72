"""static: fixed-size padded batches and one compiled training step.

Bin packing fills every batch nearly to the same number of atoms; this feature pads each batch of a
loader to one budget of atoms, edges and graphs (``static_shapes``, on when the plugin is enabled),
so that the model sees one shape and ``torch.compile`` (option ``compile``) compiles it once. The
budget is fixed before the epoch from the bin-packing plan
(:mod:`cfm_plugins.static_shapes.budget`); the pad atoms form inert pad graphs whose outputs are cut
off before the trainer's loss and metrics (:mod:`cfm_plugins.static_shapes.forward`), so losses,
gradients and metrics are those of the unpadded batch. ``compile=reduce-overhead`` (CUDA graphs)
needs a GPU.

Why a feature plugin and not part of an adapter: like ``binpack`` and ``fused`` it acts through
hooks that every adapter calls at its seams (``cfm_batch_budget`` where a loader is built,
``cfm_static_forward`` where the model is built); the adapter brings what is trainer-specific (how a
batch is padded, which outputs are per graph or per atom, what a model needs before compiling).
"""

from __future__ import annotations

import logging
import weakref

import numpy as np

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.static_shapes")

_FORWARDS: weakref.WeakSet = (
    weakref.WeakSet()
)  # the StaticForwards this process installed, for the summary

#: padding above which the log warns, as a fraction of the real atoms / of the real edges. Atoms:
#: the plugin's even bins pad at most 3 % of the atoms on 2 ranks for every set measured
#: (docs/benchmarks.md, "Padding"), and compiling gained 1.16-1.35x over eager on CPUs: padding a
#: tenth of the atoms (a tenth more work per step) takes most of the smaller gain. Edges: even bins
#: still pad 8-19 % of the edges on 2 ranks where compiling gained, so the edge limit is higher.
PAD_WARN = {"atoms": 0.10, "edges": 0.25}


@hookimpl
def cfm_declare_options():
    from cfm_plugins.options import Option
    from cfm_plugins.static_shapes import COMPILE_BACKENDS, COMPILE_MODES
    from cfm_plugins.static_shapes.budget import DEFAULT_HEADROOM

    return [
        Option(
            "static_shapes",
            bool,
            True,
            "pad every batch of a loader to one budget of atoms, edges and graphs "
            "(from the bin-packing plan; needs binpack) so the model sees one shape",
        ),
        Option(
            "compile",
            str,
            "off",
            "torch.compile the model's forward with forces (fullgraph, one graph per "
            "shape): off, default, max-autotune, or reduce-overhead (CUDA graphs; GPUs only)",
            COMPILE_MODES,
        ),
        Option(
            "compile_backend",
            str,
            "inductor",
            "torch.compile backend: inductor (generated kernels) or "
            "aot_eager (the same graphs run op by op, no code generation: tests, debugging)",
            COMPILE_BACKENDS,
        ),
        Option(
            "budget_headroom",
            float,
            DEFAULT_HEADROOM,
            "headroom of the padded budget over the fullest planned "
            "bin, for edges and graphs (a batch over the budget raises it, logged)",
        ),
        Option("budget_epochs", int, 3, "the budget covers the plans of this many first epochs"),
    ]


@hookimpl
def cfm_needs_adapter():
    return True  # batches are padded where an adapter builds the trainer's loaders


@hookimpl
def cfm_needs_edges(config):
    return bool(config.get("static_shapes"))  # the edge budget comes from the plan's edge counts


def resolve_device(config) -> str:
    """The device of the run: the ``device`` option, with ``auto`` resolved as the ranks resolve
    it."""
    device = config.get("device") or "auto"
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return device


@hookimpl
def cfm_configure(config):
    from cfm_plugins.static_shapes.forward import check_compile_mode

    if config.get("budget_headroom") < 0:
        raise ValueError(
            f"static option budget_headroom={config.get('budget_headroom')!r} must be >= 0"
        )
    if config.get("budget_epochs") < 1:
        raise ValueError(
            f"static option budget_epochs={config.get('budget_epochs')!r} must be >= 1"
        )
    check_compile_mode(config.get("compile"), resolve_device(config), config.get("compile_backend"))
    if (
        config.get("static_shapes")
        and config.pm is not None
        and not config.pm.hook.cfm_batch_sampler.get_hookimpls()
    ):
        raise ValueError(
            "static_shapes pads bin-packed batches to a budget taken from the packing plan: enable "
            "binpack too (--enable mace,binpack,static), or set -o static_shapes=false to compile "
            "without padding"
        )


def global_sizes(sizes, dist) -> tuple[np.ndarray, np.ndarray]:
    """Atom and edge counts of the whole dataset (a collective under MPI: each rank read its
    shard)."""
    if sizes.edges is None:
        raise ValueError(
            "static shapes need the edge count of every structure; the adapter gave none"
        )
    if sizes.indices is None:
        return sizes.atoms, sizes.edges
    from cfm_plugins.sampler.batch_sampler import gather_shards

    return (
        gather_shards(sizes.atoms.astype(np.float64), sizes.indices, dist.comm).astype(np.int64),
        gather_shards(sizes.edges.astype(np.float64), sizes.indices, dist.comm).astype(np.int64),
    )


@hookimpl
def cfm_batch_budget(batch_sampler, sizes, config, dist, role):
    from cfm_plugins.sampler.balance import count
    from cfm_plugins.static_shapes.budget import BudgetTracker, budget_of_plans, padding_overhead

    if not config.get("static_shapes"):
        return None
    sampler = batch_sampler
    while not hasattr(sampler, "packing_of_epoch") and hasattr(sampler, "batch_sampler"):
        sampler = sampler.batch_sampler  # wrappers (an adapter's epoch forwarding)
    if not hasattr(sampler, "packing_of_epoch"):
        raise ValueError(
            f"static_shapes: the {role} batch sampler ({type(batch_sampler).__name__}) has no "
            "packing plan to take a budget from: enable binpack"
        )
    atoms, edges = global_sizes(sizes, dist)
    epochs = config.get("budget_epochs") if sampler.shuffle else 1
    # bins as full as their mean rather than full and light ones, as many, and even in atoms and
    # edges
    # together: padding to the fullest costs the gap in each (every plan of every epoch alike, so
    # the step count does not change)
    sampler.even = True
    sampler.even_dims = np.column_stack([atoms, edges])
    plans = [sampler.packing_of_epoch(e) for e in range(epochs)]
    headroom = config.get("budget_headroom")
    budget = budget_of_plans(plans, sampler.costs, atoms, edges, sampler.capacity, headroom)
    pad = padding_overhead(plans, atoms, edges, budget)
    said = (
        f"static shapes ({role}): every batch padded to {budget} (pad over the first "
        f"{count(epochs, 'epoch plan')}: {pad})"
    )
    # the same on every rank, and mace builds its training loader twice: said once
    if getattr(dist, "rank", 0) == 0 and config.first_time(said):
        log.info("%s", said)
        warn_padding(pad, role, dist, config)
    return BudgetTracker(budget, headroom, role)


def warn_padding(pad, role, dist, config) -> None:
    """Warn where the padding of a loader's batches is above :data:`PAD_WARN`, saying what lowers
    it."""
    over = [
        f"{100 * getattr(pad, k):.0f}% of the {k}"
        for k in ("atoms", "edges")
        if getattr(pad, k) > PAD_WARN[k]
    ]
    if not over:
        return
    ranks = getattr(dist, "world_size", 1)
    fewer = f" or fewer ranks (now {ranks})" if ranks > 1 else ""
    cpu = (
        "; on CPUs leaving static off may be faster (where bins held about one structure, the "
        "padding cost more than compiling gained)"
        if resolve_device(config) == "cpu"
        else ""
    )
    log.warning(
        "static shapes (%s): the padding is %s (warned above %d%% of the atoms or %d%% of the "
        "edges): the bins hold few structures each, so the largest set the budget of every "
        "batch. A larger max_tokens (more structures per batch)%s lowers it%s",
        role,
        " and ".join(over),
        round(100 * PAD_WARN["atoms"]),
        round(100 * PAD_WARN["edges"]),
        fewer,
        cpu,
    )


@hookimpl
def cfm_static_forward(model, config, spec):
    from cfm_plugins.static_shapes import forward

    fwd = forward.install(
        model,
        spec,
        compile=config.get("compile"),
        dynamic=False if config.get("static_shapes") else None,
        backend=config.get("compile_backend"),
    )
    _FORWARDS.add(fwd)
    return fwd


@hookimpl
def cfm_unpatch_model(model, config):
    from cfm_plugins.static_shapes.forward import remove

    remove(model)


@hookimpl
def cfm_after_trainer(config, dist, exit_code):
    from cfm_plugins.static_shapes.forward import compile_counts

    if config.get("compile") == "off":
        return
    counts = compile_counts()
    shapes = sorted({s for f in _FORWARDS for s in f.shapes}, key=str)
    log.info(
        "static shapes: rank %d: dynamo compiled %d graph(s) for %d shape(s) %s; graph breaks: %s",
        getattr(dist, "rank", 0),
        counts["graphs"],
        len(shapes),
        shapes,
        counts["graph_breaks"] or "none",
    )
