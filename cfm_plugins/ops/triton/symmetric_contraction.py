"""Triton kernels of ``cfm::symmetric_contraction_{fwd,bwd,bwd2}``, generated from the descriptor.

The descriptor (:mod:`cfm_plugins.ops.descriptors.symmetric_contraction`) is a tree of monomials
(``P[j] = P[parent[j]] * x[last[j]]``) and terms ``out[o] += coeff[row] * P[j]``. For one
descriptor this module writes a Triton kernel per pass in which that tree is *code*: straight-line
tile operations, walked depth first so that only the ancestors of the current monomial are live
(a few tiles in registers, not all 494 monomials of a MACE-MP-medium layer). The structure
(parents, terms, output offsets) is constant in the source; the element's folded weights
``coeff[e, row, c]`` are loaded per tile, one channel vector per term, broadcast over the tile's nodes.

Work decomposition (GPU-first; the C++ CUDA kernel loops over 128 nodes per thread instead):

- a program owns a tile of ``BLOCK_N`` nodes of one element by ``BLOCK_C`` channels. The module
  sorts nodes by element and cuts them into chunks of at most ``CHUNK`` (128) nodes of one element
  (``order``, ``chunk_ptr``); the grid is (chunk, tile within the chunk, channel tile), so a
  500-node batch of two elements gives ~100 programs of 16 nodes x 32 channels at 128 channels,
  and a chunk longer than ``SPLIT * BLOCK_N`` nodes is still covered (each program strides over it);
- forward: the polynomial per tile, stores into the mace layout;
- backward: the reverse walk of the same tree (children before parents) gives ``d out / d x``; the
  weight gradient ``d out / d coeff[e]`` is a sum over the element's nodes: each program writes the
  sum over its tile into its own slot of a partial buffer, and :mod:`._reduce` adds the slots of
  each element in a fixed order (deterministic, no atomics). ``CFM_PLUGINS_TRITON_ATOMICS=1`` adds
  into ``coeff``'s gradient with ``tl.atomic_add`` instead (not deterministic; a measured option
  for a GPU, untimed so far);
- double backward: the forward walk with the tangent (``T[j] = T[parent] x[last] + P[parent] dx[last]``)
  and the reverse walk of both, as ``cuda/symmetric_contraction/sc_math.h`` does per node.

Every launcher takes exactly the operator's arguments (its schema in ``sc_ops.h``) and returns
what the C++ kernel returns (empty tensors for outputs not requested), so it is registered as the
operator's CUDA kernel (:func:`cfm_plugins.ops.triton.register`). Inputs may be non-contiguous or
expanded (strides are passed); outputs are contiguous.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton._codegen import Writer, tl_sum
from cfm_plugins.ops.triton.configs import TileConfig, pick

__all__ = ["SCTables", "fwd", "bwd", "bwd2", "source", "kernel_variants", "CHUNK"]

#: Nodes per chunk of one element in the module's ``chunk_ptr`` (symmetric_contraction.CHUNK): the
#: grid has ceil(CHUNK / BLOCK_N) tiles per chunk; longer chunks are still covered by striding.
CHUNK = 128


def atomics() -> bool:
    """``CFM_PLUGINS_TRITON_ATOMICS=1``: weight gradients by atomic adds (not deterministic)."""
    return os.environ.get("CFM_PLUGINS_TRITON_ATOMICS", "") == "1"


@dataclass(frozen=True)
class SCTables:
    """The descriptor as the generator reads it (host copies of the operator's ``desc``/``meta``)."""

    L: int
    O: int
    out_dim: int
    R: int
    parent: tuple
    last: tuple
    term_ptr: tuple
    term_row: tuple
    term_out: tuple
    out_base: tuple
    out_stride: tuple

    @classmethod
    def from_operator(cls, desc, meta) -> "SCTables":
        """From the operator's ``desc`` (8 tensors, any device) and ``meta`` (8 ints)."""
        if len(desc) != 8 or len(meta) != 8:
            raise ValueError(f"cfm::symmetric_contraction: the descriptor is 8 tensors and 8 ints, got "
                             f"{len(desc)} and {len(meta)}")
        a = [tuple(int(v) for v in t.detach().cpu().reshape(-1).tolist()) for t in desc]
        return cls(L=int(meta[0]), O=int(meta[3]), out_dim=int(meta[4]), R=int(meta[5]), parent=a[0], last=a[1],
                   term_ptr=a[3], term_row=a[4], term_out=a[5], out_base=a[6], out_stride=a[7])

    @classmethod
    def from_descriptor(cls, d) -> "SCTables":
        """From an :class:`~cfm_plugins.ops.descriptors.symmetric_contraction.SCDescriptor`."""
        t = lambda a: tuple(int(v) for v in np.asarray(a).reshape(-1))  # noqa: E731
        return cls(L=d.num_ell, O=d.num_out, out_dim=d.out_dim, R=d.num_rows, parent=t(d.parent), last=t(d.last),
                   term_ptr=t(d.term_ptr), term_row=t(d.term_row), term_out=t(d.term_out), out_base=t(d.out_base),
                   out_stride=t(d.out_stride))

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.parent]
        for j, p in enumerate(self.parent):
            if p >= 0:
                kids[p].append(j)
        return kids

    def roots(self) -> list[int]:
        return [j for j, p in enumerate(self.parent) if p < 0]

    def terms(self, j: int) -> list[tuple[int, int]]:
        """(coefficient row, output component) of the terms of monomial ``j``."""
        return [(self.term_row[t], self.term_out[t]) for t in range(self.term_ptr[j], self.term_ptr[j + 1])]


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------
_ARGS = ("x_ptr, s_xn, s_xc, s_xl, c_ptr, s_ce, s_cr, s_cc, elem_ptr, order_ptr, chunk_ptr, C, SPLIT")


