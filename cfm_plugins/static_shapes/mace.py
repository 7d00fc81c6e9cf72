"""mace's side of static shapes: padded mace batches, the outputs' levels, what compiling needs.

Imported by the mace adapter (training) and by ``CFMCalculator`` (MD), the two places that meet mace
models; it imports mace (nothing else in ``cfm_plugins.static_shapes`` does).

**Padded batches.** :class:`PaddingCollater` replaces a mace DataLoader's collate function: it
appends inert pad graphs (:func:`pad_graphs`) so that the batch has exactly the loader's budget of
atoms, edges and graphs (:class:`cfm_plugins.static_shapes.budget.BudgetTracker`), and returns a
:class:`PaddedBatch`, whose attributes are views of the *real* structures only: mace's losses and
metrics need no change, and :class:`cfm_plugins.static_shapes.forward.StaticForward` cuts the
model's outputs back by :data:`OUTPUT_LEVELS`.

**Compiling** (mace-torch 0.3.16 with e3nn 0.4.4): the model that was built and patched is
compiled in place; :class:`TracedSwaps` and :func:`e3nn_codegen_off` / :func:`without_torchscript`
work around what dynamo cannot trace in e3nn's modules (each says what).
"""

from __future__ import annotations

import contextlib

import torch
from mace.tools.torch_geometric.batch import Batch
from mace.tools.torch_geometric.data import Data

from cfm_plugins.static_shapes.forward import REAL_SIZES, ModelSpec

#: what each key of mace's ``AtomicData`` (0.3.16) holds, for building pad graphs: per atom, per
# edge : (``edge_index`` is concatenated along its last dimension), else per graph. A key not listed
# is : placed by its first dimension (see :func:`key_level`).
NODE_KEYS = frozenset({"positions", "node_attrs", "forces", "charges", "density_coefficients"})
EDGE_KEYS = frozenset({"edge_index", "shifts", "unit_shifts"})
GRAPH_KEYS = frozenset(
    {
        "cell",
        "weight",
        "head",
        "energy_weight",
        "forces_weight",
        "stress_weight",
        "virials_weight",
        "dipole_weight",
        "charges_weight",
        "polarizability_weight",
        "energy",
        "stress",
        "virials",
        "dipole",
        "polarizability",
        "elec_temp",
        "total_charge",
        "total_spin",
        "pbc",
        "rcell",
        "volume",
        "fermi_level",
        "external_field",
    }
)

#: the level of each output of mace's models (MACE, ScaleShiftMACE), for cutting them back
OUTPUT_LEVELS = {
    "energy": "graph",
    "interaction_energy": "graph",
    "contributions": "graph",
    "virials": "graph",
    "stress": "graph",
    "displacement": "graph",
    "dipole": "graph",
    "polarizability": "graph",
    "polarizability_sh": "graph",
    "node_energy": "atom",
    "forces": "atom",
    "node_feats": "atom",
    "charges": "atom",
    "atomic_virials": "atom",
    "atomic_stresses": "atom",
    "atomic_dipoles": "atom",
    "edge_forces": "edge",
    "hessian": "whole",
}


def key_level(key: str, value, data) -> str:
    """``"node"``, ``"edge"`` or ``"graph"``: how ``data[key]`` is laid out."""
    if key in NODE_KEYS:
        return "node"
    if key in EDGE_KEYS:
        return "edge"
    if key in GRAPH_KEYS or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return "graph"
    n_nodes, n_edges = data.num_nodes, data["edge_index"].shape[1]
    matches = [lv for lv, n in (("node", n_nodes), ("edge", n_edges)) if value.shape[0] == n]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return "graph"
    raise ValueError(
        f"static shapes: mace data key {key!r} (shape {tuple(value.shape)}) of a structure with "
        f"{n_nodes} atoms and {n_edges} edges: per atom or per edge? Add it to "
        "cfm_plugins_adapters.mace.padding.NODE_KEYS or EDGE_KEYS"
    )


