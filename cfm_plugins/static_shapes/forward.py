"""The forward that runs padded batches, compiled once per shape: :class:`StaticForward`.

A trainer calls its model with a dict of tensors and reads a dict of outputs. When the batch was
padded to a budget (see :mod:`cfm_plugins.static_shapes.budget`), the adapter's batch adds the key
:data:`REAL_SIZES` to that dict: the real graphs, atoms and edges at the front of every tensor.
:class:`StaticForward`, installed as the model's ``forward`` (an instance attribute, so
``model(...)``, DDP and forward hooks reach it unchanged), takes the key out, runs the model's own
forward on the whole padded batch (compiled, with option ``compile``: :func:`compile_forward`)
and cuts every output back to the real graphs/atoms/edges, by the output's level
(``output_levels``, from the adapter). The loss and the metrics of the trainer then see exactly
what the unpadded batch gives: no pad entry in a mean, a denominator or a metric.
:func:`compile_counts` reads dynamo's counters (compiled graphs and graph breaks) for the log and
the tests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from cfm_plugins.static_shapes import COMPILE_BACKENDS, COMPILE_MODES

log = logging.getLogger("cfm_plugins.static_shapes")

#: key of the model's input dict holding ``(graphs, atoms, edges)`` of the real batch, then the
# padded sizes
REAL_SIZES = "cfm_real_sizes"
LEVELS = ("graph", "atom", "edge", "whole")
#: compiled graphs allowed per forward before dynamo stops compiling it (its default is 8): budgets
#: are raised rarely, but train/eval and each raised budget are separate graphs
RECOMPILE_LIMIT = 64


def configure_dynamo() -> None:
    """Let dynamo trace ``torch.autograd.grad`` into the graph (forces and stress are gradients of
    the energy taken inside the forward) and compile a few dozen shapes per forward.

    Under DistributedDataParallel dynamo's DDP optimizer would split the graph at the gradient
    buckets' boundaries (to overlap all-reduce with backward); a split graph cannot take
    ``autograd.grad`` through the pieces (``-1 * None`` at ``compute_forces``: it broke a
    MACE-MP-medium-like model on 2 ranks, whose parameters fill more than one 25 MB bucket). It is
    turned off: the compiled
    forward stays one graph, DDP's hooks still all-reduce every bucket in backward."""
    import torch._dynamo as dynamo

    dynamo.allow_in_graph(torch.autograd.grad)
    dynamo.config.optimize_ddp = False
    if hasattr(dynamo.config, "trace_autograd_ops"):
        dynamo.config.trace_autograd_ops = True
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), RECOMPILE_LIMIT))


def check_compile_mode(mode: str, device, backend: str = "inductor") -> str:
    """``mode`` if it can run on ``device`` with ``backend``; a ``ValueError`` saying what to use
    otherwise."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile={mode!r}: expected one of {', '.join(COMPILE_MODES)}")
    if backend not in COMPILE_BACKENDS:
        raise ValueError(
            f"compile_backend={backend!r}: expected one of {', '.join(COMPILE_BACKENDS)}"
        )
    if mode == "reduce-overhead" and torch.device(device).type != "cuda":
        raise ValueError(
            f"compile=reduce-overhead captures CUDA graphs and needs a CUDA device, not {device}: "
            "use compile=default (or max-autotune) on CPUs"
        )
    if mode in ("max-autotune", "reduce-overhead") and backend != "inductor":
        raise ValueError(
            f"compile={mode} is a mode of the inductor backend, not of compile_backend={backend}"
        )
    return mode


def compile_forward(
    fn, mode: str = "default", dynamic: bool | None = False, backend: str = "inductor"
):
    """``fn`` compiled whole (``fullgraph=True``), one graph per input shape (``dynamic=False``;
    ``None`` lets dynamo make sizes symbolic after a second shape, for batches that are not
    padded).

    ``torch.compile`` of the model's forward, with ``torch.autograd.grad`` (forces, stress)
    traced into the graph, as ``mace/tools/compile.py`` arranges it for mace. ``fullgraph=True``:
    a graph break is an error that names its place, never a silent fall back to eager;
    ``dynamic=False``: one graph per shape, which padding makes one per budget."""
    configure_dynamo()
    if backend != "inductor":
        return torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=backend)
    return torch.compile(
        fn, fullgraph=True, dynamic=dynamic, mode=None if mode == "default" else mode
    )


def compile_counts() -> dict:
    """Dynamo's counters of this process: graphs compiled, and graph breaks by reason."""
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": {str(k): int(v) for k, v in counters["graph_break"].items()},
    }