def _prologue(w: Writer, t: SCTables, extra_loads: list[str]) -> None:
    """Program -> (chunk, tile, channel tile); the loop over the chunk's tiles; x (and more) loaded."""
    w("chunk = tl.program_id(0)")
    w("sub = tl.program_id(1)")
    w("cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)")
    w("cmask = cols < C")
    w("start = tl.load(chunk_ptr + chunk)")
    w("end = tl.load(chunk_ptr + chunk + 1)")
    w("first = start + sub * BLOCK_N")
    w("elem = tl.load(elem_ptr + tl.load(order_ptr + start, mask=start < end, other=0), mask=start < end, other=0)")
    w("cb = c_ptr + elem * s_ce + cols * s_cc")
    w("slot = chunk * SPLIT + sub")
    w("for s in range(first, end, SPLIT * BLOCK_N):")
    w.indent()
    w("rows = s + tl.arange(0, BLOCK_N)")
    w("rmask = rows < end")
    w("node = tl.load(order_ptr + rows, mask=rmask, other=0)")
    w("m = rmask[:, None] & cmask[None, :]")
    w("xb = x_ptr + node[:, None] * s_xn + cols[None, :] * s_xc")
    for l in range(t.L):
        w(f"x{l} = tl.load(xb + {l} * s_xl, mask=m, other=0.0)")
    for line in extra_loads:
        w(line)


def _coef(r: int, base: str = "cb") -> str:
    return f"tl.load({base} + {r} * s_cr, mask=cmask, other=0.0)[None, :]"


def _sum(parts: list[str]) -> str:
    return " + ".join(parts)


def _store_out(w: Writer, t: SCTables, accs: dict, ptr: str) -> None:
    """Store per-component tiles into the mace layout row of each node (zeros where no term)."""
    w(f"ob = {ptr} + node[:, None] * {t.out_dim} + cols[None, :]")
    for o in range(t.O):
        val = accs.get(o, "tl.full([BLOCK_N, BLOCK_C], 0, x_ptr.dtype.element_ty)")
        stride = f" * {t.out_stride[o]}" if t.out_stride[o] != 1 else ""
        if stride:
            w(f"tl.store({ptr} + node[:, None] * {t.out_dim} + {t.out_base[o]} + cols[None, :]{stride}, {val}, mask=m)")
        else:
            w(f"tl.store(ob + {t.out_base[o]}, {val}, mask=m)")


