"""Fused symmetric contraction (MACE's product basis) as a torch module and custom ops.

:class:`FusedSymmetricContraction` is a drop-in for ``mace.modules.symmetric_contraction.
SymmetricContraction``: same call ``forward(x, y)`` (x ``[nodes, channels, num_ell]``, y one-hot
``[nodes, num_elements]`` or integer element indices ``[nodes]``), same output layout, and it
*shares* the mace module's ``contractions`` (weights, U buffers, ``*_zeroed`` flags), so a
state_dict saved with or without the plugin loads into either.

Per call the weights are folded into per-element coefficients ``coeff[e, term, c]`` (only the
elements present), then one fused kernel evaluates the sparse polynomial of the descriptor
(:mod:`cfm_plugins.ops.descriptors.symmetric_contraction`) per node and channel. Backward and
double backward are fused kernels of the same descriptor, registered as ``torch.library`` custom
ops ``cfm::sc_fwd``, ``cfm::sc_bwd``, ``cfm::sc_bwd2`` (autograd, fake tensors, torch.compile).
Kernels: ``cfm_plugins._C_symmetric_contraction`` (CPU) and ``..._cuda`` (CUDA); where one is
missing (or ``CFM_PLUGINS_FORCE_TORCH=1``) a pure-torch evaluation of the same descriptor runs.

``patch_symmetric_contractions(model)`` / ``unpatch_symmetric_contractions(model)`` swap every
mace ``SymmetricContraction`` in a built model in place (and back).
"""
from __future__ import annotations

import logging
from typing import List, Optional

import torch

from cfm_plugins.ops import _extension
from cfm_plugins.ops.descriptors.symmetric_contraction import SCDescriptor, build_descriptor

__all__ = [
    "FusedSymmetricContraction",
    "patch_symmetric_contractions",
    "unpatch_symmetric_contractions",
]

log = logging.getLogger("cfm_plugins.ops")

KERNEL = "symmetric_contraction"
CHANNEL_TILE = 16  # coefficient tensors are padded to a multiple of this many channels
CHUNK = 128  # nodes per kernel work unit (all of one element)
_INT_NAMES = ("parent", "last", "slot", "term_ptr", "term_row", "term_out", "out_base", "out_stride")
_WARNED_CUDA = False


# ----------------------------------------------------------------------------------------------
# Kernel dispatch (raw pointers into the compiled modules)
# ----------------------------------------------------------------------------------------------

def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _ext_for(device: torch.device):
    """The compiled module for ``device``, or None (then the caller uses the torch fallback)."""
    global _WARNED_CUDA
    if device.type == "cpu":
        return _extension.load(KERNEL)
    if device.type == "cuda":
        mod = _extension.load(KERNEL, cuda=True)
        if mod is None and not _WARNED_CUDA and not _extension.disabled():
            _WARNED_CUDA = True
            log.warning("FusedSymmetricContraction: the CUDA kernel is not built; CUDA tensors use the "
                        "pure-torch fallback (slow). To %s", _extension.BUILD_HINT)
        return mod
    return None


def _call_args(desc: List[torch.Tensor], meta: List[int], elem, order, chunk_ptr):
    L, J, S, O, out_dim, R, C, Cp = meta
    d = [L, J, S, O, out_dim, R] + [t.data_ptr() for t in desc]
    sizes = [C, Cp, chunk_ptr.numel() - 1, torch.get_num_threads()]
    return d, sizes, [elem.data_ptr(), order.data_ptr(), chunk_ptr.data_ptr()]


def _run(name: str, x: torch.Tensor, d, sizes, index, *ptrs):
    ext = _ext_for(x.device)
    if ext is None:
        raise RuntimeError(f"cfm::sc_{name}: no compiled kernel for {x.device.type} ({_extension.BUILD_HINT})")
    dtype = str(x.dtype).replace("torch.", "")
    if x.device.type == "cuda":
        stream = torch.cuda.current_stream(x.device).cuda_stream
        getattr(ext, name)(dtype, d, sizes, index, *ptrs, stream)
    else:
        getattr(ext, name)(dtype, d, sizes, index, *ptrs)


# ----------------------------------------------------------------------------------------------
# Custom ops
# ----------------------------------------------------------------------------------------------

