"""Fused symmetric contraction (MACE's product basis) as a torch module over C++ operators.

:class:`FusedSymmetricContraction` is a drop-in for ``mace.modules.symmetric_contraction.
SymmetricContraction``: same call ``forward(x, y)`` (x ``[nodes, channels, num_ell]``, y one-hot
``[nodes, num_elements]`` or integer element indices ``[nodes]``), same output layout, and it
*shares* the mace module's ``contractions`` (weights, U buffers, ``*_zeroed`` flags), so a
state_dict saved with or without the plugin loads into either. Per call the weights are folded
into per-element coefficients and fused kernels of the descriptor
(:mod:`cfm_plugins.ops.descriptors.symmetric_contraction`) evaluate forward, backward and double
backward (the class says how).

:data:`KERNEL` is this kernel's entry in the kernel table (:mod:`cfm_plugins.ops.kernel_table`,
which finds it by name): it recognises MACE's layout whatever the class, so vendored copies are
fused too, and the fx ``GraphModule`` that ``mace.tools.compile.prepare`` leaves in its place (by
the parameters and buffers it keeps; the swap is checked against the traced module's output).
"""

import logging

import numpy as np
import torch

from cfm_plugins.ops import _backend, cueq_regime
from cfm_plugins.ops._fused_module import FusedModule
from cfm_plugins.ops._tensor_cache import TensorCache
from cfm_plugins.ops.descriptors.symmetric_contraction import SCDescriptor, build_descriptor
from cfm_plugins.ops.kernel_types import Form, Kernel

__all__ = ["FusedSymmetricContraction", "KERNEL", "from_prepared", "is_symmetric_contraction"]

log = logging.getLogger("cfm_plugins.ops")

# the cfm:: operators must exist before a model holding these modules is scripted or exported
_backend.declare_operators()

CHANNEL_TILE = 16  # coefficient tensors are padded to a multiple of this many channels
CHUNK = 128  # nodes per kernel work unit (all of one element)


# ----------------------------------------------------------------------------------------------
# Pure-torch evaluation of the same descriptor (fallback; autograd does every derivative)
# ----------------------------------------------------------------------------------------------


def _torch_polynomial(
    module: "FusedSymmetricContraction", x: torch.Tensor, coeff: torch.Tensor, elem: torch.Tensor
) -> torch.Tensor:
    """Returns out [N, C, O] (component-major per channel)."""
    d = module.descriptor
    N, C, _ = x.shape
    parent, last = module._sc_parent.long(), module._sc_last.long()
    # Monomials degree by degree: P[..., j] = P[..., parent[j]] * x[..., last[j]]; _degree_ranges
    # holds one (lo, hi) per degree, degree 1 (no parent) first.
    P = x.new_empty(N, C, 0)
    for lo, hi in module._degree_ranges:
        if lo == 0:  # degree 1 (the first range): the input components themselves, no parent
            new = x[:, :, last[lo:hi]]
        else:
            new = P[:, :, parent[lo:hi]] * x[:, :, last[lo:hi]]
        P = torch.cat([P, new], dim=-1)
    term_j = module._sc_term_j.long()
    onehot = torch.nn.functional.one_hot(module._sc_term_out.long(), d.num_out).to(
        x.dtype
    )  # [T, O]
    rows = module._sc_term_row.long()
    if _backend.tracing(x):
        # torch.compile / export: no shape may depend on the data, so every node gathers its own
        # element's coefficients (memory N x terms x C, as stock mace's weights per node)
        ce = coeff.index_select(0, elem)[:, rows, :C]  # [N, T, C]
        return (P[:, :, term_j] * ce.transpose(1, 2)) @ onehot
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
# Nodes grouped by element (eager): one device-to-host copy per node-attribute tensor
# ----------------------------------------------------------------------------------------------
_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_GROUPS_CACHE = TensorCache(8)


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on ``device`` without waiting for the device's queue (pinned,
    non-blocking)."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _element_counts(idx: torch.Tensor, num_elements: int) -> torch.Tensor:
    """Nodes per element (int64, ``num_elements`` long; indices out of range counted at the ends,
    where the caller checks them). No ``bincount``: on CUDA it waits for the device to size its
    output."""
    counts = torch.zeros(num_elements, dtype=torch.int64, device=idx.device)
    return counts.index_add(0, idx.clamp(0, num_elements - 1), torch.ones_like(idx))