def _store_x_like(w: Writer, t: SCTables, accs: dict, ptr: str) -> None:
    """Store per-component tiles into a contiguous [N, C, L] tensor (zeros where none)."""
    w(f"gb = {ptr} + node[:, None] * (C * {t.L}) + cols[None, :] * {t.L}")
    for l in range(t.L):
        val = accs.get(l, "tl.full([BLOCK_N, BLOCK_C], 0, x_ptr.dtype.element_ty)")
        w(f"tl.store(gb + {l}, {val}, mask=m)")


def _weight_grad(w: Writer, r: int, value: str, atomic: bool) -> None:
    """Add the tile's sum over nodes of ``value`` to row ``r`` of the weight gradient."""
    if atomic:
        w(f"tl.atomic_add(gcb + {r} * Cp, {tl_sum(value, 0)}, mask=cmask)")
    else:
        # own slot of the partial buffer: stored on the program's first tile, added after
        w(f"pp = gcb + {r} * Cp")
        w(f"tl.store(pp, tl.load(pp, mask=cmask & again, other=0.0) + {tl_sum(value, 0)}, mask=cmask)")


def _weight_grad_base(w: Writer, atomic: bool) -> None:
    if atomic:
        w("gcb = gc_ptr + elem * (R * Cp) + cols")
    else:
        w("gcb = gc_ptr + slot * (R * Cp) + cols")
        w("again = s != first")


class _Acc:
    """Named accumulators: the first contribution assigns, later ones add."""

    def __init__(self, w: Writer, prefix: str):
        self.w, self.prefix, self.names = w, prefix, {}

    def add(self, key: int, expr: str) -> None:
        name = f"{self.prefix}{key}"
        if key in self.names:
            self.w(f"{name} += {expr}")
        else:
            self.w(f"{name} = {expr}")
            self.names[key] = name


def _gen_fwd(t: SCTables) -> str:
    w = Writer()
    w("@triton.jit")
    w(f"def sc_fwd({_ARGS}, out_ptr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):")
    w.indent()
    _prologue(w, t, [])
    kids = t.children()
    acc = _Acc(w, "acc")

    def visit(j: int, pj: str) -> None:
        for r, o in t.terms(j):
            acc.add(o, f"{_coef(r)} * {pj}")
        for k in kids[j]:
            w(f"p{k} = {pj} * x{t.last[k]}")
            visit(k, f"p{k}")

    for j in t.roots():
        visit(j, f"x{t.last[j]}")
    _store_out(w, t, acc.names, "out_ptr")
    return w.text()


def _gen_bwd(t: SCTables, need_gx: bool, need_gc: bool, atomic: bool) -> str:
    w = Writer()
    w("@triton.jit")
    w(f"def sc_bwd({_ARGS}, g_ptr, s_gn, s_gd, gx_ptr, gc_ptr, R, Cp, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):")
    w.indent()
    g_loads = ["gob = g_ptr + node[:, None] * s_gn"]
    g_loads += [f"g{o} = tl.load(gob + ({t.out_base[o]} + cols[None, :] * {t.out_stride[o]}) * s_gd, mask=m, other=0.0)"
                for o in range(t.O)]
    _prologue(w, t, g_loads)
    if need_gc:
        _weight_grad_base(w, atomic)
    kids = t.children()
    gx = _Acc(w, "gx")

    def visit(j: int, pj: str):
        """Emit the subtree of j; return the name of d out / d P_j (None when not needed)."""
        parts = [f"{_coef(r)} * g{o}" for r, o in t.terms(j)] if need_gx else []
        if need_gc:
            for r, o in t.terms(j):
                _weight_grad(w, r, f"g{o} * {pj}", atomic)
        for k in kids[j]:
            lk = t.last[k]
            w(f"p{k} = {pj} * x{lk}")
            bk = visit(k, f"p{k}")
            if bk is not None:
                gx.add(lk, f"{bk} * {pj}")
                parts.append(f"{bk} * x{lk}")
        if not parts:
            return None
        w(f"b{j} = {_sum(parts)}")
        return f"b{j}"

    for j in t.roots():
        bj = visit(j, f"x{t.last[j]}")
        if bj is not None:
            gx.add(t.last[j], bj)
    if need_gx:
        _store_x_like(w, t, gx.names, "gx_ptr")
    return w.text()


