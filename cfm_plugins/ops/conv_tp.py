"""Fused channelwise tensor product + scatter (MACE/NequIP message construction).

``FusedConvTP.from_e3nn(tp)`` wraps a built e3nn ``TensorProduct`` with "uvu" instructions and
per-edge weights (as ``mace.modules.irreps_tools.tp_out_irreps_with_instructions`` builds it) as a
module called ``m(node_feats, edge_attrs, tp_weights, edge_index)`` that returns
``scatter_sum(tp(node_feats[sender], edge_attrs, tp_weights), receiver, dim_size=num_nodes)``
(``sender, receiver = edge_index``) without ever forming per-edge messages. Called with three
arguments it returns e3nn's per-edge output. It keeps e3nn's attributes and exactly the e3nn
module's state_dict (its buffers and compiled submodules are shared, not copied). The math is
the descriptor's (:mod:`cfm_plugins.ops.descriptors.conv_tp`); the kernels are the torch operators
``cfm::conv_tp_fwd`` and ``cfm::conv_tp_bwd`` (:class:`FusedConvTP` says more).

:data:`KERNEL` is this kernel's entry in the kernel table (:mod:`cfm_plugins.ops.kernel_table`):
the ``conv_tp`` of MACE interaction blocks (their ``conv_fusion`` seam selects the fused call
form), then any other uvu tensor product with per-edge weights, whatever its class.
"""

import inspect
import logging
from dataclasses import dataclass

import numpy as np
import torch

from cfm_plugins.ops import _backend
from cfm_plugins.ops._fused_module import FusedE3nnModule, module_device
from cfm_plugins.ops._tensor_cache import TensorCache
from cfm_plugins.ops.descriptors import conv_tp as _desc
from cfm_plugins.ops.kernel_types import Form, Kernel
from cfm_plugins.ops.silu import restore_radial_silu, swap_radial_silu

log = logging.getLogger("cfm_plugins.ops")

# the cfm:: operators must exist before a model holding these modules is scripted or exported
_backend.declare_operators()

__all__ = ["FusedConvTP", "KERNEL", "is_uvu_conv_tp", "edge_csr", "EdgeCSR"]


# ----------------------------------------------------------------------------------------------
# Edge grouping (CSR by receiver for the forward, by sender for the node-feature gradient),
# computed once per edge_index and reused by every layer and by the backward.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EdgeCSR:
    sender: torch.Tensor  # [E] int64
    receiver: torch.Tensor  # [E] int64
    rperm: torch.Tensor  # [E] edges sorted by receiver (stable)
    rptr: torch.Tensor  # [N+1]
    sperm: torch.Tensor  # [E] edges sorted by sender (stable)
    sptr: torch.Tensor  # [N+1]


def _graph_tensors(edge_index: torch.Tensor, num_nodes: int) -> list[torch.Tensor]:
    """[sender, receiver, rperm, rptr, sperm, sptr] of the operators (TorchScript-compatible)."""
    ei = edge_index.to(torch.int64)
    # copies, not views: a view would keep edge_index alive and its cache entry with it
    sender, receiver = ei[0].clone(), ei[1].clone()
    nodes = torch.arange(num_nodes + 1, device=ei.device, dtype=torch.int64)
    rperm = torch.argsort(receiver, stable=True)
    sperm = torch.argsort(sender, stable=True)
    rptr = torch.searchsorted(receiver[rperm], nodes)
    sptr = torch.searchsorted(sender[sperm], nodes)
    return [sender, receiver, rperm, rptr, sperm, sptr]


def _build_csr(edge_index: torch.Tensor, num_nodes: int) -> EdgeCSR:
    return EdgeCSR(*_graph_tensors(edge_index, num_nodes))


_CSR_CACHE = TensorCache(8)


