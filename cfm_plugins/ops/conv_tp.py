"""Fused channelwise tensor product + scatter (MACE/NequIP message construction).

``FusedConvTP.from_e3nn(tp)`` wraps a built e3nn ``TensorProduct`` with "uvu" instructions and
per-edge weights (as ``mace.modules.irreps_tools.tp_out_irreps_with_instructions`` builds it) as a
module called ``m(node_feats, edge_attrs, tp_weights, edge_index)`` that returns, without ever
forming per-edge messages, ::

    scatter_sum(tp(node_feats[sender], edge_attrs, tp_weights), receiver, dim_size=num_nodes)

(``sender, receiver = edge_index``). Called with three arguments it returns e3nn's per-edge output.
It keeps e3nn's attributes (irreps_in1/irreps_in2/irreps_out, instructions, weight_numel) and
exactly the e3nn module's state_dict (its buffers and compiled submodules are shared, not copied).

The math lives in ``descriptors/conv_tp.py``; the kernels in ``cuda/conv_tp`` (CPU: pybind11 +
OpenMP, ``cfm_plugins._C_conv_tp``; CUDA: ``cfm_plugins._C_conv_tp_cuda``). Two custom ops
(namespace ``cfm``) carry autograd: ``tp_conv_fwd`` and ``tp_conv_bwd``; the backward of
``tp_conv_bwd`` is written with both ops again (the form is trilinear), so double (and higher)
backward, gradcheck/gradgradcheck and torch.compile see ordinary operators. Without a compiled
kernel a pure-torch implementation of the same tables runs (index_add based).

``patch_conv_tps(model)`` / ``unpatch_conv_tps(model)`` swap the ``conv_tp`` of mace interaction
blocks in place (the blocks' ``conv_fusion`` seam selects the fused call form).
"""
from __future__ import annotations

import inspect
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from cfm_plugins.ops import _extension
from cfm_plugins.ops.descriptors import conv_tp as _desc

log = logging.getLogger("cfm_plugins.ops")

__all__ = ["FusedConvTP", "patch_conv_tps", "unpatch_conv_tps", "edge_csr", "EdgeCSR"]

KERNEL = "conv_tp"


# ----------------------------------------------------------------------------------------------
# Descriptor registry: custom ops take an int id (hashable, compile-friendly); the entry holds the
# tables, their transpose, and lazily built compiled handles / torch index tensors per device.
# ----------------------------------------------------------------------------------------------
@dataclass
class _Entry:
    fwd: _desc.ConvTPDescriptor
    bwd: _desc.ConvTPDescriptor  # transpose: node-feature gradient
    host: dict = field(default_factory=dict)  # transposed -> compiled CPU descriptor
    cuda: dict = field(default_factory=dict)  # (device index, transposed) -> compiled CUDA descriptor
    torch_tabs: dict = field(default_factory=dict)  # (device, transposed) -> _TorchTables

    def desc(self, transposed: bool) -> _desc.ConvTPDescriptor:
        return self.bwd if transposed else self.fwd


_REGISTRY: list[_Entry] = []
_KEYS: dict[str, int] = {}
_LOCK = threading.Lock()


def register_descriptor(d: _desc.ConvTPDescriptor) -> int:
    """Id of ``d`` for the custom ops (equal tables share one id)."""
    key = d.key()
    with _LOCK:
        if key not in _KEYS:
            _KEYS[key] = len(_REGISTRY)
            _REGISTRY.append(_Entry(fwd=d, bwd=d.transpose()))
        return _KEYS[key]


def _host_handle(entry: _Entry, transposed: bool, ext):
    h = entry.host.get(transposed)
    if h is None:
        d = entry.desc(transposed)
        h = entry.host[transposed] = ext.Descriptor(*d.int_tables(), d.ent_coef.tolist())
    return h