@torch.library.custom_op("cfm::sc_fwd", mutates_args=())
def sc_fwd(x: torch.Tensor, coeff: torch.Tensor, elem: torch.Tensor, order: torch.Tensor,
           chunk_ptr: torch.Tensor, desc: List[torch.Tensor], meta: List[int]) -> torch.Tensor:
    """out[n, :] of the descriptor's polynomial (x [N, C, L], coeff [E', R, Cp], elem [N] rows)."""
    out = x.new_empty(x.shape[0], meta[4])
    if x.shape[0]:
        _run("forward", x, *_call_args(desc, meta, elem, order, chunk_ptr), x.data_ptr(), coeff.data_ptr(),
             out.data_ptr())
    return out


@sc_fwd.register_fake
def _(x, coeff, elem, order, chunk_ptr, desc, meta):
    return x.new_empty(x.shape[0], meta[4])


@torch.library.custom_op("cfm::sc_bwd", mutates_args=())
def sc_bwd(gout: torch.Tensor, x: torch.Tensor, coeff: torch.Tensor, elem: torch.Tensor, order: torch.Tensor,
           chunk_ptr: torch.Tensor, desc: List[torch.Tensor], meta: List[int], need_gx: bool,
           need_gc: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of sc_fwd w.r.t. x and coeff (empty tensors where not needed)."""
    gx = torch.empty_like(x) if need_gx else x.new_empty(0)
    gc = torch.zeros_like(coeff) if need_gc else coeff.new_empty(0)
    if x.shape[0] and (need_gx or need_gc):
        _run("backward", x, *_call_args(desc, meta, elem, order, chunk_ptr), x.data_ptr(), coeff.data_ptr(),
             gout.data_ptr(), gx.data_ptr() if need_gx else 0, gc.data_ptr() if need_gc else 0)
    elif need_gx:
        gx.zero_()
    return gx, gc


@sc_bwd.register_fake
def _(gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc):
    return (torch.empty_like(x) if need_gx else x.new_empty(0),
            torch.empty_like(coeff) if need_gc else coeff.new_empty(0))


@torch.library.custom_op("cfm::sc_bwd2", mutates_args=())
def sc_bwd2(gout: torch.Tensor, x: torch.Tensor, coeff: torch.Tensor, dx: Optional[torch.Tensor],
            dcoeff: Optional[torch.Tensor], elem: torch.Tensor, order: torch.Tensor, chunk_ptr: torch.Tensor,
            desc: List[torch.Tensor], meta: List[int], need_ggout: bool, need_gx: bool,
            need_gc: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of sc_bwd w.r.t. (gout, x, coeff) given the grads (dx, dcoeff) of its outputs."""
    ggout = gout.new_empty(gout.shape) if need_ggout else gout.new_empty(0)
    gx2 = torch.empty_like(x) if need_gx else x.new_empty(0)
    gc2 = torch.zeros_like(coeff) if need_gc else coeff.new_empty(0)
    if x.shape[0] and (need_ggout or need_gx or need_gc):
        _run("double_backward", x, *_call_args(desc, meta, elem, order, chunk_ptr), x.data_ptr(), _ptr(dx),
             coeff.data_ptr(), _ptr(dcoeff), gout.data_ptr(), ggout.data_ptr() if need_ggout else 0,
             gx2.data_ptr() if need_gx else 0, gc2.data_ptr() if need_gc else 0)
    else:
        ggout.zero_()
        gx2.zero_()
    return ggout, gx2, gc2


@sc_bwd2.register_fake
def _(gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc, meta, need_ggout, need_gx, need_gc):
    return (gout.new_empty(gout.shape) if need_ggout else gout.new_empty(0),
            torch.empty_like(x) if need_gx else x.new_empty(0),
            torch.empty_like(coeff) if need_gc else coeff.new_empty(0))


def _fwd_setup(ctx, inputs, output):
    x, coeff, elem, order, chunk_ptr, desc, meta = inputs
    ctx.save_for_backward(x, coeff, elem, order, chunk_ptr, *desc)
    ctx.meta = meta


def _fwd_backward(ctx, gout):
    x, coeff, elem, order, chunk_ptr, *desc = ctx.saved_tensors
    need_gx, need_gc = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    nodesc = [None] * len(desc)
    if not (need_gx or need_gc):
        return None, None, None, None, None, nodesc, None
    gx, gc = sc_bwd(gout.contiguous(), x, coeff, elem, order, chunk_ptr, desc, ctx.meta, need_gx, need_gc)
    return (gx if need_gx else None), (gc if need_gc else None), None, None, None, nodesc, None


def _bwd_setup(ctx, inputs, output):
    gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc = inputs
    ctx.save_for_backward(gout, x, coeff, elem, order, chunk_ptr, *desc)
    ctx.meta = meta
    ctx.flags = (need_gx, need_gc)


def _bwd_backward(ctx, ggx, ggc):
    gout, x, coeff, elem, order, chunk_ptr, *desc = ctx.saved_tensors
    need_gx, need_gc = ctx.flags
    dx = ggx.contiguous() if (need_gx and ggx is not None and ggx.numel()) else None
    dc = ggc.contiguous() if (need_gc and ggc is not None and ggc.numel()) else None
    want = ctx.needs_input_grad[:3]
    nodesc = [None] * len(desc)
    if (dx is None and dc is None) or not any(want):
        return (None,) * 6 + (nodesc, None, None, None)
    ggout, gx2, gc2 = sc_bwd2(gout, x, coeff, dx, dc, elem, order, chunk_ptr, desc, ctx.meta,
                              want[0], want[1], want[2])
    return ((ggout if want[0] else None), (gx2 if want[1] else None), (gc2 if want[2] else None),
            None, None, None, nodesc, None, None, None)


def _bwd2_backward(ctx, *grads):
    raise RuntimeError("FusedSymmetricContraction: third derivatives are not implemented")


def _bwd2_setup(ctx, inputs, output):
    pass


torch.library.register_autograd("cfm::sc_fwd", _fwd_backward, setup_context=_fwd_setup)
torch.library.register_autograd("cfm::sc_bwd", _bwd_backward, setup_context=_bwd_setup)
torch.library.register_autograd("cfm::sc_bwd2", _bwd2_backward, setup_context=_bwd2_setup)


# ----------------------------------------------------------------------------------------------
# Pure-torch evaluation of the same descriptor (fallback; autograd does every derivative)
# ----------------------------------------------------------------------------------------------

def _torch_polynomial(module: "FusedSymmetricContraction", x: torch.Tensor, coeff: torch.Tensor,
                      elem: torch.Tensor) -> torch.Tensor:
    """Returns out [N, C, O] (component-major per channel)."""
    d = module.descriptor
    N, C, _ = x.shape
    parent, last = module._sc_parent.long(), module._sc_last.long()
    # Monomials degree by degree: P[..., j] = P[..., parent[j]] * x[..., last[j]].
    P = x.new_empty(N, C, 0)
    for lo, hi in module._degree_ranges:
        if parent[lo] < 0:
            new = x[:, :, last[lo:hi]]
        else:
            new = P[:, :, parent[lo:hi]] * x[:, :, last[lo:hi]]
        P = torch.cat([P, new], dim=-1)
    term_j = module._sc_term_j.long()
    onehot = torch.nn.functional.one_hot(module._sc_term_out.long(), d.num_out).to(x.dtype)  # [T, O]
    rows = module._sc_term_row.long()
    out = x.new_zeros(N, C, d.num_out)
    for e in range(coeff.shape[0]):
        nodes = (elem == e).nonzero().squeeze(1)
        if nodes.numel() == 0:
            continue
        ce = coeff[e, rows, :C].t()  # [C, T]
        contrib = P.index_select(0, nodes)[:, :, term_j] * ce  # [n_e, C, T]
        out = out.index_put((nodes,), contrib @ onehot)
    return out


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------

def _mace_symmetric_contraction_class():
    from mace.modules.symmetric_contraction import SymmetricContraction

    return SymmetricContraction


class FusedSymmetricContraction(torch.nn.Module):
    """Drop-in for mace's ``SymmetricContraction`` sharing its parameters (see module doc).

    Build it with :meth:`from_mace` (wrap an existing module) or :meth:`from_irreps` (build a mace
    module with mace's own constructor and wrap it). ``use_kernel=False`` forces the pure-torch
    evaluation of the same descriptor.
    """

    def __init__(self, module: torch.nn.Module, use_kernel: bool = True) -> None:
        super().__init__()
        if not hasattr(module, "contractions"):
            raise ValueError(f"expected a mace SymmetricContraction (with .contractions), got {type(module).__name__}")
        self.contractions = module.contractions  # shared: same parameters, buffers, state_dict keys
        self.irreps_in = getattr(module, "irreps_in", None)
        self.irreps_out = getattr(module, "irreps_out", None)
        self.use_kernel = use_kernel
        object.__setattr__(self, "_original", module)  # not a submodule: state_dict stays identical
        wmax = [c.weights_max for c in self.contractions]
        self.num_elements = int(wmax[0].shape[0])
        self.channels = int(wmax[0].shape[-1])
        us = [[c.U_tensors(nu) for nu in range(1, c.correlation + 1)] for c in self.contractions]
        desc = build_descriptor(us, self.channels)
        self.descriptor: SCDescriptor = desc
        dev = wmax[0].device
        dtype = wmax[0].dtype
        for name, t in desc.int_tensors(dev).items():
            self.register_buffer(f"_sc_{name}", t, persistent=False)
        import numpy as np

        term_j = np.repeat(np.arange(len(desc.monomials)), np.diff(desc.term_ptr))
        self.register_buffer("_sc_term_j", torch.as_tensor(term_j, dtype=torch.int32, device=dev), persistent=False)
        for b, blk in enumerate(desc.blocks):
            self.register_buffer(f"_sc_A_{b}", torch.as_tensor(blk.A, dtype=dtype, device=dev), persistent=False)
        degrees = [len(m) for m in desc.monomials]
        self._degree_ranges = [(degrees.index(g), len(degrees) - degrees[::-1].index(g))
                               for g in sorted(set(degrees))]
        self._padded = -(-self.channels // CHANNEL_TILE) * CHANNEL_TILE

    # -- construction / conversion -------------------------------------------------------------
    @classmethod
    def from_mace(cls, module: torch.nn.Module, use_kernel: bool = True) -> "FusedSymmetricContraction":
        """Wrap a mace ``SymmetricContraction`` (sharing its weights and buffers)."""
        return cls(module, use_kernel=use_kernel)

    @classmethod
    def from_irreps(cls, irreps_in, irreps_out, correlation: int, num_elements: int,
                    use_reduced_cg: bool = False, use_kernel: bool = True) -> "FusedSymmetricContraction":
        """Build mace's module with mace's constructor (default dtype) and wrap it."""
        sc = _mace_symmetric_contraction_class()(irreps_in=irreps_in, irreps_out=irreps_out, correlation=correlation,
                                                 num_elements=num_elements, use_reduced_cg=use_reduced_cg)
        return cls(sc, use_kernel=use_kernel)

    def to_mace(self) -> torch.nn.Module:
        """The original mace module (it shares the parameters, so it is up to date)."""
        return self._original

    def extra_repr(self) -> str:
        d = self.descriptor
        return (f"{self.irreps_in} -> {self.irreps_out}, elements={self.num_elements}, channels={self.channels}, "
                f"monomials={len(d.monomials)}, terms={d.num_rows}")

    # -- inputs --------------------------------------------------------------------------------
    def _weights(self) -> list:
        ws = []
        for blk in self.descriptor.blocks:
            c = self.contractions[blk.irrep]
            ws.append(c.weights_max if blk.nu == c.correlation else c.weights[c.correlation - 1 - blk.nu])
        return ws

    def _check_x(self, x: torch.Tensor) -> None:
        L = self.descriptor.num_ell
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a tensor [nodes, {self.channels}, {L}], got {type(x).__name__}")
        if x.dim() != 3 or x.shape[1] != self.channels or x.shape[2] != L:
            raise ValueError(f"x must have shape [nodes, {self.channels}, {L}] (channels, (lmax+1)^2), "
                             f"got {list(x.shape)}")
        wdt = self.contractions[0].weights_max.dtype
        if x.dtype not in (torch.float32, torch.float64) or x.dtype != wdt:
            raise ValueError(f"x must be {wdt} like the weights (float32 or float64), got {x.dtype}")
        if x.device != self.contractions[0].weights_max.device:
            raise ValueError(f"x is on {x.device} but the weights are on {self.contractions[0].weights_max.device}")

    def _element_index(self, y: torch.Tensor, n: int) -> torch.Tensor:
        E = self.num_elements
        if not isinstance(y, torch.Tensor):
            raise ValueError(f"y must be a one-hot tensor [nodes, {E}] or element indices [nodes], got {type(y).__name__}")
        checking = not torch.compiler.is_compiling()
        if y.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            if y.dim() != 1 or y.shape[0] != n:
                raise ValueError(f"integer y must be element indices of shape [{n}], got {list(y.shape)}")
            idx = y.long()
            if checking and n and (int(idx.min()) < 0 or int(idx.max()) >= E):
                raise ValueError(f"element indices must lie in [0, {E}), got range "
                                 f"[{int(idx.min())}, {int(idx.max())}]")
            return idx
        if not y.is_floating_point():
            raise ValueError(f"y must be a floating one-hot [nodes, {E}] or integer indices, got {y.dtype}")
        if y.dim() != 2 or y.shape[0] != n or y.shape[1] != E:
            raise ValueError(f"one-hot y must have shape [{n}, {E}] (nodes, num_elements), got {list(y.shape)}")
        if checking and n and not bool(((y == 0) | (y == 1)).all() and (y.sum(-1) == 1).all()):
            raise ValueError("y must be one-hot (exactly one 1 per node, zeros elsewhere); "
                             "mixtures of elements are not supported by the fused contraction")
        return y.argmax(dim=-1)

    # -- forward -------------------------------------------------------------------------------
    def _fold(self, present: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """coeff[e', row, c] for the elements ``present`` (differentiable in the weights)."""
        parts = []
        pad = self._padded - self.channels
        for b, W in enumerate(self._weights()):
            A = getattr(self, f"_sc_A_{b}").to(dtype)
            Wp = W.index_select(0, present)
            if pad:
                Wp = torch.nn.functional.pad(Wp, (0, pad))
            parts.append(torch.einsum("rk,ekc->erc", A, Wp))
        if not parts:
            return torch.zeros(present.shape[0], 0, self._padded, dtype=dtype, device=present.device)
        return torch.cat(parts, dim=1).contiguous()

    def _layout(self, out_noc: torch.Tensor) -> torch.Tensor:
        """[N, C, O] (torch fallback) -> mace layout [N, sum_i C*(2L_i+1)]."""
        parts, o = [], 0
        for M in self.descriptor.irrep_dims:
            parts.append(out_noc[:, :, o:o + M].reshape(out_noc.shape[0], -1))
            o += M
        return torch.cat(parts, dim=-1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        n = x.shape[0]
        idx = self._element_index(y, n)
        d = self.descriptor
        present, inv, counts = torch.unique(idx, sorted=True, return_inverse=True, return_counts=True)
        coeff = self._fold(present, x.dtype)
        x = x.contiguous()
        use_ext = self.use_kernel and n > 0 and _ext_for(x.device) is not None
        if not use_ext:
            return self._layout(_torch_polynomial(self, x, coeff, inv))
        order = torch.argsort(inv, stable=True)
        nch = (counts + CHUNK - 1) // CHUNK
        seg_start = torch.cumsum(counts, 0) - counts
        chunk_seg = torch.repeat_interleave(torch.arange(counts.shape[0], device=x.device), nch)
        first = torch.repeat_interleave(torch.cumsum(nch, 0) - nch, nch)
        k = torch.arange(chunk_seg.shape[0], device=x.device) - first
        chunk_ptr = torch.cat([seg_start[chunk_seg] + k * CHUNK, torch.tensor([n], device=x.device)])
        desc = [getattr(self, f"_sc_{name}") for name in _INT_NAMES]
        meta = [d.num_ell, len(d.monomials), d.num_slots, d.num_out, d.out_dim, d.num_rows, self.channels,
                self._padded]
        return sc_fwd(x, coeff, inv.contiguous(), order.contiguous(), chunk_ptr.contiguous(), desc, meta)


# ----------------------------------------------------------------------------------------------
# Model patching
# ----------------------------------------------------------------------------------------------

def _swap(model: torch.nn.Module, match, make) -> int:
    targets = [(name, mod) for name, mod in model.named_modules() if match(mod)]
    count = 0
    for name, mod in targets:
        if not name:
            raise ValueError("the model itself is the module to swap; wrap it directly instead")
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, make(mod))
        count += 1
    return count


def patch_symmetric_contractions(model: torch.nn.Module, use_kernel: bool = True) -> int:
    """Replace every mace ``SymmetricContraction`` in ``model`` by a fused one, in place.

    Parameters and buffers are shared (state_dict keys unchanged). Returns the number swapped.
    """
    cls = _mace_symmetric_contraction_class()
    return _swap(model, lambda m: isinstance(m, cls) and not isinstance(m, FusedSymmetricContraction),
                 lambda m: FusedSymmetricContraction.from_mace(m, use_kernel=use_kernel))


def unpatch_symmetric_contractions(model: torch.nn.Module) -> int:
    """Put the original mace modules back (in place). Returns the number swapped back."""
    return _swap(model, lambda m: isinstance(m, FusedSymmetricContraction), lambda m: m.to_mace())