def _check_range(edge_index: torch.Tensor, num_nodes: int) -> None:
    """A ValueError if an index of edge_index is not a node: one device-to-host copy (on a GPU, a
    wait for the queued kernels) per edge_index, not per layer."""
    if edge_index.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(edge_index)).tolist()
    if lo < 0 or hi >= num_nodes:
        raise ValueError(f"FusedConvTP: edge_index out of range [{lo}, {hi}] for {num_nodes} nodes")


def edge_csr(edge_index: torch.Tensor, num_nodes: int) -> EdgeCSR:
    """CSR groupings of ``edge_index`` ([2, E]: sender, receiver), cached on the tensor's identity
    and version: the interaction layers of one forward and their backward share one sort and one
    range check (eager; a ValueError names an index that is not a node)."""
    if _backend.tracing(edge_index):
        return _build_csr(edge_index, num_nodes)

    def make() -> EdgeCSR:
        _check_range(edge_index, num_nodes)
        return _build_csr(edge_index, num_nodes)

    return _CSR_CACHE.get(edge_index, int(num_nodes), make)


# ----------------------------------------------------------------------------------------------
# Pure-torch fallback (same tables, same arithmetic order; autograd does every derivative).
# ----------------------------------------------------------------------------------------------


class _TorchTables:
    """The descriptor as index tensors on one device, for the pure-torch implementation."""

    def __init__(self, d: _desc.ConvTPDescriptor, device: torch.device):
        i64 = dict(dtype=torch.int64, device=device)
        self.ent_j = torch.as_tensor(d.ent_j, **i64)
        self.ent_coef = torch.as_tensor(d.ent_coef, dtype=torch.float64, device=device)
        counts = (d.pair_ent_start[1:] - d.pair_ent_start[:-1]).astype("int64")
        self.ent_pair = torch.repeat_interleave(
            torch.arange(d.num_pairs, **i64), torch.as_tensor(counts, **i64)
        )
        self.paths = []
        for p in range(d.num_paths):
            q0, q1 = int(d.path_pair_start[p]), int(d.path_pair_start[p + 1])
            C, woff = int(d.path_mul[p]), int(d.path_woff[p])
            ch = torch.arange(C, **i64)
            in_idx = torch.as_tensor(d.pair_in[q0:q1], **i64)[:, None] + ch
            out_idx = torch.as_tensor(d.pair_out[q0:q1], **i64)[:, None] + ch
            self.paths.append((q0, q1, C, woff, in_idx, out_idx))
        self.num_pairs = d.num_pairs
        self.dim_out, self.dim_edge = d.dim_out, d.dim_edge

    def pair_coefs(self, y: torch.Tensor) -> torch.Tensor:
        R = y.new_zeros(y.shape[0], self.num_pairs)
        return R.index_add_(1, self.ent_pair, y[:, self.ent_j] * self.ent_coef.to(y.dtype))


def _torch_segment(tabs: _TorchTables, node_in, y, w, other, target, n_out):
    out = node_in.new_zeros(n_out, tabs.dim_out)
    E = y.shape[0]
    if E == 0:
        return out
    R = tabs.pair_coefs(y)
    src = node_in.index_select(0, other)
    msg = node_in.new_zeros(E, tabs.dim_out)
    for q0, q1, C, woff, in_idx, out_idx in tabs.paths:
        contrib = (R[:, q0:q1, None] * src[:, in_idx]) * w[:, None, woff : woff + C]
        msg.index_add_(1, out_idx.reshape(-1), contrib.reshape(E, -1))
    return out.index_add_(0, target, msg)