def _cuda_handle(entry: _Entry, transposed: bool, device: torch.device, ext):
    key = (device.index, transposed)
    h = entry.cuda.get(key)
    if h is None:
        d = entry.desc(transposed)
        with torch.cuda.device(device):
            h = entry.cuda[key] = ext.Descriptor(*d.int_tables(), d.ent_coef.tolist())
    return h


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


def _build_csr(edge_index: torch.Tensor, num_nodes: int) -> EdgeCSR:
    ei = edge_index.to(torch.int64)
    # copies, not views: a view would keep edge_index alive and its cache entry with it
    sender, receiver = ei[0].clone(), ei[1].clone()
    nodes = torch.arange(num_nodes + 1, device=ei.device, dtype=torch.int64)
    rperm = torch.argsort(receiver, stable=True)
    sperm = torch.argsort(sender, stable=True)
    rptr = torch.searchsorted(receiver[rperm], nodes)
    sptr = torch.searchsorted(sender[sperm], nodes)
    return EdgeCSR(sender, receiver, rperm, rptr, sperm, sptr)


_CSR_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
_CSR_CACHE_SIZE = 8


def edge_csr(edge_index: torch.Tensor, num_nodes: int) -> EdgeCSR:
    """CSR groupings of ``edge_index`` ([2, E]: sender, receiver), cached on the tensor's identity
    and version: the interaction layers of one forward and their backward share one sort."""
    if torch.compiler.is_compiling():
        return _build_csr(edge_index, num_nodes)
    key = (edge_index.data_ptr(), edge_index._version, tuple(edge_index.shape), edge_index.dtype,
           edge_index.device, int(num_nodes))
    hit = _CSR_CACHE.get(key)
    if hit is not None and hit[0]() is edge_index:
        _CSR_CACHE.move_to_end(key)
        return hit[1]
    csr = _build_csr(edge_index, num_nodes)
    # the entry goes when the edge_index tensor does (the batch is over)
    _CSR_CACHE[key] = (weakref.ref(edge_index, lambda _ref, k=key: _CSR_CACHE.pop(k, None)), csr)
    while len(_CSR_CACHE) > _CSR_CACHE_SIZE:
        _CSR_CACHE.popitem(last=False)
    return csr


# ----------------------------------------------------------------------------------------------
# Backends: compiled CPU, compiled CUDA, pure torch (same tables, same arithmetic order).
# ----------------------------------------------------------------------------------------------
_DTYPE_CODE = {torch.float32: 0, torch.float64: 1}
_CUDA_WARNED = False


def _cuda_ext():
    global _CUDA_WARNED
    ext = _extension.load(KERNEL, cuda=True)
    if ext is None and not _CUDA_WARNED:
        _CUDA_WARNED = True
        import warnings

        warnings.warn("cfm_plugins: the CUDA conv_tp kernel is not built; FusedConvTP runs its pure-torch "
                      "fallback on the GPU (build with CFM_PLUGINS_CUDA=1)", RuntimeWarning, stacklevel=3)
    return ext


def _backend(t: torch.Tensor):
    """('cpu'|'cuda'|'torch', extension module or None) for tensors on t's device."""
    if t.device.type == "cpu":
        ext = _extension.load(KERNEL)
        return ("cpu", ext) if ext is not None else ("torch", None)
    if t.device.type == "cuda":
        ext = _cuda_ext() if not _extension.disabled() else None
        return ("cuda", ext) if ext is not None else ("torch", None)
    return ("torch", None)


class _TorchTables:
    """The descriptor as index tensors on one device, for the pure-torch implementation."""

    def __init__(self, d: _desc.ConvTPDescriptor, device: torch.device):
        i64 = dict(dtype=torch.int64, device=device)
        self.ent_j = torch.as_tensor(d.ent_j, **i64)
        self.ent_coef = torch.as_tensor(d.ent_coef, dtype=torch.float64, device=device)
        counts = (d.pair_ent_start[1:] - d.pair_ent_start[:-1]).astype("int64")
        self.ent_pair = torch.repeat_interleave(torch.arange(d.num_pairs, **i64), torch.as_tensor(counts, **i64))
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


