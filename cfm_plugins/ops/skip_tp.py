"""Fused skip connection: e3nn's ``FullyConnectedTensorProduct`` of node features with the one-hot
of the element, evaluated as the per-element linear map it is.

MACE's interaction blocks call ``skip_tp = FullyConnectedTensorProduct(irreps, Ex0e, irreps_out)``
with ``node_attrs``, the one-hot of each node's element among the ``E`` of the model's table (89
for the foundation models); e3nn's dense product does ``E`` times the work needed. Here each
node's features are multiplied by its own element's weight block only
(:mod:`cfm_plugins.ops.descriptors.skip_tp`). ``FusedSkipTP.from_e3nn(tp)`` shares the e3nn
module's weight, buffer and compiled submodules (the state_dict is unchanged) and is called as
e3nn's is, ``m(node_feats, node_attrs)``. The kernels are the torch operators ``cfm::skip_tp_fwd``
and ``cfm::skip_tp_bwd`` (C++: CPU and Meta kernels, C++ autograd; on CUDA tensors Triton's,
:mod:`cfm_plugins.ops.triton.skip_tp`); where e3nn's module runs instead: :class:`FusedSkipTP`.

:data:`KERNEL` is this kernel's entry in the kernel table (:mod:`cfm_plugins.ops.kernel_table`):
MACE's interaction blocks' ``skip_tp`` (older models: ``skip_tp_full``), recognised by its layout.
"""

from __future__ import annotations

import logging

import torch

from cfm_plugins.ops import _backend, _debug
from cfm_plugins.ops._fused_module import FusedE3nnModule, module_device
from cfm_plugins.ops._tensor_cache import TensorCache
from cfm_plugins.ops.descriptors import skip_tp as _desc
from cfm_plugins.ops.kernel_types import Form, Kernel

__all__ = ["FusedSkipTP", "KERNEL", "SKIP_ATTRS", "is_skip_tp", "element_groups"]

log = logging.getLogger("cfm_plugins.ops")

# the cfm:: operators must exist before a model holding these modules is scripted or exported
_backend.declare_operators()

#: the attribute names of MACE's skip connections (``skip_tp_full`` in models before mace 0.3)
SKIP_ATTRS = ("skip_tp", "skip_tp_full")

_GROUPS_CACHE = TensorCache(8)
_ONE_HOT_CACHE = TensorCache(8)
_GPU_NOTED: list[bool] = [False]


def _groups(y: torch.Tensor, num_elements: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, elem_ptr): the nodes sorted by element (stably) and where each element's run
    starts, ``[E + 1]``. Device ops only: nothing waits for the device."""
    idx = y.argmax(dim=-1)
    order = torch.argsort(idx, stable=True)
    counts = torch.zeros(num_elements, dtype=torch.int64, device=y.device)
    counts = counts.index_add(0, idx, torch.ones_like(idx))
    elem_ptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return order, elem_ptr


def element_groups(y: torch.Tensor, num_elements: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_groups` of a one-hot ``y`` ``[nodes, num_elements]``; eager, cached on ``y``'s
    identity and version, so the layers of a forward and their backward share it."""
    if _backend.tracing(y):
        return _groups(y, num_elements)
    return _GROUPS_CACHE.get(y, int(num_elements), lambda: _groups(y, num_elements))


def _is_one_hot(y: torch.Tensor) -> bool:
    """Whether every row of ``y`` holds exactly one 1 and zeros elsewhere (one copy to the host,
    cached on ``y``)."""

    def check() -> bool:
        if y.numel() == 0:
            return True
        return bool((((y == 0) | (y == 1)).all(-1) & (y.sum(-1) == 1)).all())

    return _ONE_HOT_CACHE.get(y, "one-hot", check)


_DECLARED: list = []


def _declared() -> bool:
    """Whether the loaded library declares this kernel's operators (a library built from an older
    checkout does not: e3nn's module runs then, and one warning says to rebuild)."""
    if not _DECLARED:
        ok = hasattr(torch.ops.cfm, "skip_tp_fwd") and hasattr(torch.ops.cfm, "skip_tp_bwd")
        _DECLARED.append(ok)
        if not ok:
            log.warning(
                "cfm_plugins: the loaded operator library has no cfm::skip_tp_* operators (built "
                "from an older checkout); the skip connections run e3nn's module. To use them, %s.",
                _backend.BUILD_HINT,
            )
    return _DECLARED[0]