def _gen_bwd2(t: SCTables, need_gg: bool, need_gx: bool, need_gc: bool, has_dx: bool, has_dc: bool,
              atomic: bool) -> str:
    w = Writer()
    w("@triton.jit")
    w(f"def sc_bwd2({_ARGS}, g_ptr, s_gn, s_gd, dx_ptr, s_dn, s_dc, s_dl, dc_ptr, s_de, s_dr, s_dcc, gg_ptr, "
      "gx_ptr, gc_ptr, R, Cp, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):")
    w.indent()
    loads = ["gob = g_ptr + node[:, None] * s_gn"]
    loads += [f"g{o} = tl.load(gob + ({t.out_base[o]} + cols[None, :] * {t.out_stride[o]}) * s_gd, mask=m, other=0.0)"
              for o in range(t.O)]
    if has_dx:
        loads.append("db = dx_ptr + node[:, None] * s_dn + cols[None, :] * s_dc")
        loads += [f"d{l} = tl.load(db + {l} * s_dl, mask=m, other=0.0)" for l in range(t.L)]
    _prologue(w, t, loads)
    if has_dc:
        w("dcb = dc_ptr + elem * s_de + cols * s_dcc")
    gc_needed = need_gc and has_dx  # d/dcoeff of <g, sum coeff T>; the dcoeff term has no coeff in it
    if gc_needed:
        _weight_grad_base(w, atomic)
    kids = t.children()
    gg = _Acc(w, "gg")
    xb = _Acc(w, "xb")

    def dcoef(r: int) -> str:
        return f"tl.load(dcb + {r} * s_dr, mask=cmask, other=0.0)[None, :]"

    def visit(j: int, pj: str, tj: str | None):
        """Emit the subtree of j (P and tangent T); return (adjoint of T_j, adjoint of P_j) names."""
        bt_parts, bp_parts = [], []
        for r, o in t.terms(j):
            if need_gg:
                val = []
                if tj is not None:
                    val.append(f"{_coef(r)} * {tj}")
                if has_dc:
                    val.append(f"{dcoef(r)} * {pj}")
                if val:
                    gg.add(o, _sum(val))
            if gc_needed:
                _weight_grad(w, r, f"g{o} * {tj}", atomic)
            if need_gx:
                if has_dx:
                    bt_parts.append(f"g{o} * {_coef(r)}")
                if has_dc:
                    bp_parts.append(f"g{o} * {dcoef(r)}")
        for k in kids[j]:
            lk = t.last[k]
            w(f"p{k} = {pj} * x{lk}")
            tk = None
            if has_dx:
                w(f"t{k} = {tj} * x{lk} + {pj} * d{lk}")
                tk = f"t{k}"
            btk, bpk = visit(k, f"p{k}", tk)
            if not need_gx:
                continue
            contrib = []
            if btk is not None:
                bt_parts.append(f"{btk} * x{lk}")
                bp_parts.append(f"{btk} * d{lk}")
                contrib.append(f"{btk} * {tj}")
            if bpk is not None:
                bp_parts.append(f"{bpk} * x{lk}")
                contrib.append(f"{bpk} * {pj}")
            if contrib:
                xb.add(lk, _sum(contrib))
        bt = bp = None
        if bt_parts:
            w(f"bt{j} = {_sum(bt_parts)}")
            bt = f"bt{j}"
        if bp_parts:
            w(f"bp{j} = {_sum(bp_parts)}")
            bp = f"bp{j}"
        return bt, bp

    for j in t.roots():
        lj = t.last[j]
        _, bp = visit(j, f"x{lj}", f"d{lj}" if has_dx else None)
        if need_gx and bp is not None:  # P = x[l]; T = dx[l] has no x in it
            xb.add(lj, bp)
    if need_gg:
        _store_out(w, t, gg.names, "gg_ptr")
    if need_gx:
        _store_x_like(w, t, xb.names, "gx_ptr")
    return w.text()


