"""``enable_CFMFused``: NequIP's tensor product + scatter as one fused cfm-plugins kernel.

NequIP builds every message with ``TensorProductScatter`` (``nequip/nn/_tp_scatter_base.py``):
an e3nn "uvu" ``TensorProduct`` on ``x[edge_src]`` with per-edge weights, then a scatter-sum into
``edge_dst``. NequIP swaps that module for faster ones through *model modifiers*
(``enable_OpenEquivariance``, ``enable_CuEquivariance``: GPU only). ``enable_CFMFused`` is one
more modifier of the same class, registered by :mod:`.extension` when nequip is imported, that
swaps in ``CFMFusedTensorProductScatter`` (:func:`fused_class`), which calls
:class:`cfm_plugins.ops.FusedConvTP` without forming per-edge messages. The swap keeps the
state_dict (a checkpoint loads with or without the modifier), and :func:`unfuse` gives the stock
module back. All of a model's ``TensorProductScatter`` modules are swapped or none is
(:func:`fuse`).
"""

from __future__ import annotations

import logging
import weakref

import torch

log = logging.getLogger("cfm_plugins.nequip")

MODIFIER = "enable_CFMFused"


def _root(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


class _EdgeIndexCache:
    """``[2, E]`` (sender, receiver) built once per batch from NequIP's (edge_dst, edge_src).

    NequIP hands every layer two fresh views of the batch's ``edge_index``; FusedConvTP caches
    its receiver/sender sort on the identity of the ``[2, E]`` tensor it gets, so every layer of
    a forward (and their backward) must receive the same stacked tensor to share one sort.
    """

    def __init__(self):
        self._key = None
        self._refs = None
        self._value = None

    def get(self, edge_dst: torch.Tensor, edge_src: torch.Tensor) -> torch.Tensor:
        from cfm_plugins.api import tracing

        if tracing(
            edge_dst
        ):  # torch.compile, nequip-compile (make_fx, torch.export): no identity cache
            return torch.stack([edge_src, edge_dst])
        rd, rs = _root(edge_dst), _root(edge_src)
        key = (
            edge_dst.data_ptr(),
            edge_src.data_ptr(),
            tuple(edge_dst.shape),
            edge_dst.stride(),
            edge_src.stride(),
            rd._version,
            rs._version,
            edge_dst.device,
        )
        if self._key == key and self._refs[0]() is rd and self._refs[1]() is rs:
            return self._value
        value = torch.stack([edge_src, edge_dst])
        self._key, self._refs, self._value = key, (weakref.ref(rd), weakref.ref(rs)), value
        return value


_EDGE_INDEX = _EdgeIndexCache()


def fused_class():
    """The fused subclass of nequip's ``TensorProductScatter`` (built on first use, so that
    importing this module does not import nequip). Its ``tp`` is a ``FusedConvTP`` that shares
    the e3nn module's buffers and compiled submodules (exactly the keys and values of the stock
    ``tp``), so the state_dict is unchanged."""
    global _FUSED_CLS
    if _FUSED_CLS is None:
        from nequip.nn._tp_scatter_base import TensorProductScatter

        class CFMFusedTensorProductScatter(TensorProductScatter):
            """``TensorProductScatter`` whose ``tp`` is a :class:`~cfm_plugins.ops.FusedConvTP`:
            ``forward`` returns the receiver sums directly (same arguments, same result)."""

            def __init__(self, old: TensorProductScatter):
                from cfm_plugins.api import FusedConvTP

                torch.nn.Module.__init__(self)  # the stock __init__ would build a second e3nn TP
                self.feature_irreps_in = old.feature_irreps_in
                self.irreps_edge_attr = old.irreps_edge_attr
                self.irreps_mid = old.irreps_mid
                self.instructions = old.instructions
                self.model_dtype = old.model_dtype
                fused = FusedConvTP.from_e3nn(old.tp)
                fused.train(old.tp.training)
                self.tp = fused
                self.train(old.training)

            def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
                return self.tp(x, edge_attr, edge_weight, _EDGE_INDEX.get(edge_dst, edge_src))

            def to_stock(self) -> TensorProductScatter:
                """The stock module holding this one's (shared) state."""
                stock = TensorProductScatter.__new__(TensorProductScatter)
                torch.nn.Module.__init__(stock)
                for name in (
                    "feature_irreps_in",
                    "irreps_edge_attr",
                    "irreps_mid",
                    "instructions",
                    "model_dtype",
                ):
                    setattr(stock, name, getattr(self, name))
                stock.tp = self.tp.to_e3nn()
                stock.train(self.training)
                return stock

        CFMFusedTensorProductScatter.__module__ = __name__
        _FUSED_CLS = CFMFusedTensorProductScatter
    return _FUSED_CLS


_FUSED_CLS = None


def _restore(fused, parent, attr) -> None:
    _take_radial_back(parent)  # the radial fusion lives in the fused TP: undone with it
    setattr(parent, attr, fused.to_stock())


def form():
    """The kernel table's form for nequip's ``TensorProductScatter`` (kernel ``conv_tp``): the whole
    module (product and scatter) becomes :func:`fused_class`; all of a model's or none."""
    from nequip.nn._tp_scatter_base import TensorProductScatter

    from cfm_plugins.api import Form

    cls = fused_class()

    def make(old, parent, attr):
        if type(old) is not TensorProductScatter:
            raise ValueError(f"it is already a {type(old).__name__} (another modifier)")
        return cls(old)  # FusedConvTP raises ValueError for a product it cannot fuse

    return Form(
        "nequip TensorProductScatter",
        recognise=lambda m, parent, attr: (
            isinstance(m, TensorProductScatter) and not isinstance(m, cls)
        ),
        make=make,
        is_fused=lambda m, parent, attr: isinstance(m, cls),
        restore=_restore,
        all_or_none=True,
    )  # nequip refuses models that mix two subclasses carrying one modifier


def _last_linear(mlp, weight_numel: int):
    """The last layer of nequip's ``ScalarMLPFunction`` ``mlp`` where the radial fusion can make
    it inside the TP: a ``ScalarLinearLayer`` without bias or parametrization whose weight is
    [K, weight_numel]; else ``None``."""
    from nequip.nn.mlp import ScalarLinearLayer

    layers = getattr(mlp, "mlp", None)
    if not isinstance(layers, torch.nn.Sequential) or len(layers) == 0:
        return None  # nequip's DeepLinearMLP (no nonlinearity) multiplies its weights first
    last = layers[len(layers) - 1]
    if (
        type(last) is not ScalarLinearLayer
        or last.bias is not None
        or torch.nn.utils.parametrize.is_parametrized(last)
        or tuple(last.weight.shape[1:]) != (weight_numel,)
    ):
        return None
    return last


def radial_hidden_class():
    """The module that takes the place of an ``InteractionBlock``'s ``edge_mlp`` under the radial
    fusion: the same ``mlp`` (so the same state_dict keys), with a forward that stops before the
    last linear layer; the fused ``TensorProductScatter`` makes that layer inside its kernels."""
    global _RADIAL_CLS
    if _RADIAL_CLS is None:

        class CFMRadialHidden(torch.nn.Module):
            """nequip's ``ScalarMLPFunction`` without its last layer (which the block's fused
            TP applies); holds the stock module (``self.__dict__["_stock"]``) for restore."""

            n_hidden: int

            def __init__(self, old):
                super().__init__()
                self.mlp = old.mlp
                self.n_hidden = len(old.mlp) - 1
                self.__dict__["_stock"] = old
                self.gpu = False

            @torch.jit.unused
            def last_layer(self) -> torch.nn.Module:
                return self.mlp[self.n_hidden]

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                for i, layer in enumerate(self.mlp):
                    if i < self.n_hidden:
                        x = layer(x)
                return x

        CFMRadialHidden.__module__ = __name__
        _RADIAL_CLS = CFMRadialHidden
    return _RADIAL_CLS


_RADIAL_CLS = None


def _take_radial_back(block) -> None:
    """Give ``block`` its stock ``edge_mlp`` back and let its fused TP take weights again."""
    hidden = getattr(block, "edge_mlp", None)
    if _RADIAL_CLS is not None and isinstance(hidden, _RADIAL_CLS):
        block.edge_mlp = hidden.__dict__["_stock"]
    tp = getattr(getattr(block, "tp_scatter", None), "tp", None)
    if getattr(tp, "radial", False):
        tp.use_radial(None)


def radial_form():
    """The kernel table's form for the radial fusion in nequip's ``InteractionBlock`` (kernel
    ``conv_tp_radial``): its ``edge_mlp`` stops at the last hidden layer and the block's fused
    ``TensorProductScatter`` makes the per-edge weights inside its kernels. Needs ``conv_tp``."""
    from nequip.nn._tp_scatter_base import TensorProductScatter
    from nequip.nn.mlp import ScalarMLPFunction

    from cfm_plugins.api import Form

    hidden_cls = radial_hidden_class()

    def recognise(m, parent, attr):
        if attr != "edge_mlp" or parent is None or type(m) is not ScalarMLPFunction:
            return False
        tps = getattr(parent, "tp_scatter", None)
        return isinstance(tps, TensorProductScatter) and (
            _last_linear(m, int(tps.tp.weight_numel)) is not None
        )

    def make(old, parent, attr):
        tps = parent.tp_scatter
        if not isinstance(tps, fused_class()):
            raise ValueError(
                "the radial fusion runs inside the block's fused TensorProductScatter: fuse "
                "conv_tp too (name conv_tp with conv_tp_radial)"
            )
        if tps.tp.radial:
            raise ValueError("the block's fused TensorProductScatter already takes a radial layer")
        return hidden_cls(old)

    def install(parent, attr, hidden):
        setattr(parent, attr, hidden)
        last = hidden.last_layer()
        # nequip's layer multiplies its weight by alpha
        parent.tp_scatter.tp.use_radial(last, gpu=hidden.gpu, norm=1.0 / float(last.alpha))

    def named(hidden):
        hidden.gpu = True

    return Form(
        "nequip InteractionBlock edge_mlp with a fused TensorProductScatter",
        recognise=recognise,
        make=make,
        install=install,
        is_fused=lambda m, parent, attr: isinstance(m, hidden_cls),
        restore=lambda hidden, parent, attr: _take_radial_back(parent),
        named=named,
    )


def register_form() -> None:
    """Put :func:`form` first in the ``conv_tp`` kernel's forms and :func:`radial_form` in the
    ``conv_tp_radial`` kernel's (idempotent), so that every route to the swap (the ``fused``
    plugin's ``cfm_patch_model``, this modifier) fuses the whole module."""
    from cfm_plugins.api import add_form

    add_form("conv_tp", form())
    add_form("conv_tp_radial", radial_form())


def fuse(model: torch.nn.Module) -> int:
    """Swap every ``TensorProductScatter`` of ``model`` (in place) for the fused one, with the
    kernel table. Returns the number swapped: 0 (with a warning saying why) when the model has
    none, or when one of them cannot be fused (then none is: the model runs stock). All or none,
    because nequip refuses models that mix two subclasses carrying the same modifier."""
    from cfm_plugins.api import patch_model

    register_form()
    report = patch_model(model, ("conv_tp",))
    if report.missing:
        log.warning(
            "%s: the model (%s) has no nequip TensorProductScatter module, the module this "
            "modifier replaces; it runs stock",
            MODIFIER,
            type(model).__name__,
        )
    elif report.total:
        log.info("%s: %d TensorProductScatter module(s) fused", MODIFIER, report.total)
    return report.total


def unfuse(model: torch.nn.Module) -> int:
    """Undo :func:`fuse` (in place). Returns the number of modules restored."""
    from cfm_plugins.api import unpatch_model

    register_form()
    return unpatch_model(model, ("conv_tp",)).total


def enable_CFMFused(cls, model):
    """Fuse NequIP's tensor product + scatter with the cfm-plugins kernel (CPU: compiled C++ with
    OpenMP; GPU: CUDA kernel when built). Same results (float64 to round-off), same state_dict.
    Config: ``model: {_target_: nequip.model.modify, modifiers: [{modifier: enable_CFMFused}],
    model: {...}}``."""
    fuse(model)
    return model


def register(tp_scatter_cls) -> None:
    """Put ``enable_CFMFused`` on nequip's ``TensorProductScatter`` as a model modifier."""
    if MODIFIER in tp_scatter_cls.__dict__:
        return
    from nequip.nn.model_modifier_utils import model_modifier

    method = model_modifier(
        persistent=False,  # an acceleration: the same model, faster
        private=False,
        unsupported_devices=[],  # CPU (compiled C++) and CUDA
        # the kernels are C++ torch operators: `nequip-compile --mode aotinductor` (nequip 0.19
        # refuses its torchscript mode on torch >= 2.10) and train-time torch.compile
        supported_compile_modes=["aotinductor"],
    )(classmethod(enable_CFMFused))
    setattr(tp_scatter_cls, MODIFIER, method)