class FusedSkipTP(FusedE3nnModule):
    """e3nn's ``FullyConnectedTensorProduct(irreps_in, Ex0e, irreps_out)`` with internal weights,
    for a one-hot second input, as a per-element linear map (see the module docstring).

    ``forward(node_feats, node_attrs)`` -> ``[nodes, irreps_out.dim]``, e3nn's output. Every
    tensor it owns is a buffer created on ``device`` (default: where ``tp`` lives), so it follows
    ``.to()``; ``forward`` is TorchScript-compatible. ``gpu_kernels``: run the Triton kernel on
    CUDA tensors (off: e3nn's module runs there).

    The nodes are grouped by element so that a weight block is read once per tile of nodes. The
    operators (``cuda/skip_tp/skip_tp_ops*.cpp``) have CPU (OpenMP) and Meta kernels and a C++
    autograd that writes every derivative with the same two operators (the map is bilinear in
    features and weights), so force training's double backward, gradcheck, torch.compile,
    torch.export and TorchScript see ordinary operators; there is no C++ CUDA kernel.

    Where the stock module runs instead (exact, e3nn's own code):

    - the second input is not a one-hot. It is checked once, at a module's first eager call (one
      device-to-host copy, shared by the modules of a model through a cache on the tensor): MACE
      builds ``node_attrs`` from atomic numbers, a one-hot by construction, and the check does not
      cost a wait for the device in every step. A module that finds another input says so once
      and runs e3nn's code from then on; the debug switch ``CFM_PLUGINS_CHECK_ONE_HOT=1`` checks
      every call;
    - the second input requires a gradient (its gradient is the dense product's);
    - CUDA tensors, unless the kernel was named (``fused_kernels=...,skip_tp``; not under
      ``auto``: no GPU has timed the Triton kernel) and the GPU backend is Triton; a scripted
      model on CUDA always (a C++ host has no CUDA kernel of these operators);
    - the compiled library is missing (or ``CFM_PLUGINS_FORCE_TORCH=1``).

    :data:`KERNEL` covers ``RealAgnosticInteractionBlock``,
    ``RealAgnosticResidualInteractionBlock`` and their ``Density`` variants.
    """

    OPERATORS = "skip_tp"
    PREFIX = "_sk"

    def __init__(self, tp: torch.nn.Module, device: torch.device | None = None):
        desc = _desc.from_e3nn(tp)  # a ValueError saying why, for a module it does not describe
        # asked here, never first inside a compiled graph (its answer, cached, would recompile it)
        _declared(), _debug.force_torch(), _debug.check_one_hot()
        super().__init__(tp, desc, device)  # weight, output_mask, compiled submodules
        self.internal_weights = True
        self.shared_weights = True
        self.num_elements = desc.num_elements
        self.gpu_kernels = False
        self._stock_only = False  # set once a second input turned out not to be a one-hot
        self._checked = False

    def enable_gpu_kernels(self, on: bool = True) -> FusedSkipTP:
        """Run the Triton kernel on CUDA tensors (the kernel table does it where ``skip_tp`` is
        named in the request, never under ``auto``)."""
        self.gpu_kernels = bool(on)
        return self

    def extra_repr(self) -> str:
        d = self.descriptor
        return (
            f"{self.irreps_in1} x {self.irreps_in2} -> {self.irreps_out} | per-element linear "
            f"map, {d.num_paths} paths, {self.weight_numel} weights"
        )

    # -- eager-only helpers (a scripted model skips the checks) --------------------------------
    @torch.jit.unused
    def _check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        inputs = {"node_feats": x, "node_attrs": y}
        self._check_floats(inputs, like=self.weight)
        self._check_devices(inputs, self.weight.device, "weights")
        self._check_shape("node_feats", x, ("num_nodes", self._in1_dim), str(self.irreps_in1))
        self._check_shape(
            "node_attrs",
            y,
            (x.shape[0], self._in2_dim),
            f"one-hot of the {self.num_elements} elements per node",
        )

    @torch.jit.unused
    def _runs_kernels(self, x: torch.Tensor, y: torch.Tensor) -> bool:
        """Whether the operators run for these inputs (else e3nn's code: see the class doc)."""
        if self._stock_only or y.requires_grad:
            return False
        if x.device.type == "cuda":
            if not self.gpu_kernels or _backend.resolved_gpu_backend() != "triton":
                # said at an eager call: a flag read inside a compiled graph recompiles it
                if not _backend.tracing(x) and not _GPU_NOTED[0]:
                    _GPU_NOTED[0] = True
                    log.info(
                        "cfm_plugins: the skip connections run e3nn's module on GPUs: no GPU has "
                        "timed their Triton kernel; name skip_tp in fused_kernels (Triton "
                        "backend) to run it"
                    )
                return False
        traced = _backend.tracing(x) or _backend.tracing(y)
        if not traced:
            self._check(x, y)
            if not self._checked or _debug.check_one_hot():
                self._checked = True
                if not _is_one_hot(y):
                    self._stock_only = True
                    log.warning(
                        "cfm_plugins: the skip connection %s x %s -> %s got a second input that "
                        "is not a one-hot of the elements (exactly one 1 per node); it runs "
                        "e3nn's FullyConnectedTensorProduct from now on",
                        self.irreps_in1,
                        self.irreps_in2,
                        self.irreps_out,
                    )
                    return False
        return x.shape[0] > 0 and _backend.choose(x.device) != "torch" and _declared()

    @torch.jit.unused
    def _runs_triton(self, device: torch.device) -> bool:
        """Whether the operators run their Triton kernels here: on CUDA tensors only where the
        GPU kernels are on (:meth:`enable_gpu_kernels`)."""
        return (device.type != "cuda" or self.gpu_kernels) and _backend.runs_triton(device)

    def forward(self, node_feats: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            # scripted: the CPU operators (their library must be loaded); e3nn's code on other
            # devices, where a C++ host has no kernel of these operators
            use_ops = node_feats.device.type == "cpu" and not node_attrs.requires_grad
        else:
            use_ops = self._runs_kernels(node_feats, node_attrs)
        if not use_ops:  # e3nn's own forward (TensorProduct.forward with its internal weights)
            return self._compiled_main_left_right(node_feats, node_attrs, self.weight)
        if torch.jit.is_scripting():
            order, elem_ptr = _groups(node_attrs, self.num_elements)
        else:
            order, elem_ptr = element_groups(node_attrs, self.num_elements)
        return torch.ops.cfm.skip_tp_fwd(
            node_feats.contiguous(),
            self.weight,
            order,
            elem_ptr,
            [self._sk_ints, self._sk_coef],
            [self._sk_ints_t, self._sk_coef_t],
            self._sk_meta,
        )


# ----------------------------------------------------------------------------------------------
# The kernel table entry: MACE's skip connections, by their layout
# ----------------------------------------------------------------------------------------------
def is_skip_tp(m) -> bool:
    """An e3nn tensor product this kernel describes (:func:`cfm_plugins.ops.descriptors.skip_tp.
    why_not`): shared internal weights, a second input of one ``Ex0e`` block, weighted ``uvw``
    instructions mapping each input irrep to the same output irrep; e3nn's compiled forward
    (``_compiled_main_left_right``, the stock path) and its weight parameter."""
    if isinstance(m, FusedSkipTP) or not isinstance(m, torch.nn.Module):
        return False
    return (
        not _desc.why_not(m)
        and isinstance(getattr(m, "weight", None), torch.nn.Parameter)
        and isinstance(getattr(m, "_compiled_main_left_right", None), torch.nn.Module)
    )


def _is_block_skip_tp(m, parent, attr) -> bool:
    return attr in SKIP_ATTRS and parent is not None and is_skip_tp(m)


def _self_check(tp: torch.nn.Module, fused: FusedSkipTP) -> None:
    """The descriptor against the module's own output on a few nodes (torch ops only, where the
    weights live; skipped on the meta device): a ``ValueError`` where they differ, so that a
    module whose e3nn code computes something else is left stock."""
    w = fused.weight.detach()
    if w.device.type == "meta":
        return
    d, E = fused.descriptor, fused.num_elements
    gen = torch.Generator(device="cpu").manual_seed(0)
    n = min(E, 4)
    idx = torch.randperm(E, generator=gen)[:n].to(w.device)
    x = torch.randn(n, d.dim_in, generator=gen, dtype=torch.float64).to(w.device, w.dtype)
    y = torch.nn.functional.one_hot(idx, E).to(w.dtype)
    with torch.no_grad():
        ref = tp(x, y)
        out = x.new_zeros(n, d.dim_out)
        for (off, mul, dim), p0, p1 in zip(d.blocks, d.path_ptr[:-1], d.path_ptr[1:]):
            acc = x.new_zeros(n, mul, dim)
            for j in range(p0, p1):
                p = d.order[j]
                i_off, mul_in, _, _, _ = d.path_io[p]
                W = w[d.woff[p] : d.woff[p] + mul_in * E * mul].view(mul_in, E, mul)[:, idx, :]
                xs = x[:, i_off : i_off + mul_in * dim].view(n, mul_in, dim)
                acc = acc + d.coef[p] * torch.einsum("nkd,knm->nmd", xs, W)
            out[:, off : off + mul * dim] = acc.reshape(n, -1)
    tol = 1e-10 if w.dtype == torch.float64 else 1e-4
    err = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    if not err <= tol:
        raise ValueError(
            f"its output differs from the per-element map by {err:.2e} (relative): not the "
            "e3nn FullyConnectedTensorProduct this kernel describes"
        )


def _make(tp, parent, attr) -> FusedSkipTP:
    fused = FusedSkipTP.from_e3nn(tp, device=module_device(tp))
    _self_check(tp, fused)
    return fused


KERNEL = Kernel(
    "skip_tp",
    "the skip connection (an e3nn FullyConnectedTensorProduct with the element one-hot) as a "
    "per-element linear map",
    (
        Form(
            "MACE block skip_tp",
            recognise=_is_block_skip_tp,
            make=_make,
            is_fused=lambda m, parent, attr: isinstance(m, FusedSkipTP),
            restore=lambda fused, parent, attr: setattr(parent, attr, fused.to_e3nn()),
            named=lambda fused: fused.enable_gpu_kernels(),
        ),
    ),
)