_HEADER = ('"""Generated by cfm_plugins.ops.triton.symmetric_contraction from a descriptor: do not edit."""\n'
           "import triton\nimport triton.language as tl\n\n\n")


def source(t: SCTables, kernel: str, **flags) -> str:
    """The module source of one kernel variant: ``fwd``; ``bwd`` (need_gx, need_gc, atomic);
    ``bwd2`` (need_gg, need_gx, need_gc, has_dx, has_dc, atomic)."""
    if kernel == "fwd":
        body = _gen_fwd(t)
    elif kernel == "bwd":
        body = _gen_bwd(t, flags["need_gx"], flags["need_gc"], flags.get("atomic", False))
    elif kernel == "bwd2":
        body = _gen_bwd2(t, flags["need_gg"], flags["need_gx"], flags["need_gc"], flags["has_dx"], flags["has_dc"],
                         flags.get("atomic", False))
    else:
        raise ValueError(f"unknown symmetric contraction kernel {kernel!r}")
    return _HEADER + body


def kernel_variants() -> list[tuple[str, dict]]:
    """The variants a MACE run launches (inference, forces, force training): what the
    ahead-of-time check compiles. Other flag combinations are generated on demand the same way."""
    return [
        ("fwd", {}),
        ("bwd", dict(need_gx=True, need_gc=False)),
        ("bwd", dict(need_gx=True, need_gc=True)),
        ("bwd", dict(need_gx=False, need_gc=True)),
        ("bwd2", dict(need_gg=True, need_gx=True, need_gc=True, has_dx=True, has_dc=False)),
        ("bwd2", dict(need_gg=True, need_gx=True, need_gc=True, has_dx=True, has_dc=True)),
    ]


# ---------------------------------------------------------------------------------------------
# Launchers: the operators' CUDA kernels (and, in the tests, their CPU kernels under the interpreter)
# ---------------------------------------------------------------------------------------------
_TABLES = _codegen.TableCache(SCTables.from_operator)


def _kernel(desc, meta, kernel: str, **flags):
    tables = _TABLES.get(desc, meta)
    name = f"sc_{kernel}" + "".join(f"_{k}{int(v)}" for k, v in sorted(flags.items()))
    mod = _codegen.load_source(name, source(tables, kernel, **flags))
    return getattr(mod, f"sc_{kernel}"), tables


def _dtype_name(x: torch.Tensor) -> str:
    return "float64" if x.dtype == torch.float64 else "float32"


def _check(op: str, x, coeff, elem, order, chunk_ptr, desc, meta) -> None:
    """The checks of the C++ binding layer (sc_ops.h make_args), without the contiguity rule."""
    if len(desc) != 8 or len(meta) != 8:
        raise RuntimeError(f"{op}: the descriptor is 8 tensors and 8 ints, got {len(desc)} and {len(meta)}")
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{op}: x must be float32 or float64, got {x.dtype}")
    if coeff.dtype != x.dtype or coeff.device != x.device:
        raise RuntimeError(f"{op}: coeff is {coeff.dtype} on {coeff.device}, expected {x.dtype} on {x.device}")
    if x.dim() != 3 or x.shape[1] != meta[6] or x.shape[2] != meta[0]:
        raise RuntimeError(f"{op}: x must be [N, {meta[6]}, {meta[0]}], got {list(x.shape)}")
    if coeff.dim() != 3 or coeff.shape[1] != meta[5] or coeff.shape[2] != meta[7]:
        raise RuntimeError(f"{op}: coeff must be [E, {meta[5]}, {meta[7]}], got {list(coeff.shape)}")
    for name, idx in (("elem", elem), ("order", order), ("chunk_ptr", chunk_ptr)):
        if idx.dtype != torch.int64 or idx.device != x.device:
            raise RuntimeError(f"{op}: {name} must be int64 on {x.device}, got {idx.dtype} on {idx.device}")
    if elem.numel() != x.shape[0] or order.numel() != x.shape[0] or chunk_ptr.numel() < 1:
        raise RuntimeError(f"{op}: elem and order must have one entry per node")
    for i, d in enumerate(desc):
        if d.device != x.device:
            raise RuntimeError(f"{op}: descriptor table {i} is on {d.device} but x is on {x.device} "
                               "(move the module with .to())")