def pad_graphs(reference: Data, atoms: int, edges: int, graphs: int, distance: float) -> list[Data]:
    """``graphs`` inert pad graphs with ``atoms`` atoms and ``edges`` edges in all, with the keys
    and dtypes of ``reference`` (a structure of the batch).

    The first holds every pad atom and every pad edge; the others are empty. Pad atoms (element 0
    of the model's table) sit on a line, ``distance`` apart; each pad edge is a self-loop of a pad
    atom to its own periodic image one pad cell (``distance`` along x) away, and ``distance`` is
    twice the model's cutoff: every pad edge is longer than the cutoff (mace's radial envelope is
    then exactly zero, with finite derivatives), and no edge joins a pad atom and a real one, so
    nothing of the real graphs depends on the pad. Every pad graph has the cubic pad cell (a
    finite volume: mace divides virials by it for the stress), zero weights and zero labels."""
    if graphs < 1 or atoms < 1:
        raise ValueError(
            f"pad_graphs: at least one pad graph and one pad atom are needed, got {graphs} and "
            f"{atoms}"
        )
    first = _pad_graph(reference, atoms, edges, distance)
    if graphs == 1:
        return [first]
    empty = _pad_graph(reference, 0, 0, distance)
    return [first] + [empty] * (graphs - 1)


def _pad_graph(reference: Data, atoms: int, edges: int, distance: float) -> Data:
    pad = Data()
    for key in reference.keys:
        value = reference[key]
        if not isinstance(value, torch.Tensor):
            pad[key] = value
            continue
        level = key_level(key, value, reference)
        if level == "node":
            pad[key] = value.new_zeros((atoms,) + tuple(value.shape[1:]))
        elif level == "edge" and key == "edge_index":
            loop = torch.arange(edges, dtype=value.dtype) % max(
                atoms, 1
            )  # spread over the pad atoms
            pad[key] = torch.stack([loop, loop])
        elif level == "edge":
            pad[key] = value.new_zeros((edges,) + tuple(value.shape[1:]))
        else:
            pad[key] = torch.zeros_like(value)
    pad.num_nodes = atoms
    if "node_attrs" in pad.keys and atoms:
        pad["node_attrs"][:, 0] = 1  # element 0 of the model's table: a valid one-hot
    if "positions" in pad.keys and atoms:
        pad["positions"][:, 1] = distance * torch.arange(atoms, dtype=pad["positions"].dtype)
    for key, length in (("unit_shifts", 1.0), ("shifts", distance)):
        if key in pad.keys and edges:
            pad[key][:, 0] = (
                length  # the image one pad cell along x: every pad edge is `distance` long
            )
    if "cell" in pad.keys:
        pad["cell"] = distance * torch.eye(3, dtype=pad["cell"].dtype).view(reference["cell"].shape)
    if "rcell" in pad.keys:
        pad["rcell"] = (
            torch.eye(3, dtype=pad["rcell"].dtype).view(reference["rcell"].shape) / distance
        )
    if "volume" in pad.keys:
        pad["volume"] = torch.full_like(reference["volume"], distance**3)
    if "total_spin" in pad.keys:
        pad["total_spin"] = torch.ones_like(reference["total_spin"])  # a singlet, as mace pads
    return pad


def batch_sizes(data_list) -> tuple[int, int, int]:
    """Atoms, edges and graphs of a list of mace structures."""
    return (
        sum(int(d.num_nodes) for d in data_list),
        sum(int(d["edge_index"].shape[1]) for d in data_list),
        len(data_list),
    )