def _tables(entry: _Entry, transposed: bool, device: torch.device) -> _TorchTables:
    key = (str(device), transposed)
    if key not in entry.torch_tabs:
        entry.torch_tabs[key] = _TorchTables(entry.desc(transposed), device)
    return entry.torch_tabs[key]


def _torch_segment(tabs: _TorchTables, node_in, y, w, other, target, n_out):
    out = node_in.new_zeros(n_out, tabs.dim_out)
    E = y.shape[0]
    if E == 0:
        return out
    R = tabs.pair_coefs(y)
    src = node_in.index_select(0, other)
    msg = node_in.new_zeros(E, tabs.dim_out)
    for q0, q1, C, woff, in_idx, out_idx in tabs.paths:
        contrib = (R[:, q0:q1, None] * src[:, in_idx]) * w[:, None, woff:woff + C]
        msg.index_add_(1, out_idx.reshape(-1), contrib.reshape(E, -1))
    return out.index_add_(0, target, msg)


def _torch_edge_grads(tabs: _TorchTables, x, g, y, w, sender, receiver, need_y, need_w):
    E = y.shape[0]
    gy = y.new_zeros(y.shape) if need_y else None
    gw = w.new_zeros(w.shape) if need_w else None
    if E == 0:
        return gy, gw
    R = tabs.pair_coefs(y)
    xs, gr = x.index_select(0, sender), g.index_select(0, receiver)
    D = y.new_zeros(E, tabs.num_pairs) if need_y else None
    for q0, q1, C, woff, in_idx, out_idx in tabs.paths:
        xg = xs[:, in_idx] * gr[:, out_idx]
        if need_w:
            gw[:, woff:woff + C] = (R[:, q0:q1, None] * xg).sum(1)
        if need_y:
            D[:, q0:q1] = (xg * w[:, None, woff:woff + C]).sum(-1)
    if need_y:
        gy.index_add_(1, tabs.ent_j, D[:, tabs.ent_pair] * tabs.ent_coef.to(y.dtype))
    return gy, gw


def _segment(desc_id: int, transposed: bool, node_in, y, w, ptr, perm, other, target, n_out):
    """out[n] = sum over the edges grouped at node n of the message of node_in[other[e]]."""
    entry = _REGISTRY[desc_id]
    d = entry.desc(transposed)
    kind, ext = _backend(node_in)
    if kind == "torch":
        return _torch_segment(_tables(entry, transposed, node_in.device), node_in, y, w, other, target, n_out)
    node_in, y, w = node_in.contiguous(), y.contiguous(), w.contiguous()
    out = node_in.new_zeros(n_out, d.dim_out)
    args = (_DTYPE_CODE[node_in.dtype], n_out, ptr.data_ptr(), perm.data_ptr(), other.data_ptr(),
            node_in.data_ptr(), d.dim_in, y.data_ptr(), d.dim_edge, w.data_ptr(), d.weight_numel,
            out.data_ptr(), d.dim_out)
    if kind == "cpu":
        ext.segment_accumulate(_host_handle(entry, transposed, ext), *args, torch.get_num_threads())
    else:
        ext.segment_accumulate(_cuda_handle(entry, transposed, node_in.device, ext), *args,
                               torch.cuda.current_stream(node_in.device).cuda_stream)
    return out