def _group(
    y: torch.Tensor, idx: torch.Tensor, num_elements: int, chunk: int
) -> tuple[torch.Tensor, ...]:
    E, n, device = num_elements, idx.shape[0], idx.device
    if y.is_floating_point():
        valid = (((y == 0) | (y == 1)).all(-1) & (y.sum(-1) == 1)).all()
    else:
        valid = ((idx >= 0) & (idx < E)).all()
    counts = _element_counts(idx, E)
    host = torch.cat([valid.reshape(1).long(), counts]).tolist()  # the one copy to the host
    if not host[0]:
        if y.is_floating_point():
            raise ValueError(
                "y must be one-hot (exactly one 1 per node, zeros elsewhere); "
                "mixtures of elements are not supported by the fused contraction"
            )
        raise ValueError(
            f"element indices must lie in [0, {E}), got range [{int(idx.min())}, {int(idx.max())}]"
        )
    counts_h = np.asarray(host[1:], dtype=np.int64)
    present_h = np.flatnonzero(counts_h)
    counts_p = counts_h[present_h]
    lut = np.zeros(E, dtype=np.int64)
    lut[present_h] = np.arange(present_h.size)
    # chunks of <= chunk nodes of one element, in element order: chunk_ptr = their first sorted
    # nodes, then n
    starts = np.cumsum(counts_p) - counts_p
    chunk_ptr = np.concatenate(
        [np.arange(s, s + c, chunk) for s, c in zip(starts, counts_p)] + [np.array([n])]
    )
    inv = _to_device(lut, device)[idx]
    order = torch.argsort(inv, stable=True)
    return (
        _to_device(present_h, device),
        inv,
        _to_device(counts_p, device),
        order,
        _to_device(chunk_ptr, device),
    )