# ----------------------------------------------------------------------------------------------
# The channel-last reorderings around the operators.
# ----------------------------------------------------------------------------------------------
class _ColumnPermutation(torch.autograd.Function):
    """``t[:, perm]`` whose gradient is ``g[:, inv]`` (``inv`` the inverse permutation): a gather
    again. ``index_select``'s own backward zero-fills a ``[rows, columns]`` tensor and scatters
    into it (``index_add``): two passes and two launches per call, more in force training's double
    backward, around every conv TP whose irreps are not all scalars. Its derivatives are this
    function again, so every order exists."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, perm: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(perm, inv)
        return t.index_select(1, perm)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        perm, inv = ctx.saved_tensors
        return _ColumnPermutation.apply(g, inv, perm), None, None


# ----------------------------------------------------------------------------------------------
# The module.
# ----------------------------------------------------------------------------------------------
class FusedConvTP(FusedE3nnModule):
    """e3nn uvu ``TensorProduct`` + ``scatter_sum`` as one fused op (see module docstring).

    It keeps e3nn's attributes (irreps_in1/irreps_in2/irreps_out, instructions, weight_numel).
    The kernels (``cuda/conv_tp``) are two torch operators declared in C++
    (``cuda/conv_tp/conv_tp_ops*.cpp``), ``cfm::conv_tp_fwd`` and ``cfm::conv_tp_bwd``, with CPU,
    CUDA and Meta kernels and a C++ autograd whose backward of ``conv_tp_bwd`` is written with
    both operators again (the form is trilinear), so double (and higher) backward,
    gradcheck/gradgradcheck, torch.compile, TorchScript and torch.export see ordinary operators.
    The descriptor tables are module buffers (they follow ``.to()``). Without the compiled
    library a pure-torch implementation of the same tables runs (index_add based; autograd does
    the derivatives); :mod:`cfm_plugins.ops._backend` chooses.

    ``forward(node_feats, edge_attrs, tp_weights, edge_index)`` -> ``[num_nodes, irreps_out.dim]``
    receiver sums; ``forward(x1, x2, weights)`` -> e3nn's per-row product (no scatter).
    Every tensor it owns is a buffer created on ``device`` (default: where ``tp`` lives), so it
    follows ``.to()``; ``forward`` is TorchScript-compatible.
    """

    OPERATORS = "conv_tp"
    PREFIX = "_tp"
    #: the pure-torch path's tables, rebuilt after a move
    DERIVED = ("_torch_tabs",)
    #: the radial fusion (:mod:`cfm_plugins.ops.conv_tp_radial`, :meth:`use_radial`): ``tp_weights``
    #: is the radial MLP's last hidden layer h [E, K]; the weights are ``h @ (radial_weight /
    #: radial_norm)``, made inside ``cfm::conv_tp_radial_*`` and never stored
    radial: bool
    radial_gpu: bool
    radial_norm: float

    def __init__(self, tp: torch.nn.Module, device: torch.device | None = None):
        desc, paths = _desc.from_e3nn(tp)
        super().__init__(tp, desc, device)  # weights are inputs: none shared
        self.shared_weights = False
        self.internal_weights = False
        self.paths = paths
        perm_in = _desc.channel_last_permutation([(m, ir.dim) for m, ir in tp.irreps_in1])
        perm_out = _desc.channel_last_permutation([(m, ir.dim) for m, ir in tp.irreps_out])
        self._identity_in = bool((perm_in == np.arange(len(perm_in))).all())
        self._identity_out = bool((perm_out == np.arange(len(perm_out))).all())
        i64 = dict(dtype=torch.int64, device=self._tp_ints.device)
        self.register_buffer("_cl_perm_in", torch.as_tensor(perm_in, **i64), persistent=False)
        self.register_buffer(
            "_cl_perm_in_inv", torch.as_tensor(np.argsort(perm_in), **i64), persistent=False
        )
        self.register_buffer("_cl_perm_out", torch.as_tensor(perm_out, **i64), persistent=False)
        self.register_buffer(
            "_cl_perm_out_inv", torch.as_tensor(np.argsort(perm_out), **i64), persistent=False
        )
        self.__dict__["_torch_tabs"] = {}
        self.use_radial(None)

    @torch.jit.unused
    def use_radial(
        self, layer: torch.nn.Module | None, gpu: bool = False, norm: float | None = None
    ) -> None:
        """Take the per-edge weights as ``h @ (layer.weight / norm)`` from now on, with ``h``
        passed in place of ``tp_weights``; ``None`` goes back to ``tp_weights``. ``layer``: the
        last, linear layer of the radial MLP (weight [K, weight_numel]); ``norm`` defaults to the
        scale e3nn's ``FullyConnectedNet`` divides its weight by. The layer's parameter is
        referenced, not registered: the state_dict stays the model's. ``gpu``: run the radial
        kernels on CUDA tensors too (Triton); else the weights are made there with a GEMM first."""
        self.radial = layer is not None
        self.radial_gpu = bool(gpu) and layer is not None
        # plain attributes (the block's radial MLP owns the parameter, not this module); eager
        # forwards read the layer's weight when they run, so torch.func.functional_call's
        # substitutes reach the kernels too
        self.__dict__["radial_layer"] = layer
        self.__dict__["radial_weight"] = layer.weight if layer is not None else torch.empty(0)
        if layer is None:
            norm = 1.0
        elif norm is None:
            norm = (layer.h_in * layer.var_in / layer.var_out) ** 0.5
        self.radial_norm = float(norm)

    def extra_repr(self) -> str:
        return (
            f"{self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} | "
            f"{self.descriptor.num_paths} paths, {self.descriptor.num_pairs} pairs, "
            f"{self.descriptor.num_entries} CG entries | {self.weight_numel} weights per edge"
        )

    # -- eager-only helpers (a scripted model skips the checks and always runs the operators) --
    @torch.jit.unused
    def _check(self, x, y, w, edge_index):
        floats = {"node_feats": x, "edge_attrs": y, "tp_weights": w}
        self._check_floats(floats)
        self._check_devices({**floats, "edge_index": edge_index}, self._tp_ints.device, "tables")
        self._check_shape("node_feats", x, ("num_nodes", self._in1_dim), str(self.irreps_in1))
        self._check_shape("edge_attrs", y, ("num_edges", self._in2_dim), str(self.irreps_in2))
        if self.radial:
            K = self.radial_weight.shape[0]
            self._check_shape(
                "tp_weights", w, ("num_edges", K), "the radial MLP's last hidden layer"
            )
        else:
            self._check_shape("tp_weights", w, ("num_edges", self.weight_numel), "weight_numel")
        self._check_shape("edge_index", edge_index, (2, "num_edges"))
        if edge_index.dtype not in (torch.int64, torch.int32):
            raise ValueError(
                f"FusedConvTP: edge_index dtype {edge_index.dtype}; int64 or int32 expected"
            )
        E = edge_index.shape[1]
        if y.shape[0] != E or w.shape[0] != E:
            raise ValueError(
                f"FusedConvTP: {E} edges in edge_index but edge_attrs has {y.shape[0]} rows and "
                f"tp_weights {w.shape[0]}"
            )
        # the range of edge_index is checked once per edge_index, where its CSR is built (edge_csr)

    @torch.jit.unused
    def _eager_graph(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, edge_index: torch.Tensor
    ) -> tuple[list[torch.Tensor], bool]:
        """(graph tensors from the shared CSR cache, whether the compiled operators run)."""
        if not _backend.tracing(edge_index):
            self._check(x, y, w, edge_index)
        csr = edge_csr(edge_index, x.shape[0])
        graph = [csr.sender, csr.receiver, csr.rperm, csr.rptr, csr.sperm, csr.sptr]
        return graph, _backend.choose(x.device) != "torch"

    @torch.jit.unused
    def _eager_reorder(self, t: torch.Tensor, to_channel_last: bool) -> torch.Tensor:
        """``t`` (node rows) from e3nn's layout to channel-last or back: a gather, with gathers as
        derivatives (:class:`_ColumnPermutation`); traced, ``index_select`` (the compiler
        differentiates and fuses it itself)."""
        if _backend.tracing(t):
            perm = self._cl_perm_in if to_channel_last else self._cl_perm_out_inv
            return t.index_select(1, perm)
        if to_channel_last:
            return _ColumnPermutation.apply(t, self._cl_perm_in, self._cl_perm_in_inv)
        return _ColumnPermutation.apply(t, self._cl_perm_out_inv, self._cl_perm_out)

    @torch.jit.unused
    def _torch_forward(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, graph: list[torch.Tensor]
    ) -> torch.Tensor:
        key = str(x.device)
        tabs = self.__dict__["_torch_tabs"].get(key)
        if tabs is None:
            tabs = self.__dict__["_torch_tabs"][key] = _TorchTables(self.descriptor, x.device)
        return _torch_segment(tabs, x, y, w, graph[0], graph[1], graph[3].shape[0] - 1)

    def forward(
        self,
        node_feats: torch.Tensor,
        edge_attrs: torch.Tensor,
        tp_weights: torch.Tensor,
        edge_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if edge_index is None:  # e3nn's call form: one "node" per row, sender = receiver = row
            rows = torch.arange(node_feats.shape[0], device=node_feats.device)
            edge_index = torch.stack([rows, rows])
        if torch.jit.is_scripting():
            graph = _graph_tensors(edge_index, node_feats.shape[0])
            use_ops = (
                True  # a scripted model runs the cfm:: operators (their library must be loaded)
            )
        else:
            graph, use_ops = self._eager_graph(node_feats, edge_attrs, tp_weights, edge_index)
        scripting = torch.jit.is_scripting()
        if self._identity_in:
            x = node_feats
        elif scripting:
            x = node_feats.index_select(1, self._cl_perm_in)
        else:
            x = self._eager_reorder(node_feats, True)
        x, y, w = x.contiguous(), edge_attrs.contiguous(), tp_weights.contiguous()
        if self.radial:
            weight = self.radial_weight if scripting else self._radial_weight_now()
            wr = weight / self.radial_norm  # as the MLP's layer scales its weight
            if use_ops and (
                x.device.type == "cpu"
                or (not scripting and self.radial_gpu and self._radial_triton(x))
            ):
                out = torch.ops.cfm.conv_tp_radial_fwd(
                    x,
                    y,
                    w,
                    wr.contiguous(),
                    graph,
                    [self._tp_ints, self._tp_coef],
                    [self._tp_ints_t, self._tp_coef_t],
                    self._tp_meta,
                )
                return self._to_e3nn_layout(out, scripting)
            w = w @ wr  # the weights first, then the plain kernel (no radial kernel here)
        if use_ops:
            out = torch.ops.cfm.conv_tp_fwd(
                x,
                y,
                w,
                graph,
                [self._tp_ints, self._tp_coef],
                [self._tp_ints_t, self._tp_coef_t],
                self._tp_meta,
            )
        else:
            out = self._torch_forward(x, y, w, graph)
        return self._to_e3nn_layout(out, scripting)

    @torch.jit.unused
    def _radial_weight_now(self) -> torch.Tensor:
        """The radial layer's weight as its module holds it now."""
        return self.__dict__["radial_layer"].weight

    @torch.jit.unused
    def _radial_triton(self, x: torch.Tensor) -> bool:
        """Whether the radial operators have Triton kernels for ``x``'s device."""
        from cfm_plugins.ops import triton as triton_kernels

        return _backend.runs_triton(x.device) and "conv_tp_radial_fwd" in triton_kernels.OPERATORS

    def _to_e3nn_layout(self, out: torch.Tensor, scripting: bool) -> torch.Tensor:
        """The operators' channel-last output in e3nn's layout."""
        if self._identity_out:
            return out
        if scripting:
            return out.index_select(1, self._cl_perm_out_inv)
        return self._eager_reorder(out, False)