def _edge_grads(desc_id: int, x, g, y, w, sender, receiver, need_y: bool, need_w: bool):
    entry = _REGISTRY[desc_id]
    d = entry.fwd
    kind, ext = _backend(x)
    if kind == "torch":
        return _torch_edge_grads(_tables(entry, False, x.device), x, g, y, w, sender, receiver, need_y, need_w)
    x, g, y, w = x.contiguous(), g.contiguous(), y.contiguous(), w.contiguous()
    gy = y.new_zeros(y.shape) if need_y else None
    gw = w.new_zeros(w.shape) if need_w else None
    args = (_DTYPE_CODE[x.dtype], y.shape[0], sender.data_ptr(), receiver.data_ptr(), x.data_ptr(), d.dim_in,
            g.data_ptr(), d.dim_out, y.data_ptr(), d.dim_edge, w.data_ptr(), d.weight_numel,
            gy.data_ptr() if need_y else 0, gw.data_ptr() if need_w else 0)
    if kind == "cpu":
        ext.edge_grads(_host_handle(entry, False, ext), *args, torch.get_num_threads())
    else:
        ext.edge_grads(_cuda_handle(entry, False, x.device, ext), *args,
                       torch.cuda.current_stream(x.device).cuda_stream)
    return gy, gw


# ----------------------------------------------------------------------------------------------
# Custom ops and their autograd.
# ----------------------------------------------------------------------------------------------
@torch.library.custom_op("cfm::tp_conv_fwd", mutates_args=())
def tp_conv_fwd(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, sender: torch.Tensor,
                receiver: torch.Tensor, rperm: torch.Tensor, rptr: torch.Tensor, sperm: torch.Tensor,
                sptr: torch.Tensor, desc: int) -> torch.Tensor:
    """Receiver sums of the uvu tensor product (x channel-last, see descriptors/conv_tp.py)."""
    return _segment(desc, False, x, y, w, rptr, rperm, sender, receiver, rptr.shape[0] - 1)


@tp_conv_fwd.register_fake
def _(x, y, w, sender, receiver, rperm, rptr, sperm, sptr, desc):
    return x.new_empty(rptr.shape[0] - 1, _REGISTRY[desc].fwd.dim_out)