class PaddedBatch(Batch):
    """A mace batch padded to a budget, whose attributes show only the real structures.

    ``padded`` is the whole padded :class:`Batch`; ``real_sizes`` the real ``(graphs, atoms,
    edges)`` at its front. Built by :meth:`wrap`. It is what mace's ``take_step`` and ``evaluate``
    get. Its attributes (``batch.energy``, ``batch.forces``, ``batch.ptr``, ``batch.weight``,
    ``num_graphs``, ...) are views of the real structures only: mace's losses and metrics see the
    unpadded batch. ``to_dict()`` (what mace hands to the model) gives the whole padded batch plus
    the real sizes, and the model's :class:`~cfm_plugins.static_shapes.forward.StaticForward` cuts
    its outputs back to the real graphs and atoms (:data:`OUTPUT_LEVELS`). ``to(device)`` moves the
    padded tensors once (without blocking when they are pinned: mace's loaders pin them with
    ``--pin_memory``) and makes the views again on the device.
    """

    @classmethod
    def wrap(cls, padded: Batch, graphs: int, atoms: int, edges: int) -> PaddedBatch:
        out = cls()
        out.__padded__ = padded
        out.__real__ = (int(graphs), int(atoms), int(edges))
        return out.remake_views()

    @property
    def padded(self) -> Batch:
        return self.__padded__

    @property
    def real_sizes(self) -> tuple[int, int, int]:
        return self.__real__

    def remake_views(self) -> PaddedBatch:
        """Make the attributes views of the real structures of :attr:`padded` again (after the
        padded tensors were replaced: moved, pinned, converted); returns ``self``."""
        p, (g, n, _) = self.__padded__, self.__real__
        for key in p.keys:
            value = p[key]
            if key == "batch":
                self.batch = value.narrow(0, 0, n)
            elif key == "ptr":
                self.ptr = value.narrow(0, 0, g + 1)
            elif isinstance(value, torch.Tensor):
                dim = p.__cat_dims__[key]
                self[key] = value.narrow(0 if dim is None else dim, 0, p.__slices__[key][g])
            else:
                self[key] = value
        self.__data_class__ = p.__data_class__
        self.__slices__ = {k: v[: g + 1] for k, v in p.__slices__.items()}
        self.__cumsum__ = {k: v[: g + 1] for k, v in p.__cumsum__.items()}
        self.__cat_dims__ = p.__cat_dims__
        self.__num_nodes_list__ = p.__num_nodes_list__[:g]
        self.__num_graphs__ = g
        return self

    def padded_sizes(self) -> tuple[int, int, int]:
        p = self.__padded__
        return int(p.ptr.numel() - 1), int(p.batch.numel()), int(p["edge_index"].shape[1])

    def to_dict(self) -> dict:
        """The padded batch for the model, with
        :data:`~cfm_plugins.static_shapes.forward.REAL_SIZES`."""
        out = self.__padded__.to_dict()
        out[REAL_SIZES] = self.__real__ + self.padded_sizes()
        return out

    def to(self, device, *keys, **kwargs):
        p = self.__padded__
        kwargs.setdefault(
            "non_blocking", bool(p.positions.is_pinned()) and torch.device(device).type == "cuda"
        )
        self.__padded__ = p.to(device, **kwargs)
        self.remake_views()
        return self

    def pin_memory(self, *keys):
        self.__padded__ = self.__padded__.pin_memory()
        self.remake_views()
        return self

    def clone(self):
        return PaddedBatch.wrap(self.__padded__.clone(), *self.__real__)

    def __getstate__(self):  # views are made again after unpickling (DataLoader workers)
        return {"__padded__": self.__padded__, "__real__": self.__real__}

    def __setstate__(self, state):
        self.__padded__, self.__real__ = state["__padded__"], state["__real__"]
        self.remake_views()


class PaddingCollater:
    """A mace DataLoader's collate function that pads every batch to its loader's budget.

    Args:
        collate: the loader's own collate function (mace's ``Collater``).
        tracker: the loader's :class:`~cfm_plugins.static_shapes.budget.BudgetTracker` (raised,
            with a log line, by a batch that does not fit).
        distance: length of every pad edge and side of the pad cell: more than the model's cutoff.
    """

    def __init__(self, collate, tracker, distance: float):
        self.collate, self.tracker, self.distance = collate, tracker, float(distance)

    def __call__(self, data_list):
        atoms, edges, graphs = batch_sizes(data_list)
        budget = self.tracker.fit(atoms, edges, graphs)
        pad_atoms, pad_edges, pad_graphs_ = budget.padding(atoms, edges, graphs)
        pads = pad_graphs(data_list[0], pad_atoms, pad_edges, pad_graphs_, self.distance)
        return PaddedBatch.wrap(self.collate(list(data_list) + pads), graphs, atoms, edges)


# ------------------------------------------------------------------------------------ compiling


def simplify_classes() -> tuple[type, ...]:
    """The module classes mace symbolic-traces for torch.compile (its ``simplify_if_compile``
    registry)."""
    import mace.modules  # noqa: F401  (registers the classes)
    from mace.tools import compile as mace_compile

    return tuple(mace_compile._SIMPLIFY_REGISTRY)