def _check_like(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, shape) -> None:
    if t.dtype != ref.dtype or t.device != ref.device or list(t.shape) != list(shape):
        raise RuntimeError(f"{op}: {name} must be {ref.dtype} {list(shape)} on {ref.device}, got {t.dtype} "
                           f"{list(t.shape)} on {t.device}")


def _grid(cfg: TileConfig, n: int, n_chunks: int, channels: int) -> tuple[tuple, int]:
    split = max(1, min(math.ceil(CHUNK / cfg.block_rows), math.ceil(n / cfg.block_rows)))
    return (n_chunks, split, math.ceil(channels / cfg.block_c)), split


def _fit(chunk_ptr, meta) -> tuple[int, int]:
    return _codegen.widest_segment(chunk_ptr), int(meta[6])


def _common(x, coeff, elem, order, chunk_ptr):
    idx = [t.contiguous() for t in (elem, order, chunk_ptr)]
    return [x, *x.stride(), coeff, *coeff.stride(), *idx]


class _WeightGrad:
    """The weight gradient of one launch: a partial buffer (one slot per program tile) reduced per
    element in a fixed order, or (atomics) the gradient itself, zeroed, added into."""

    def __init__(self, coeff: torch.Tensor, n_chunks: int, split: int, atomic: bool):
        E, R, Cp = coeff.shape
        self.atomic = atomic
        if atomic:
            self.target = torch.zeros(E, R, Cp, dtype=coeff.dtype, device=coeff.device)
        else:
            self.target = torch.empty(n_chunks * split, R, Cp, dtype=coeff.dtype, device=coeff.device)

    def finish(self, coeff, elem, order, chunk_ptr, channels: int, split: int, block_n: int) -> torch.Tensor:
        if self.atomic:
            return self.target
        from cfm_plugins.ops.triton._reduce import element_sum

        return element_sum(self.target, coeff, elem, order, chunk_ptr, channels, split, block_n)