@torch.library.custom_op("cfm::tp_conv_bwd", mutates_args=())
def tp_conv_bwd(g: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, sender: torch.Tensor,
                receiver: torch.Tensor, rperm: torch.Tensor, rptr: torch.Tensor, sperm: torch.Tensor,
                sptr: torch.Tensor, desc: int, need_x: bool, need_y: bool,
                need_w: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of tp_conv_fwd w.r.t. x, y, w for output gradient g (an unneeded one is empty)."""
    n = sptr.shape[0] - 1
    if need_x:
        gx = _segment(desc, True, g, y, w, sptr, sperm, receiver, sender, n)
    else:
        gx = x.new_empty(0)
    if need_y or need_w:
        gy, gw = _edge_grads(desc, x, g, y, w, sender, receiver, need_y, need_w)
    else:
        gy = gw = None
    return gx, (gy if gy is not None else y.new_empty(0)), (gw if gw is not None else w.new_empty(0))


@tp_conv_bwd.register_fake
def _(g, x, y, w, sender, receiver, rperm, rptr, sperm, sptr, desc, need_x, need_y, need_w):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0),
            y.new_empty(y.shape) if need_y else y.new_empty(0),
            w.new_empty(w.shape) if need_w else w.new_empty(0))


def _fwd_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zero tensors)
    x, y, w, *idx, desc = inputs
    ctx.save_for_backward(x, y, w, *idx)
    ctx.desc = desc


def _fwd_backward(ctx, g):
    x, y, w, *idx = ctx.saved_tensors
    nx, ny, nw = ctx.needs_input_grad[:3]
    if g is None or not (nx or ny or nw):
        return (None,) * 10
    gx, gy, gw = tp_conv_bwd(g.contiguous(), x, y, w, *idx, ctx.desc, nx, ny, nw)
    return (gx if nx else None, gy if ny else None, gw if nw else None) + (None,) * 7


def _bwd_setup(ctx, inputs, output):
    # Unused outputs (e.g. the weight gradient when only forces are differentiated) must not
    # come back as zero tensors: each would cost a full forward/backward pass below.
    ctx.set_materialize_grads(False)
    g, x, y, w, *rest = inputs
    idx, desc = rest[:6], rest[6]
    ctx.save_for_backward(g, x, y, w, *idx)
    ctx.desc = desc


def _present(a, ref):
    return a is not None and a.shape == ref.shape


def _acc(total, term):
    return term if total is None else total + term


def _bwd_backward(ctx, ax, ay, aw):
    """Double backward. With F(x, y, w) the trilinear form, gx = Fx^T(g, y, w), gy = Fy^T(x, g, w),
    gw = Fw^T(x, y, g); the cotangents (ax, ay, aw) of (gx, gy, gw) give
    dg = F(ax, y, w) + F(x, ay, w) + F(x, y, aw), dx = Fx^T(g, ay, w) + Fx^T(g, y, aw),
    dy = Fy^T(ax, g, w) + Fy^T(x, g, aw), dw = Fw^T(ax, y, g) + Fw^T(x, ay, g)."""
    g, x, y, w, *idx = ctx.saved_tensors
    desc = ctx.desc
    ng, nx, ny, nw = ctx.needs_input_grad[:4]
    hx, hy, hw = _present(ax, x), _present(ay, y), _present(aw, w)
    ax = ax.contiguous() if hx else None
    ay = ay.contiguous() if hy else None
    aw = aw.contiguous() if hw else None
    dg = dx = dy = dw = None
    if ng:
        if hx:
            dg = _acc(dg, tp_conv_fwd(ax, y, w, *idx, desc))
        if hy:
            dg = _acc(dg, tp_conv_fwd(x, ay, w, *idx, desc))
        if hw:
            dg = _acc(dg, tp_conv_fwd(x, y, aw, *idx, desc))
    if hx and (ny or nw):
        _, b_y, b_w = tp_conv_bwd(g, ax, y, w, *idx, desc, False, ny, nw)
        dy = _acc(dy, b_y) if ny else dy
        dw = _acc(dw, b_w) if nw else dw
    if hy and (nx or nw):
        b_x, _, b_w = tp_conv_bwd(g, x, ay, w, *idx, desc, nx, False, nw)
        dx = _acc(dx, b_x) if nx else dx
        dw = _acc(dw, b_w) if nw else dw
    if hw and (nx or ny):
        b_x, b_y, _ = tp_conv_bwd(g, x, y, aw, *idx, desc, nx, ny, False)
        dx = _acc(dx, b_x) if nx else dx
        dy = _acc(dy, b_y) if ny else dy
    return (dg, dx, dy, dw) + (None,) * 10


tp_conv_fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup)
tp_conv_bwd.register_autograd(_bwd_backward, setup_context=_bwd_setup)


# ----------------------------------------------------------------------------------------------
# The module.
# ----------------------------------------------------------------------------------------------
class FusedConvTP(torch.nn.Module):
    """e3nn uvu ``TensorProduct`` + ``scatter_sum`` as one fused op (see module docstring).

    ``forward(node_feats, edge_attrs, tp_weights, edge_index)`` -> ``[num_nodes, irreps_out.dim]``
    receiver sums; ``forward(x1, x2, weights)`` -> e3nn's per-row product (no scatter).
    """

    def __init__(self, tp: torch.nn.Module):
        super().__init__()
        desc, paths = _desc.from_e3nn(tp)
        self.irreps_in1 = tp.irreps_in1
        self.irreps_in2 = tp.irreps_in2
        self.irreps_out = tp.irreps_out
        self.instructions = tp.instructions
        self.weight_numel = tp.weight_numel
        self.shared_weights = False
        self.internal_weights = False
        self._in1_dim = tp.irreps_in1.dim
        self._in2_dim = tp.irreps_in2.dim
        self.descriptor = desc
        self.paths = paths
        self._desc_id = register_descriptor(desc)
        # the e3nn module's state (buffers and compiled submodules) is shared: identical state_dict
        for name, buf in tp._buffers.items():
            self.register_buffer(name, buf, persistent=name not in tp._non_persistent_buffers_set)
        for name, mod in tp._modules.items():
            self.add_module(name, mod)
        self.__dict__["_e3nn_tp"] = tp  # not a submodule: keeps state_dict keys, restored by to_e3nn()
        perm_in = torch.as_tensor(_desc.channel_last_permutation([(m, ir.dim) for m, ir in tp.irreps_in1]))
        perm_out = torch.as_tensor(_desc.channel_last_permutation([(m, ir.dim) for m, ir in tp.irreps_out]))
        self._identity_in = bool(torch.equal(perm_in, torch.arange(len(perm_in))))
        self._identity_out = bool(torch.equal(perm_out, torch.arange(len(perm_out))))
        self.register_buffer("_cl_perm_in", perm_in, persistent=False)
        self.register_buffer("_cl_perm_out_inv", torch.argsort(perm_out), persistent=False)

    @classmethod
    def from_e3nn(cls, tp: torch.nn.Module) -> "FusedConvTP":
        return cls(tp)

    def to_e3nn(self) -> torch.nn.Module:
        """The original e3nn module, holding this module's current buffers and submodules."""
        tp = self.__dict__["_e3nn_tp"]
        for name in list(tp._buffers):
            tp._buffers[name] = self._buffers[name]
        for name in list(tp._modules):
            tp._modules[name] = self._modules[name]
        tp.train(self.training)
        return tp

    def __getstate__(self):
        # The e3nn submodules are TorchScript modules that only e3nn knows how to pickle: leave them
        # to the (synchronised) e3nn module, which travels in the state, and re-attach on load.
        tp = self.to_e3nn()
        state = self.__dict__.copy()
        state["_modules"] = OrderedDict((k, v) for k, v in self._modules.items() if k not in tp._modules)
        state["_cfm_shared_modules"] = list(tp._modules)
        return state

    def __setstate__(self, state):  # also in another process: re-register the tables
        state = dict(state)
        shared = state.pop("_cfm_shared_modules", [])
        super().__setstate__(state)
        tp = self.__dict__["_e3nn_tp"]
        for name in shared:
            self._modules[name] = tp._modules[name]
        self._desc_id = register_descriptor(self.descriptor)

    def extra_repr(self) -> str:
        return (f"{self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} | {self.descriptor.num_paths} paths, "
                f"{self.descriptor.num_pairs} pairs, {self.descriptor.num_entries} CG entries | "
                f"{self.weight_numel} weights per edge")

    def _check(self, x, y, w, edge_index):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and isinstance(w, torch.Tensor)):
            raise ValueError("FusedConvTP: node_feats, edge_attrs and tp_weights must be tensors")
        if x.dtype not in _DTYPE_CODE:
            raise ValueError(f"FusedConvTP: node_feats dtype {x.dtype}; float32 or float64 expected")
        if y.dtype != x.dtype or w.dtype != x.dtype:
            raise ValueError(f"FusedConvTP: dtype mismatch: node_feats {x.dtype}, edge_attrs {y.dtype}, "
                             f"tp_weights {w.dtype}")
        if not (x.device == y.device == w.device == edge_index.device):
            raise ValueError("FusedConvTP: inputs on different devices")
        if x.dim() != 2 or x.shape[1] != self._in1_dim:
            raise ValueError(f"FusedConvTP: node_feats shape {tuple(x.shape)}; expected [num_nodes, "
                             f"{self._in1_dim}] ({self.irreps_in1})")
        if y.dim() != 2 or y.shape[1] != self._in2_dim:
            raise ValueError(f"FusedConvTP: edge_attrs shape {tuple(y.shape)}; expected [num_edges, "
                             f"{self._in2_dim}] ({self.irreps_in2})")
        if w.dim() != 2 or w.shape[1] != self.weight_numel:
            raise ValueError(f"FusedConvTP: tp_weights shape {tuple(w.shape)}; expected [num_edges, "
                             f"{self.weight_numel}] (weight_numel)")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"FusedConvTP: edge_index shape {tuple(edge_index.shape)}; expected [2, num_edges]")
        if edge_index.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"FusedConvTP: edge_index dtype {edge_index.dtype}; int64 or int32 expected")
        E = edge_index.shape[1]
        if y.shape[0] != E or w.shape[0] != E:
            raise ValueError(f"FusedConvTP: {E} edges in edge_index but edge_attrs has {y.shape[0]} rows and "
                             f"tp_weights {w.shape[0]}")
        if E > 0:
            lo, hi = int(edge_index.min()), int(edge_index.max())
            if lo < 0 or hi >= x.shape[0]:
                raise ValueError(f"FusedConvTP: edge_index out of range [{lo}, {hi}] for {x.shape[0]} nodes")

    def forward(self, node_feats: torch.Tensor, edge_attrs: torch.Tensor, tp_weights: torch.Tensor,
                edge_index: torch.Tensor | None = None) -> torch.Tensor:
        per_edge = edge_index is None
        if per_edge:  # e3nn's call form: one "node" per row, sender = receiver = row
            if node_feats.dim() != 2:
                raise ValueError(f"FusedConvTP: x1 shape {tuple(node_feats.shape)}; expected 2-D")
            rows = torch.arange(node_feats.shape[0], device=node_feats.device)
            edge_index = torch.stack([rows, rows])
        if not torch.compiler.is_compiling():
            self._check(node_feats, edge_attrs, tp_weights, edge_index)
        csr = edge_csr(edge_index, node_feats.shape[0])
        x = node_feats if self._identity_in else node_feats.index_select(1, self._cl_perm_in)
        out = tp_conv_fwd(x.contiguous(), edge_attrs.contiguous(), tp_weights.contiguous(), csr.sender,
                          csr.receiver, csr.rperm, csr.rptr, csr.sperm, csr.sptr, self._desc_id)
        return out if self._identity_out else out.index_select(1, self._cl_perm_out_inv)