def cut(outputs: dict, real: tuple, levels: dict) -> dict:
    """``outputs`` of a padded batch cut to the real graphs, atoms and edges (``real`` is the
    :data:`REAL_SIZES` entry: ``(graphs, atoms, edges, padded graphs, padded atoms, padded
    edges)``).

    An output's level comes from ``levels``; an output not listed there is placed by its first
    dimension when that matches exactly one padded size, and is an error otherwise (a new output of
    the trainer that we cannot place must not pass through padded)."""
    graphs, atoms, edges, pg, pa, pe = real
    keep = {"graph": graphs, "atom": atoms, "edge": edges}
    out = {}
    for key, value in outputs.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
            continue
        level = levels.get(key)
        if level is None:
            matches = [
                lv for lv, n in (("graph", pg), ("atom", pa), ("edge", pe)) if value.shape[0] == n
            ]
            if len(matches) != 1:
                raise ValueError(
                    f"static shapes: the model's output {key!r} has shape {tuple(value.shape)}, "
                    f"which cannot be placed as per graph ({pg}), per atom ({pa}) or per edge "
                    f"({pe}); add it to the adapter's output levels"
                )
            level = matches[0]
        if level == "whole":
            raise ValueError(
                f"static shapes: the model's output {key!r} mixes the atoms of every graph (e.g. a "
                "Hessian) and cannot be cut to the real batch; turn static_shapes off for it"
            )
        out[key] = value.narrow(0, 0, keep[level])
    return out


@dataclass(frozen=True)
class ModelSpec:
    """What static shapes must know of a trainer's model; the adapter gives it.

    Args:
        output_levels: output name -> ``"graph"``, ``"atom"``, ``"edge"`` (cut back to the real
            batch) or ``"whole"`` (cannot be cut: an error with padding).
        grad_inputs: input keys that must require grad before a compiled call (tracing cannot flip
            ``requires_grad`` of an input; mace's forward does it only when not compiling).
        prepare: ``prepare(model)`` gives a context manager entered around every compiled call (what
            the model needs while dynamo traces it, e.g. mace's fx-traced modules), or ``None``.
        compiled_kwargs: keyword arguments every compiled call runs with; where they differ from the
            caller's, the outputs are detached (mace's evaluation forward, ``training=False``, takes
            forces with ``retain_graph=False``, which AOT autograd cannot trace; ``training=True``
            gives the same values, as mace's own compiled calculator does).
    """

    output_levels: dict
    grad_inputs: tuple = ("positions",)
    prepare: object = None
    compiled_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        bad = {k: v for k, v in self.output_levels.items() if v not in LEVELS}
        if bad:
            raise ValueError(f"output_levels {bad}: each must be one of {', '.join(LEVELS)}")