def node_groups(
    y: torch.Tensor, idx: torch.Tensor, num_elements: int, chunk: int = CHUNK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The nodes of one batch by element: (present elements, sorted; each node's index into them;
    nodes per present element; the nodes sorted by element, stably; chunk pointers: runs of at most
    ``chunk`` nodes of one element, then the node count). ``y`` is the node attributes (one-hot
    or indices), ``idx`` their element indices.

    A ValueError if ``y`` is not one-hot or an index is not an element. Its values reach the host
    once (on a GPU, the one wait for the queued kernels; the grouping is then done on the host and
    copied back without waiting), and the result is cached on ``y``'s identity and version: every
    layer of a forward gets the same node attributes."""
    return _GROUPS_CACHE.get(
        y, (int(num_elements), int(chunk)), lambda: _group(y, idx, num_elements, chunk)
    )


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------


def _mace_symmetric_contraction_class():
    from mace.modules.symmetric_contraction import SymmetricContraction

    return SymmetricContraction


class FusedSymmetricContraction(FusedModule):
    """Drop-in for mace's ``SymmetricContraction`` sharing its parameters (see module doc).

    Build it with :meth:`from_mace` (wrap an existing module) or :meth:`from_irreps` (build a mace
    module with mace's own constructor and wrap it). ``use_kernel=False`` forces the pure-torch
    evaluation of the same descriptor. Every tensor it owns is a buffer created on the wrapped
    module's device and dtype, so it follows ``.to()``; ``forward`` is TorchScript-compatible
    (a scripted module calls the ``cfm::`` operators, so the compiled library must be loaded).

    Per call the weights are folded into per-element coefficients ``coeff[e, term, c]`` (only the
    elements present), then one fused kernel evaluates the sparse polynomial of the descriptor per
    node and channel. Backward and double backward are fused kernels of the same descriptor. All
    three are torch operators declared in C++ (``cuda/symmetric_contraction/sc_ops*.cpp``):
    ``cfm::symmetric_contraction_fwd``, ``_bwd``, ``_bwd2``, with CPU, CUDA and Meta kernels and
    C++ autograd, so TorchScript, torch.export, AOTInductor and torch.compile see ordinary
    operators and forces need no Python. Where the compiled library is missing (or
    ``CFM_PLUGINS_FORCE_TORCH=1``) a pure-torch evaluation of the same descriptor runs
    (:mod:`cfm_plugins.ops._backend` chooses).
    """

    OPERATORS = "symmetric_contraction"

    def __init__(self, module: torch.nn.Module, use_kernel: bool = True) -> None:
        super().__init__()
        if not hasattr(module, "contractions"):
            raise ValueError(
                "expected a mace SymmetricContraction (with .contractions), got "
                f"{type(module).__name__}"
            )
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
        dev, dtype = wmax[0].device, wmax[0].dtype
        for name, t in desc.int_tensors(dev).items():
            self.register_buffer(f"_sc_{name}", t, persistent=False)
        term_j = np.repeat(np.arange(len(desc.monomials)), np.diff(desc.term_ptr))
        self.register_buffer(
            "_sc_term_j", torch.as_tensor(term_j, dtype=torch.int32, device=dev), persistent=False
        )
        # The A blocks, flattened into one buffer; block b is _sc_A[off:off + rows * k].view(rows,
        # k) and folds the weight _weight_list()[w] (TorchScript has no lists of buffers).
        first_weight, k0 = [], 0
        for c in self.contractions:
            first_weight.append(k0)
            k0 += c.correlation
        flat, self._a_blocks, off = [], [], 0
        for blk in desc.blocks:
            c = self.contractions[blk.irrep]
            rows, k = blk.A.shape
            flat.append(np.asarray(blk.A, dtype=np.float64).reshape(-1))
            self._a_blocks.append([off, rows, k, first_weight[blk.irrep] + c.correlation - blk.nu])
            off += rows * k
        A = np.concatenate(flat) if flat else np.zeros(0)
        self.register_buffer("_sc_A", torch.as_tensor(A, dtype=dtype, device=dev), persistent=False)
        degrees = [len(m) for m in desc.monomials]
        self._degree_ranges = [
            (degrees.index(g), len(degrees) - degrees[::-1].index(g)) for g in sorted(set(degrees))
        ]
        self._padded = -(-self.channels // CHANNEL_TILE) * CHANNEL_TILE
        self._chunk = CHUNK
        self._meta: list[int] = [
            desc.num_ell,
            len(desc.monomials),
            desc.num_slots,
            desc.num_out,
            desc.out_dim,
            desc.num_rows,
            self.channels,
            self._padded,
        ]

    # -- construction / conversion -------------------------------------------------------------
    @classmethod
    def from_mace(
        cls, module: torch.nn.Module, use_kernel: bool = True
    ) -> "FusedSymmetricContraction":
        """Wrap a mace ``SymmetricContraction`` (sharing its weights and buffers)."""
        return cls(module, use_kernel=use_kernel)

    @classmethod
    def from_irreps(
        cls,
        irreps_in,
        irreps_out,
        correlation: int,
        num_elements: int,
        use_reduced_cg: bool = False,
        use_kernel: bool = True,
    ) -> "FusedSymmetricContraction":
        """Build mace's module with mace's constructor (default dtype) and wrap it."""
        sc = _mace_symmetric_contraction_class()(
            irreps_in=irreps_in,
            irreps_out=irreps_out,
            correlation=correlation,
            num_elements=num_elements,
            use_reduced_cg=use_reduced_cg,
        )
        return cls(sc, use_kernel=use_kernel)

    def to_mace(self) -> torch.nn.Module:
        """The original mace module (it shares the parameters, so it is up to date)."""
        return self._original

    def extra_repr(self) -> str:
        d = self.descriptor
        return (
            f"{self.irreps_in} -> {self.irreps_out}, elements={self.num_elements}, "
            f"channels={self.channels}, monomials={len(d.monomials)}, terms={d.num_rows}"
        )

    # -- inputs (eager only: a scripted or compiled model skips these checks) -------------------
    @torch.jit.unused
    def _check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        w = self.contractions[0].weights_max
        self._check_floats({"x": x}, like=w)
        self._check_devices({"x": x}, w.device, "weights")
        L = self.descriptor.num_ell
        self._check_shape("x", x, ("nodes", self.channels, L), "channels, (lmax+1)^2")
        self._check_y(y, x.shape[0])

    @torch.jit.unused
    def _check_y(self, y: torch.Tensor, n: int) -> None:
        E = self.num_elements
        if not isinstance(y, torch.Tensor):
            raise ValueError(
                f"y must be a one-hot tensor [nodes, {E}] or element indices [nodes], got "
                f"{type(y).__name__}"
            )
        # shapes and types here; the values (one-hot, indices in range) where the nodes are grouped
        # by element, in the same device-to-host copy (node_groups)
        if y.dtype in _INDEX_DTYPES:
            self._check_shape("y", y, (n,), "element indices")
        elif not y.is_floating_point():
            raise ValueError(
                f"y must be a floating one-hot [nodes, {E}] or integer indices, got {y.dtype}"
            )
        else:
            self._check_shape("y", y, (n, E), "one-hot: nodes, num_elements")

    @torch.jit.unused
    def _eager_backend(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the compiled operators run for x (eager and torch.compile; see forward)."""
        if not _backend.tracing(x):
            self._check(x, y)
            # said once where cuEquivariance's kernels were measured faster: a training batch (its
            # weights trainable; mace's trainer never calls .train()/.eval(), calculators freeze
            # them)
            cueq_regime.note_batch(
                x.device,
                x.dtype,
                x.shape[0],
                torch.is_grad_enabled() and self.contractions[0].weights_max.requires_grad,
            )
        return self.use_kernel and x.shape[0] > 0 and _backend.choose(x.device) != "torch"

    @torch.jit.unused
    def _eager_groups(
        self, y: torch.Tensor, idx: torch.Tensor, x: torch.Tensor, use_ops: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(present elements, each node's index into them, nodes per present element, nodes sorted
        by element, chunk pointers). Eager: :func:`node_groups` (one host copy per y, shared by the
        layers). Traced (torch.compile, export, AOTInductor): every element and a number of chunks
        that depends only on the shapes (:meth:`_static_chunks`), so that nothing is sized by a
        value: no host copy, and a CUDA graph captures the whole step (``bincount`` and
        ``repeat_interleave`` would each wait for the device and cut the captured graph). The
        chunks only for the operators (the pure-torch evaluation needs none)."""
        if _backend.tracing(x) or _backend.tracing(y):
            present = torch.arange(self.num_elements, device=idx.device)
            counts = _element_counts(idx, self.num_elements)
            if not use_ops:
                return present, idx, counts, idx.new_empty(0), idx.new_empty(0)
            order, chunk_ptr = self._static_chunks(idx, counts, idx.shape[0])
            return present, idx, counts, order, chunk_ptr
        return node_groups(y, idx, self.num_elements, self._chunk)

    @torch.jit.unused
    def _torch_forward(
        self, x: torch.Tensor, coeff: torch.Tensor, inv: torch.Tensor
    ) -> torch.Tensor:
        return self._layout(_torch_polynomial(self, x, coeff, inv))

    # -- forward -------------------------------------------------------------------------------
    def _weight_list(self) -> list[torch.Tensor]:
        """Every contraction's weights: weights_max (nu = correlation), then weights[i] (nu =
        correlation-1-i)."""
        ws: list[torch.Tensor] = []
        for c in self.contractions:
            ws.append(c.weights_max)
            for w in c.weights:
                ws.append(w)
        return ws

    def _fold(self, present: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """coeff[e', row, c] for the elements ``present`` (differentiable in the weights)."""
        ws = self._weight_list()
        parts: list[torch.Tensor] = []
        pad = self._padded - self.channels
        for blk in self._a_blocks:
            off, rows, k, wi = blk[0], blk[1], blk[2], blk[3]
            A = self._sc_A[off : off + rows * k].view(rows, k).to(dtype)
            Wp = ws[wi].index_select(0, present)
            if pad > 0:
                Wp = torch.nn.functional.pad(Wp, [0, pad])
            parts.append(torch.einsum("rk,ekc->erc", A, Wp))
        if len(parts) == 0:
            return torch.zeros(
                present.shape[0], 0, self._padded, dtype=dtype, device=present.device
            )
        return torch.cat(parts, dim=1).contiguous()

    def _layout(self, out_noc: torch.Tensor) -> torch.Tensor:
        """[N, C, O] (torch fallback) -> mace layout [N, sum_i C*(2L_i+1)]."""
        parts, o = [], 0
        for M in self.descriptor.irrep_dims:
            parts.append(out_noc[:, :, o : o + M].reshape(out_noc.shape[0], -1))
            o += M
        return torch.cat(parts, dim=-1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if torch.jit.is_scripting():
            use_ops = (
                True  # a scripted model runs the cfm:: operators (their library must be loaded)
            )
        else:
            use_ops = self._eager_backend(x, y)
        idx = y.argmax(dim=-1) if y.is_floating_point() else y.long()
        if torch.jit.is_scripting():
            present, inv, counts = torch._unique2(
                idx, sorted=True, return_inverse=True, return_counts=True
            )
            order, chunk_ptr = self._chunks(inv, counts, n)
        else:
            present, inv, counts, order, chunk_ptr = self._eager_groups(y, idx, x, use_ops)
        coeff = self._fold(present, x.dtype)
        x = x.contiguous()
        if not use_ops:
            return self._torch_forward(x, coeff, inv)
        return torch.ops.cfm.symmetric_contraction_fwd(
            x, coeff, inv.contiguous(), order, chunk_ptr, self._desc_tensors(), self._meta
        )

    def _chunks(
        self, inv: torch.Tensor, counts: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, chunk_ptr): nodes sorted by element, cut into chunks of <= CHUNK nodes of one
        element."""
        chunk = self._chunk
        order = torch.argsort(inv, stable=True)
        nch = torch.div(counts + (chunk - 1), chunk, rounding_mode="floor")
        seg_start = torch.cumsum(counts, 0) - counts
        chunk_seg = torch.repeat_interleave(torch.arange(counts.shape[0], device=inv.device), nch)
        first = torch.repeat_interleave(torch.cumsum(nch, 0) - nch, nch)
        k = torch.arange(chunk_seg.shape[0], device=inv.device) - first
        chunk_ptr = torch.cat(
            [
                seg_start[chunk_seg] + k * chunk,
                torch.full([1], n, dtype=torch.int64, device=inv.device),
            ]
        )
        return order.contiguous(), chunk_ptr.contiguous()

    @torch.jit.unused
    def _static_chunks(
        self, inv: torch.Tensor, counts: torch.Tensor, n: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(order, chunk_ptr) of :meth:`_chunks`, with ``n // CHUNK + elements`` chunks whatever the
        values: the real chunks, then empty ones at ``n`` (which the kernels skip). An element of
        ``c`` nodes has ``ceil(c / CHUNK) <= c // CHUNK + 1`` chunks, so that many always suffice.
        Every size here is a shape: traced, nothing waits for the device."""
        chunk = self._chunk
        E = counts.shape[0]
        order = torch.argsort(inv, stable=True)
        nch = torch.div(counts + (chunk - 1), chunk, rounding_mode="floor")
        ends = torch.cumsum(nch, 0)  # chunks of the elements up to e
        seg_start = torch.cumsum(counts, 0) - counts
        slot = torch.arange(n // chunk + E, device=inv.device)
        seg = torch.searchsorted(
            ends, slot, right=True
        )  # the element of each slot; E past the last chunk
        e = seg.clamp(max=E - 1)
        start = seg_start[e] + (slot - (ends - nch)[e]) * chunk
        start = torch.where(seg < E, start, torch.full_like(start, n))
        chunk_ptr = torch.cat([start, torch.full([1], n, dtype=torch.int64, device=inv.device)])
        return order.contiguous(), chunk_ptr.contiguous()

    @torch.jit.unused
    def operator_tables(self) -> tuple:
        return self._desc_tensors(), self._meta

    def _desc_tensors(self) -> list[torch.Tensor]:
        """The descriptor tables in the order of the operators' ``desc`` argument (sc_ops.h)."""
        return [
            self._sc_parent,
            self._sc_last,
            self._sc_slot,
            self._sc_term_ptr,
            self._sc_term_row,
            self._sc_term_out,
            self._sc_out_base,
            self._sc_out_stride,
        ]


# ----------------------------------------------------------------------------------------------
# The kernel table entry: recognised by MACE's layout, whatever the class
# ----------------------------------------------------------------------------------------------


def is_symmetric_contraction(m) -> bool:
    """MACE's symmetric-contraction layout, whatever the class (trainers vendor it: HydraGNN's
    ``MACEStack``): ``.contractions``, a non-empty module list whose items each have an integer
    ``correlation``, a 3-D ``weights_max`` parameter, ``correlation - 1`` further ``weights``,
    buffers ``U_matrix_1 .. U_matrix_<correlation>`` and ``U_tensors(nu)``: what
    :class:`FusedSymmetricContraction` reads."""
    if isinstance(m, FusedSymmetricContraction) or not isinstance(m, torch.nn.Module):
        return False
    contractions = getattr(m, "contractions", None)
    if not isinstance(contractions, torch.nn.ModuleList) or len(contractions) == 0:
        return False
    for c in contractions:
        nu = getattr(c, "correlation", None)
        w = getattr(c, "weights_max", None)
        if not isinstance(nu, int) or nu < 1 or not isinstance(w, torch.Tensor) or w.dim() != 3:
            return False
        if len(getattr(c, "weights", ())) != nu - 1 or not callable(getattr(c, "U_tensors", None)):
            return False
        if any(
            not isinstance(getattr(c, f"U_matrix_{k}", None), torch.Tensor)
            for k in range(1, nu + 1)
        ):
            return False
    return True


def _restore(fused: "FusedSymmetricContraction", parent: torch.nn.Module, attr: str) -> None:
    original = fused.to_mace()
    if isinstance(original, torch.fx.GraphModule):
        _rebind_prepared(fused, original)
    setattr(parent, attr, original)


# ----------------------------------------------------------------------------------------------
# The same module after mace.tools.compile.prepare: an fx GraphModule with the stock layout's
# parameters and buffers
# ----------------------------------------------------------------------------------------------

PREPARED_HINT = (
    "patch the model before mace.tools.compile.prepare (prepare leaves a fused contraction as it "
    "is), or leave symmetric_contraction out of fused_kernels"
)


def _prepared_layout(m) -> list[tuple[torch.nn.Module, int]] | None:
    """(traced contraction, correlation) per output irrep of a GraphModule that holds MACE's
    symmetric-contraction parameters and buffers as ``mace.tools.compile.prepare``
    (``torch.fx.symbolic_trace``) keeps them: ``contractions.<i>`` with the parameter
    ``weights_max`` (3-D), ``weights.0 .. weights.<correlation-2>`` and the buffers ``U_matrix_1 ..
    U_matrix_<correlation>``; None for any other module."""
    if not isinstance(m, torch.fx.GraphModule):
        return None
    contractions = m._modules.get("contractions")
    if not isinstance(contractions, torch.nn.Module) or not contractions._modules:
        return None
    if list(contractions._modules) != [str(i) for i in range(len(contractions._modules))]:
        return None
    layout = []
    for c in contractions._modules.values():
        w = c._parameters.get("weights_max") if c is not None else None
        if not isinstance(w, torch.Tensor) or w.dim() != 3:
            return None
        nu = sum(1 for k in c._buffers if k.startswith("U_matrix_"))
        if nu < 1 or any(f"U_matrix_{k}" not in c._buffers for k in range(1, nu + 1)):
            return None
        weights = c._modules.get("weights")
        params = weights._parameters if weights is not None else {}
        if list(params) != [str(i) for i in range(nu - 1)]:
            return None
        if any(not isinstance(p, torch.Tensor) or p.dim() != 3 for p in params.values()):
            return None
        layout.append((c, nu))
    return layout


class _PreparedContraction(torch.nn.Module):
    """One contraction of a prepared (traced) symmetric contraction under mace's ``Contraction``
    names: the traced module's own parameter and buffer tensors, with the ``correlation`` and
    ``U_tensors`` that :class:`FusedSymmetricContraction` reads (its state_dict keys are the
    traced module's)."""

    def __init__(self, traced: torch.nn.Module, correlation: int) -> None:
        super().__init__()
        self.correlation = correlation
        self.weights_max = traced._parameters["weights_max"]
        weights = traced._modules.get("weights")
        self.weights = torch.nn.ParameterList(
            [weights._parameters[str(i)] for i in range(correlation - 1)]
        )
        for name, u in traced._buffers.items():  # in the traced module's order (its state_dict)
            if name.startswith("U_matrix_"):
                self.register_buffer(name, u)

    @torch.jit.unused
    def U_tensors(self, nu: int) -> torch.Tensor:
        return self._buffers[f"U_matrix_{nu}"]


def _rebind_prepared(fused: "FusedSymmetricContraction", traced: torch.fx.GraphModule) -> None:
    """Give the traced module the fused module's current tensors (``.to()`` replaces buffers)."""
    for c, view in zip(traced.contractions._modules.values(), fused.contractions):
        c._parameters["weights_max"] = view.weights_max
        for i, w in enumerate(view.weights):
            c.weights._parameters[str(i)] = w
        for k in range(1, view.correlation + 1):
            c._buffers[f"U_matrix_{k}"] = view._buffers[f"U_matrix_{k}"]


def _check_prepared(fused: "FusedSymmetricContraction", traced: torch.nn.Module) -> None:
    """The traced module's output and the fused one's on a few nodes of every element agree, or a
    ValueError: recognised by its parameters alone, the traced code could compute something
    else."""
    w = fused.contractions[0].weights_max
    E, C, L = fused.num_elements, fused.channels, fused.descriptor.num_ell
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(2 * E, C, L, generator=g, dtype=torch.float64).to(w.device, w.dtype)
    y = torch.eye(E, dtype=w.dtype, device=w.device).repeat(2, 1)
    with torch.no_grad():
        try:
            ref = traced(x, y)
        except Exception as exc:  # noqa: BLE001  (any failure: not the module this form fuses)
            raise ValueError(
                f"it holds mace's symmetric-contraction parameters but does not run as one "
                f"({type(exc).__name__}: {exc}); {PREPARED_HINT}"
            ) from exc
        out = fused(x, y)
    tol = 1e-10 if w.dtype == torch.float64 else 1e-4
    err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-300)) if ref.numel() else 0.0
    if out.shape != ref.shape or not err < tol:
        raise ValueError(
            f"its traced code does not compute mace's symmetric contraction (output "
            f"{list(ref.shape)}, the fused {list(out.shape)}, relative difference {err:.1e}); "
            f"{PREPARED_HINT}"
        )


def from_prepared(module: torch.nn.Module) -> "FusedSymmetricContraction":
    """The fused twin of a symmetric contraction traced by ``mace.tools.compile.prepare``
    (sharing its parameters and buffers; :meth:`FusedSymmetricContraction.to_mace` gives the
    traced module back), checked against the traced module's output; a ValueError saying what to
    do for a GraphModule that has the layout but computes something else."""
    layout = _prepared_layout(module)
    if layout is None:
        raise ValueError(
            f"{type(module).__name__} is not a symmetric contraction traced by "
            f"mace.tools.compile.prepare; {PREPARED_HINT}"
        )
    view = torch.nn.Module()
    view.contractions = torch.nn.ModuleList([_PreparedContraction(c, nu) for c, nu in layout])
    fused = FusedSymmetricContraction(view)
    object.__setattr__(fused, "_original", module)
    _check_prepared(fused, module)
    return fused


def _is_fused_prepared(m, parent, attr) -> bool:
    return isinstance(m, FusedSymmetricContraction) and isinstance(
        m.to_mace(), torch.fx.GraphModule
    )


KERNEL = Kernel(
    "symmetric_contraction",
    "MACE's symmetric contraction (product basis), by its layout",
    (
        Form(
            "mace-layout symmetric contraction",
            recognise=lambda m, parent, attr: is_symmetric_contraction(m),
            make=lambda m, parent, attr: FusedSymmetricContraction.from_mace(m),
            is_fused=lambda m, parent, attr: isinstance(m, FusedSymmetricContraction),
            restore=_restore,
        ),
        Form(
            "symmetric contraction traced by mace.tools.compile.prepare",
            recognise=lambda m, parent, attr: _prepared_layout(m) is not None,
            make=lambda m, parent, attr: from_prepared(m),
            is_fused=_is_fused_prepared,
            restore=_restore,
        ),
    ),
)