# ----------------------------------------------------------------------------------------------
# Model patching (mace interaction blocks).
# ----------------------------------------------------------------------------------------------
_SEAM_CACHE: dict[type, bool] = {}


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


def _is_e3nn_tp(m) -> bool:
    try:
        from e3nn import o3
    except ImportError:  # pragma: no cover - e3nn comes with every trainer we patch
        return False
    return isinstance(m, o3.TensorProduct)


def patch_conv_tps(model: torch.nn.Module) -> int:
    """Swap (in place) every interaction block's e3nn ``conv_tp`` for :class:`FusedConvTP` and set
    the block's ``conv_fusion`` attribute so it calls ``conv_tp(node_feats, edge_attrs, tp_weights,
    edge_index)``. state_dict keys and values are unchanged. Returns the number of swaps."""
    n = 0
    for block in model.modules():
        tp = getattr(block, "conv_tp", None)
        if not isinstance(block, torch.nn.Module) or not _is_e3nn_tp(tp):
            continue
        if hasattr(block, "conv_fusion"):
            log.warning("%s already has conv_fusion=%r but an e3nn conv_tp; left as is",
                        type(block).__name__, block.conv_fusion)
            continue
        if not _reads_conv_fusion(block):
            log.warning("%s.forward does not read conv_fusion; its conv_tp is left unfused", type(block).__name__)
            continue
        try:
            fused = FusedConvTP.from_e3nn(tp)
        except ValueError as exc:
            log.warning("%s.conv_tp not fused: %s", type(block).__name__, exc)
            continue
        fused.train(tp.training)
        block.conv_tp = fused
        block.conv_fusion = "cfm_plugins"
        n += 1
    return n


def unpatch_conv_tps(model: torch.nn.Module) -> int:
    """Undo :func:`patch_conv_tps` (in place). Returns the number of modules restored."""
    n = 0
    for block in model.modules():
        fused = getattr(block, "conv_tp", None)
        if not isinstance(fused, FusedConvTP):
            continue
        block.conv_tp = fused.to_e3nn()
        if getattr(block, "conv_fusion", None) == "cfm_plugins":
            del block.conv_fusion
        n += 1
    return n