# ----------------------------------------------------------------------------------------------
# The kernel table entry: MACE's interaction blocks (fused scatter), then any uvu tensor product.
# ----------------------------------------------------------------------------------------------
_SEAM_CACHE: dict[type, bool] = {}

#: the value of a block's ``conv_fusion`` attribute when this module set it
CONV_FUSION = "cfm_plugins"


def _reads_conv_fusion(block: torch.nn.Module) -> bool:
    """Whether the block's forward takes the fused call form when it has ``conv_fusion``
    (mace-torch >= 0.3.14 interaction blocks: ``if hasattr(self, "conv_fusion")``)."""
    cls = type(block)
    if cls not in _SEAM_CACHE:
        try:
            _SEAM_CACHE[cls] = "conv_fusion" in inspect.getsource(cls.forward)
        except (OSError, TypeError):
            _SEAM_CACHE[cls] = False
    return _SEAM_CACHE[cls]


def is_uvu_conv_tp(m) -> bool:
    """An e3nn-interface tensor product (``irreps_in1``, ``irreps_in2``, ``irreps_out``,
    ``instructions``, ``weight_numel``) with only "uvu" paths and per-edge weights (neither
    internal nor shared), whatever its class: what :class:`FusedConvTP` reads."""
    if isinstance(m, FusedConvTP) or not isinstance(m, torch.nn.Module):
        return False
    if not all(
        hasattr(m, a)
        for a in ("irreps_in1", "irreps_in2", "irreps_out", "instructions", "weight_numel")
    ):
        return False
    ins = list(m.instructions or [])
    if not ins or any(getattr(i, "connection_mode", None) != "uvu" for i in ins):
        return False
    return not getattr(m, "internal_weights", True) and not getattr(m, "shared_weights", True)