class StaticForward:
    """The model's forward for padded batches, compiled or not; see the module docstring.

    Why cut the outputs rather than weigh the pad graph by zero: mace's losses are means over the
    graphs and atoms of a batch (with a DDP correction that counts them over the ranks), its
    Huber and universal losses take no weights at all, and its metrics concatenate per-graph and
    per-atom errors. A zero weight still changes those denominators; cut outputs beside a batch
    of real views (the adapter's) leave every one of them as it is.

    Args:
        model: the model (the module whose ``forward`` this replaces; the class's own forward runs).
        spec: the :class:`ModelSpec` of the trainer's models.
        compile: one of :data:`~cfm_plugins.static_shapes.COMPILE_MODES`.
        dynamic: ``False`` (padded batches: one graph per budget) or ``None`` (dynamo's default).
        backend: ``inductor`` (generated kernels) or ``aot_eager`` (the same graphs, forward and
            backward, run op by op: no code generation, which takes many minutes on a small CPU).
    """

    def __init__(
        self,
        model,
        spec: ModelSpec,
        compile: str = "off",
        dynamic: bool | None = False,
        backend: str = "inductor",
    ):
        self.stock = type(model).forward.__get__(model)
        self.spec, self.mode, self.dynamic, self.backend = spec, compile, dynamic, backend
        self.compiled = self._context = (
            None  # made at the first call (a deep copy is made half-built)
        )
        self.shapes: list[
            tuple
        ] = []  # (padded graphs, atoms, edges) and the compiled call's kwargs seen, in order

    def __call__(self, data, *args, **kwargs):
        real = data.pop(REAL_SIZES, None) if isinstance(data, dict) else None
        if self.mode == "off":
            out = self.stock(data, *args, **kwargs)
        else:
            out = self._compiled(data, args, kwargs, real)
        return cut(out, real, self.spec.output_levels) if real is not None else out

    def _compiled(self, data, args, kwargs, real):
        if self.compiled is None:
            from cfm_plugins.ops._backend import prepare_kernels

            prepare_kernels(
                self.stock.__self__
            )  # first launches' set-up, outside the graph and its capture
            self.compiled = compile_forward(self.stock, self.mode, self.dynamic, self.backend)
            self._context = (
                self.spec.prepare(self.stock.__self__) if self.spec.prepare is not None else None
            )
        for key in self.spec.grad_inputs:
            if key in data and not data[key].requires_grad:
                data[key].requires_grad_(True)
        forced = {k: v for k, v in self.spec.compiled_kwargs.items() if kwargs.get(k) != v}
        kwargs = {**kwargs, **forced}
        self._note_shape(real, kwargs)
        if self._context is None:
            out = self.compiled(data, *args, **kwargs)
        else:
            with self._context:
                out = self.compiled(data, *args, **kwargs)
        if forced:
            out = {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        return out

    def _note_shape(self, real, kwargs) -> None:
        grads = torch.is_grad_enabled() and any(
            p.requires_grad for p in self.stock.__self__.parameters()
        )
        key = (
            tuple(real[3:]) if real is not None else None,
            bool(kwargs.get("training", False)),
            grads,
        )
        if key not in self.shapes:
            self.shapes.append(key)
            log.info(
                "static shapes: compiling the forward for %s (training=%s, parameter gradients %s)",
                "batches of {} graphs, {} atoms, {} edges".format(*key[0])
                if key[0]
                else "unpadded batches",
                key[1],
                "on" if grads else "off",
            )

    def __deepcopy__(self, memo):
        """The deep copy of the model (SWA's averaged model, mace's copy to save) gets a forward
        of its own, compiled at its first call; :func:`remove` takes it off a copy about to be
        pickled."""
        copy = memo.get(id(self.stock.__self__))
        if copy is None:
            raise TypeError("a StaticForward is copied with its model, not alone")
        return StaticForward(copy, self.spec, self.mode, self.dynamic, self.backend)

    def __reduce__(self):
        raise TypeError(
            "a model with a StaticForward cannot be pickled: call "
            "cfm_plugins.static_shapes.remove(model) first (the adapters do it before saving)"
        )


def install(
    model,
    spec: ModelSpec,
    compile: str = "off",
    dynamic: bool | None = False,
    backend: str = "inductor",
) -> StaticForward:
    """Make ``model(...)`` run :class:`StaticForward`; returns it. Undo with :func:`remove`."""
    if installed(model) is not None:
        return installed(model)
    fwd = StaticForward(model, spec, compile, dynamic, backend)
    model.forward = fwd
    return fwd


def installed(model) -> StaticForward | None:
    fwd = model.__dict__.get("forward")
    return fwd if isinstance(fwd, StaticForward) else None


def remove(model) -> bool:
    """Give ``model`` its class's own forward back (before pickling it); whether it had a
    StaticForward."""
    if installed(model) is None:
        return False
    del model.__dict__["forward"]
    return True