def fwd(x, coeff, elem, order, chunk_ptr, desc, meta):
    """``cfm::symmetric_contraction_fwd``: out [N, out_dim] in mace's layout."""
    op = "cfm::symmetric_contraction_fwd"
    _check(op, x, coeff, elem, order, chunk_ptr, desc, meta)
    out = torch.empty(x.shape[0], meta[4], dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    kern, _ = _kernel(desc, meta, "fwd")
    n_chunks = chunk_ptr.numel() - 1
    args = _common(x, coeff, elem, order, chunk_ptr)

    def run(cfg):
        grid, split = _grid(cfg, x.shape[0], n_chunks, meta[6])
        kern[grid](*args, meta[6], split, out, BLOCK_N=cfg.block_rows, BLOCK_C=cfg.block_c,
                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    run(pick("sc_fwd", _dtype_name(x), x.shape[0], run, fit=_fit(chunk_ptr, meta)))
    return out


def bwd(gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc):
    """``cfm::symmetric_contraction_bwd``: (d/dx, d/dcoeff) of <gout, out>."""
    op = "cfm::symmetric_contraction_bwd"
    _check(op, x, coeff, elem, order, chunk_ptr, desc, meta)
    _check_like(op, "gout", gout, x, [x.shape[0], meta[4]])
    none = x.new_empty(0)
    if not (need_gx or need_gc):
        return none, none
    gx = x.new_empty(x.shape) if need_gx else none
    if x.shape[0] == 0:
        return (gx, torch.zeros_like(coeff) if need_gc else none)
    atomic = atomics()
    kern, _ = _kernel(desc, meta, "bwd", need_gx=bool(need_gx), need_gc=bool(need_gc), atomic=atomic and need_gc)
    n_chunks = chunk_ptr.numel() - 1
    args = _common(x, coeff, elem, order, chunk_ptr)
    E, R, Cp = coeff.shape
    result = {}

    def run(cfg):
        grid, split = _grid(cfg, x.shape[0], n_chunks, meta[6])
        wg = _WeightGrad(coeff, n_chunks, split, atomic) if need_gc else None
        kern[grid](*args, meta[6], split, gout, *gout.stride(), gx, wg.target if wg else none, R, Cp,
                   BLOCK_N=cfg.block_rows, BLOCK_C=cfg.block_c, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if wg is not None:
            result["gc"] = wg.finish(coeff, elem, order, chunk_ptr, meta[6], split, cfg.block_rows)

    run(pick("sc_bwd", _dtype_name(x), x.shape[0], run, idempotent=not atomic, fit=_fit(chunk_ptr, meta)))
    return gx, result.get("gc", none)


def bwd2(gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc, meta, need_ggout, need_gx, need_gc):
    """``cfm::symmetric_contraction_bwd2``: gradients of <dx, gx> + <dcoeff, gc> with respect to
    (gout, x, coeff), where (gx, gc) is ``bwd`` of (gout, x, coeff)."""
    op = "cfm::symmetric_contraction_bwd2"
    _check(op, x, coeff, elem, order, chunk_ptr, desc, meta)
    _check_like(op, "gout", gout, x, [x.shape[0], meta[4]])
    has_dx, has_dc = dx is not None and dx.numel() > 0, dcoeff is not None and dcoeff.numel() > 0
    if has_dx:
        _check_like(op, "dx", dx, x, x.shape)
    if has_dc:
        _check_like(op, "dcoeff", dcoeff, coeff, coeff.shape)
    none = x.new_empty(0)
    gg = x.new_empty(gout.shape) if need_ggout else none
    gx2 = x.new_empty(x.shape) if need_gx else none
    gc_wanted = bool(need_gc)
    gc_computed = gc_wanted and has_dx
    work = (need_ggout or need_gx or gc_computed) and (has_dx or has_dc) and x.shape[0] > 0
    if not work:
        if need_ggout:
            gg.zero_()
        if need_gx:
            gx2.zero_()
        return gg, gx2, (torch.zeros_like(coeff) if gc_wanted else none)
    atomic = atomics()
    kern, _ = _kernel(desc, meta, "bwd2", need_gg=bool(need_ggout), need_gx=bool(need_gx), need_gc=gc_computed,
                      has_dx=has_dx, has_dc=has_dc, atomic=atomic and gc_computed)
    n_chunks = chunk_ptr.numel() - 1
    args = _common(x, coeff, elem, order, chunk_ptr)
    E, R, Cp = coeff.shape
    dx_args = [dx, *dx.stride()] if has_dx else [none, 0, 0, 0]
    dc_args = [dcoeff, *dcoeff.stride()] if has_dc else [none, 0, 0, 0]
    result = {}

    def run(cfg):
        grid, split = _grid(cfg, x.shape[0], n_chunks, meta[6])
        wg = _WeightGrad(coeff, n_chunks, split, atomic) if gc_computed else None
        kern[grid](*args, meta[6], split, gout, *gout.stride(), *dx_args, *dc_args, gg, gx2,
                   wg.target if wg else none, R, Cp, BLOCK_N=cfg.block_rows, BLOCK_C=cfg.block_c,
                   num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if wg is not None:
            result["gc"] = wg.finish(coeff, elem, order, chunk_ptr, meta[6], split, cfg.block_rows)

    run(pick("sc_bwd2", _dtype_name(x), x.shape[0], run, idempotent=not atomic, fit=_fit(chunk_ptr, meta)))
    gc = result.get("gc", torch.zeros_like(coeff) if gc_wanted else none)
    return gg, gx2, gc