class TracedSwaps:
    """Swaps every module of :func:`simplify_classes` in ``model`` for its fx trace while the
    compiled forward runs (a context manager, entered at each call), and back after.

    The traces are made once and share the parameters and buffers they use. Swapping only around the
    compiled call leaves the model itself stock between calls: its ``state_dict`` (checkpoints), its
    pickle (the saved ``.model``) and its eager forward are mace's own (a trace keeps only the
    buffers its graph reads, so a model left swapped would save fewer keys than it loads).

    Why: dynamo guards on the attributes a forward reads; e3nn's ``Activation`` reads its
    ``Irreps``, whose ``Irrep`` elements raise on ``len()``, and building that guard fails
    (``InternalTorchDynamoError: NotImplementedError`` from ``e3nn/o3/_irreps.py``). mace
    registers the classes concerned (``nn.Activation`` of its readouts,
    ``NonLinearBiasReadoutBlock``, ``SymmetricContraction``) with ``simplify_if_compile``, and
    ``mace/tools/compile.py`` arranges the same for mace's own compile path, which builds a fresh
    model; ours compiles the model that was built and patched, so it works in place.
    """

    def __init__(self, model):
        from torch.fx import symbolic_trace

        classes = simplify_classes()
        self.swaps = [
            (parent, name, child, symbolic_trace(child))
            for parent in model.modules()
            for name, child in parent.named_children()
            if isinstance(child, classes)
        ]

    def __enter__(self):
        for parent, name, _, traced in self.swaps:
            parent._modules[name] = traced
        return self

    def __exit__(self, *exc):
        for parent, name, child, _ in self.swaps:
            parent._modules[name] = child
        return False


@contextlib.contextmanager
def e3nn_codegen_off():
    """Build e3nn modules without TorchScript code generation (restored after).

    e3nn's code generation (``jit_script_fx``, on by default) makes TorchScript modules, which
    dynamo cannot trace into (``Unsupported: torch.jit.script/freeze modules unsupported``, from
    ``o3.Linear``'s ``_compiled_main``): a model to compile is built inside this context (its
    pickle still holds TorchScript: e3nn scripts the fx modules when saving), and a loaded model
    that holds TorchScript is rebuilt from its configuration (:func:`without_torchscript`)."""
    from e3nn import get_optimization_defaults, set_optimization_defaults

    before = get_optimization_defaults()["jit_script_fx"]
    set_optimization_defaults(jit_script_fx=False)
    try:
        yield
    finally:
        set_optimization_defaults(jit_script_fx=before)


def holds_torchscript(model) -> bool:
    return any(isinstance(m, torch.jit.ScriptModule) for m in model.modules())


def without_torchscript(model):
    """``model``, or, when it holds TorchScript modules (a loaded model built with e3nn's code
    generation), the same model rebuilt from its configuration without them, with its weights
    (every key loaded: a mismatch is an error, not a silently half-loaded model)."""
    if not holds_torchscript(model):
        return model
    from mace.tools.scripts_utils import extract_config_mace_model

    try:
        config = extract_config_mace_model(model)
    except Exception as exc:  # noqa: BLE001 - say which model and what to do
        raise ValueError(
            f"compile: the {type(model).__name__} model holds TorchScript modules (e3nn code "
            f"generation) and its configuration cannot be read to rebuild it without them ({exc}); "
            "use compile=off"
        ) from exc
    param = next(model.parameters())
    from mace.tools.torch_tools import default_dtype

    with (
        e3nn_codegen_off(),
        default_dtype(param.dtype),
    ):  # built in the weights' dtype: loaded exactly
        rebuilt = model.__class__(**config)
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    return rebuilt.to(device=param.device, dtype=param.dtype)


#: what static shapes must know of mace's models
#: (:class:`~cfm_plugins.static_shapes.forward.ModelSpec`)
MACE_SPEC = ModelSpec(
    output_levels=OUTPUT_LEVELS,
    grad_inputs=("positions",),
    prepare=TracedSwaps,
    compiled_kwargs={"training": True},
)