def _is_block_conv_tp(m, parent, attr) -> bool:
    return (
        attr == "conv_tp"
        and parent is not None
        and is_uvu_conv_tp(m)
        and _reads_conv_fusion(parent)
    )


def _make_for_block(tp, block, attr) -> FusedConvTP:
    if hasattr(block, "conv_fusion"):
        raise ValueError(
            f"{type(block).__name__} already has conv_fusion={block.conv_fusion!r} beside an e3nn "
            "conv_tp (another kernel swap?)"
        )
    # on the block's device: patching a model already on a GPU keeps everything there
    return FusedConvTP.from_e3nn(tp, device=module_device(block))


def _install_in_block(block, attr, fused) -> None:
    setattr(block, attr, fused)
    block.conv_fusion = (
        CONV_FUSION  # the block now calls conv_tp(node_feats, edge_attrs, tp_weights, edge_index)
    )
    swap_radial_silu(
        block
    )  # the radial MLP computing tp_weights: a lean double backward (ops/silu.py)


def _restore_in_block(fused, block, attr) -> None:
    if fused.radial:  # the radial MLP (conv_tp_radial.RadialHidden) stops at h for this module only
        stock = getattr(block, "conv_tp_weights", None).__dict__.get("_stock")
        if stock is not None:
            block.conv_tp_weights = stock
        fused.use_radial(None)
    setattr(block, attr, fused.to_e3nn())
    restore_radial_silu(block)
    if getattr(block, "conv_fusion", None) == CONV_FUSION:
        del block.conv_fusion


KERNEL = Kernel(
    "conv_tp",
    "the channelwise (uvu) conv tensor product with its scatter to the receivers",
    (
        # MACE interaction blocks (and vendored copies) whose forward reads conv_fusion: one fused
        # gather + product + scatter, no per-edge message tensor
        Form(
            "block conv_tp with the conv_fusion seam",
            recognise=_is_block_conv_tp,
            make=_make_for_block,
            install=_install_in_block,
            is_fused=lambda m, parent, attr: (
                isinstance(m, FusedConvTP) and getattr(parent, "conv_fusion", None) == CONV_FUSION
            ),
            restore=_restore_in_block,
        ),
        # any other uvu tensor product with per-edge weights: e3nn's call form (no scatter)
        Form(
            "e3nn uvu tensor product",
            recognise=lambda m, parent, attr: is_uvu_conv_tp(m),
            make=lambda m, parent, attr: FusedConvTP.from_e3nn(m),
            is_fused=lambda m, parent, attr: isinstance(m, FusedConvTP),
            restore=lambda fused, parent, attr: setattr(parent, attr, fused.to_e3nn()),
        ),
    ),
)
