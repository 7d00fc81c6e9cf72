"""Triton kernels of ``cfm::symmetric_contraction_{fwd,bwd,bwd2}``, generated from the descriptor.

The descriptor (:mod:`cfm_plugins.ops.descriptors.symmetric_contraction`) is a tree of monomials
(``P[j] = P[parent[j]] * x[last[j]]``) and terms ``out[o] += coeff[row] * P[j]``. The kernels walk
that tree depth first, reading the walk from a small int32 table (:attr:`SCTables.walk`), so only
the current monomial's ancestors are live: one register tile per depth, whatever the number of
monomials. The source is generated per descriptor *shape* (:func:`source`, which says why the
tree is not straight-line code); the grid and the passes are described at :func:`_grid`.

Every launcher takes exactly the operator's arguments (its schema in ``sc_ops.h``) and returns
what the C++ kernel returns (empty tensors for outputs not requested), so it is registered as the
operator's CUDA kernel (:func:`cfm_plugins.ops.triton.register`). Inputs may be non-contiguous or
expanded (strides are passed); outputs are contiguous.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton._codegen import Writer, tl_sum
from cfm_plugins.ops.triton.configs import TileConfig, launch, run_tile

__all__ = ["SCTables", "fwd", "bwd", "bwd2", "source", "kernel_variants", "CHUNK"]

#: Nodes per chunk of one element in the module's ``chunk_ptr`` (symmetric_contraction.CHUNK): the
#: grid has ceil(CHUNK / BLOCK_N) tiles per chunk; longer chunks are still covered by striding.
CHUNK = 128


@dataclass(frozen=True)
class SCTables:
    """The descriptor as the generator reads it (host copies of the operator's
    ``desc``/``meta``)."""

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
    def from_operator(cls, desc, meta) -> SCTables:
        """From the operator's ``desc`` (8 tensors, any device) and ``meta`` (8 ints)."""
        if len(desc) != 8 or len(meta) != 8:
            raise ValueError(
                f"cfm::symmetric_contraction: the descriptor is 8 tensors and 8 ints, got "
                f"{len(desc)} and {len(meta)}"
            )
        a = [tuple(int(v) for v in t.detach().cpu().reshape(-1).tolist()) for t in desc]
        return cls(
            L=int(meta[0]),
            O=int(meta[3]),
            out_dim=int(meta[4]),
            R=int(meta[5]),
            parent=a[0],
            last=a[1],
            term_ptr=a[3],
            term_row=a[4],
            term_out=a[5],
            out_base=a[6],
            out_stride=a[7],
        )

    @classmethod
    def from_descriptor(cls, d) -> SCTables:
        """From an :class:`~cfm_plugins.ops.descriptors.symmetric_contraction.SCDescriptor`."""
        t = lambda a: tuple(int(v) for v in np.asarray(a).reshape(-1))  # noqa: E731
        return cls(
            L=d.num_ell,
            O=d.num_out,
            out_dim=d.out_dim,
            R=d.num_rows,
            parent=t(d.parent),
            last=t(d.last),
            term_ptr=t(d.term_ptr),
            term_row=t(d.term_row),
            term_out=t(d.term_out),
            out_base=t(d.out_base),
            out_stride=t(d.out_stride),
        )

    @property
    def J(self) -> int:
        """Number of monomials."""
        return len(self.parent)

    @functools.cached_property
    def depths(self) -> tuple:
        """Degree of each monomial (1 for the x components themselves)."""
        out = []
        for p in self.parent:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    @property
    def D(self) -> int:
        """Largest degree (the correlation order)."""
        return max(self.depths, default=1)

    @functools.cached_property
    def walk(self) -> np.ndarray:
        """The int32 table the kernels walk (offsets: ``_Layout``): the monomials in depth-first
        pre-order; the depth-first events (``j`` entering monomial j, ``J + j`` leaving it after
        all its children); depth, last factor and term range of each monomial; each term's
        coefficient row and output component."""
        kids = self.children()
        pre, events = [], []

        def visit(j):
            pre.append(j)
            events.append(j)
            for k in kids[j]:
                visit(k)
            events.append(self.J + j)

        for r in self.roots():
            visit(r)
        return np.concatenate(
            [
                np.asarray(a, dtype=np.int32).reshape(-1)
                for a in (
                    pre,
                    events,
                    self.depths,
                    self.last,
                    self.term_ptr,
                    self.term_row,
                    self.term_out,
                )
            ]
        )

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
        return [
            (self.term_row[t], self.term_out[t])
            for t in range(self.term_ptr[j], self.term_ptr[j + 1])
        ]


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------
_ARGS = (
    "x_ptr, s_xn, s_xc, s_xl, c_ptr, s_ce, s_cr, s_cc, "
    "elem_ptr, order_ptr, chunk_ptr, slot_ptr, tab_ptr, C, SPLIT"
)


class _Layout:
    """Offsets of the walk tables in the one int32 ``tab`` tensor (constants of the source)."""

    def __init__(self, t: SCTables):
        J, T = t.J, len(t.term_row)
        self.PRE, self.EV = 0, J
        self.DEPTH = 3 * J
        self.LAST = 4 * J
        self.TPTR = 5 * J
        self.TROW = 6 * J + 1
        self.TOUT = 6 * J + 1 + T
        self.size = 6 * J + 1 + 2 * T


def _prologue(w: Writer, t: SCTables, extra_loads: list[str]) -> None:
    """Program -> (chunk, tile, channel tile); the loop over the chunk's tiles (the caller closes
    it); the tile's rows, masks and x base pointer."""
    w("chunk = tl.program_id(0)")
    w("sub = tl.program_id(1)")
    w("cols = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)")
    w("cmask = cols < C")
    w("start = tl.load(chunk_ptr + chunk)")
    w("end = tl.load(chunk_ptr + chunk + 1)")
    w("first = start + sub * BLOCK_N")
    w(
        "elem = tl.load(elem_ptr + tl.load(order_ptr + start, mask=start < end, other=0), "
        "mask=start < end, other=0)"
    )
    w("cb = c_ptr + elem * s_ce + cols * s_cc")
    w("for s in range(first, end, SPLIT * BLOCK_N):")
    w.indent()
    w("rows = s + tl.arange(0, BLOCK_N)")
    w("rmask = rows < end")
    w("node = tl.load(order_ptr + rows, mask=rmask, other=0)")
    w("m = rmask[:, None] & cmask[None, :]")
    w("xb = x_ptr + node[:, None] * s_xn + cols[None, :] * s_xc")
    w("zero = tl.full([BLOCK_N, BLOCK_C], 0, x_ptr.dtype.element_ty)")
    for line in extra_loads:
        w(line)


def _chain(w: Writer, var: str, count: int, body) -> None:
    """``if var == 0: body(0) elif var == 1: body(1) ... else: body(count-1)`` (uniform branches:
    ``var`` is the same for the whole program)."""
    if count == 1:
        body(0)
        return
    for k in range(count):
        if k == 0:
            w(f"if {var} == 0:")
        elif k < count - 1:
            w(f"elif {var} == {k}:")
        else:
            w("else:")
        w.indent()
        body(k)
        w.dedent()


def _depth_chain(w: Writer, D: int, body) -> None:
    """The same over the depth ``d`` (1..D) of the monomial being visited."""
    _chain(w, "dm1", D, lambda k: body(k + 1))


def _visit_header(w: Writer, lay: _Layout, index: str) -> None:
    """Monomial ``j`` (from the walk table at ``index``): its depth ``dm1`` (0-based) and last
    factor."""
    w(f"j = tl.load(tab_ptr + {index})")
    w(f"dm1 = tl.load(tab_ptr + {lay.DEPTH} + j) - 1")
    w(f"xl = tl.load(xb + tl.load(tab_ptr + {lay.LAST} + j) * s_xl, mask=m, other=0.0)")


def _store_out(w: Writer, t: SCTables, ptr: str, prefix: str) -> None:
    """Store the O component tiles ``{prefix}{o}`` into the mace layout row of each node."""
    w(f"ob = {ptr} + node[:, None] * {t.out_dim}")
    for o in range(t.O):
        step = "cols[None, :]" if t.out_stride[o] == 1 else f"cols[None, :] * {t.out_stride[o]}"
        w(f"tl.store(ob + {t.out_base[o]} + {step}, {prefix}{o}, mask=m)")


def _store_x_like(w: Writer, t: SCTables, ptr: str, prefix: str) -> None:
    """Store the L component tiles ``{prefix}{l}`` into a contiguous [N, C, L] tensor."""
    w(f"gb = {ptr} + node[:, None] * (C * {t.L}) + cols[None, :] * {t.L}")
    for l in range(t.L):
        w(f"tl.store(gb + {l}, {prefix}{l}, mask=m)")


def _zeros(w: Writer, names) -> None:
    for n in names:
        w(f"{n} = zero")


def _weight_grad_base(w: Writer) -> None:
    w("gcb = gc_ptr + (tl.load(slot_ptr + chunk) + sub) * (R * Cp) + cols")
    w("again = s != first")


def _weight_grad(w: Writer, value: str) -> None:
    """Add the tile's sum over nodes of ``value`` to row ``r`` of the weight gradient: its own
    slot of the partial buffer (stored on the program's first tile, added after)."""
    w("pp = gcb + r * Cp")
    # `!= 0`: Triton 3.9's interpreter splats the scalar `again` as int32 and then refuses
    # the mask ("mask has unsupported dtype"); compiled, the kernels are the same instructions
    # (sm_90 and gfx942 assembly compared with Triton 3.7.1 and 3.9.0)
    w(
        f"tl.store(pp, tl.load(pp, mask=(cmask & again) != 0, other=0.0) + "
        f"{tl_sum(value, 0)}, mask=cmask)"
    )


def _walk_open(w: Writer, t: SCTables, lay: _Layout, reverse: bool) -> None:
    """Open the loop of the walk and the visit of monomial ``j``: over the pre-order (forward
    passes), or over the enter/leave events (passes with adjoints: the caller closes the enter
    branch with :func:`_leave_header`)."""
    w(f"for k in range(0, {2 * t.J if reverse else t.J}):")
    w.indent()
    if reverse:
        w(f"code = tl.load(tab_ptr + {lay.EV} + k)")
        w(f"if code < {t.J}:")
        w.indent()
    _visit_header(w, lay, f"{lay.EV} + k" if reverse else f"{lay.PRE} + k")


def _leave_header(w: Writer, t: SCTables, lay: _Layout) -> None:
    """Close the enter branch of the event loop and open the leave branch: monomial ``j`` with its
    depth ``dm1`` and last factor ``lj``."""
    w.dedent()
    w("else:")
    w.indent()
    w(f"j = code - {t.J}")
    w(f"dm1 = tl.load(tab_ptr + {lay.DEPTH} + j) - 1")
    w(f"lj = tl.load(tab_ptr + {lay.LAST} + j)")


def _term_loop(w: Writer, lay: _Layout, body) -> None:
    """Loop over the terms of monomial ``j``: ``r`` (coefficient row) and ``o`` (output
    component)."""
    w(f"for q in range(tl.load(tab_ptr + {lay.TPTR} + j), tl.load(tab_ptr + {lay.TPTR} + j + 1)):")
    w.indent()
    w(f"r = tl.load(tab_ptr + {lay.TROW} + q)")
    w(f"o = tl.load(tab_ptr + {lay.TOUT} + q)")
    body()
    w.dedent()


def _coef(base: str = "cb", stride: str = "s_cr") -> str:
    return f"tl.load({base} + r * {stride}, mask=cmask, other=0.0)[None, :]"


def _enter_forward(w: Writer, D: int, tangent: bool) -> None:
    """At the entry of monomial j (depth d): P_d = P_{d-1} x_l (x_l at depth 1), its factor kept as
    X_d; with ``tangent`` also T_d = T_{d-1} x_l + P_{d-1} dx_l (dx_l at depth 1), dX_d = dx_l.
    ``p`` (and ``tv``) name the current values."""

    def body(d):
        if d == 1:
            w("P1 = xl")
        else:
            w(f"P{d} = P{d - 1} * xl")
        w(f"X{d} = xl")
        w(f"p = P{d}")
        if tangent:
            w("T1 = dl" if d == 1 else f"T{d} = T{d - 1} * xl + P{d - 1} * dl")
            w(f"DX{d} = dl")
            w(f"tv = T{d}")

    _depth_chain(w, D, body)


def _pick_g(w: Writer, t: SCTables) -> None:
    """``go`` = the grad-output tile of component ``o``."""
    _chain(w, "o", t.O, lambda k: w(f"go = g{k}"))


def _gen_fwd(t: SCTables) -> str:
    lay, D = _Layout(t), t.D
    w = Writer()
    w("@triton.jit")
    w(f"def sc_fwd({_ARGS}, out_ptr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):")
    w.indent()
    _prologue(w, t, [])
    _zeros(w, [f"acc{o}" for o in range(t.O)] + [f"P{d}" for d in range(1, D + 1)])
    _walk_open(w, t, lay, reverse=False)
    _enter_forward(w, D, tangent=False)

    def term():
        w(f"v = {_coef()} * p")
        _chain(w, "o", t.O, lambda k: w(f"acc{k} += v"))

    _term_loop(w, lay, term)
    w.dedent()
    _store_out(w, t, "out_ptr", "acc")
    return w.text()


def _g_loads(t: SCTables) -> list[str]:
    lines = ["gob = g_ptr + node[:, None] * s_gn"]
    return lines + [
        f"g{o} = tl.load(gob + ({t.out_base[o]} + cols[None, :] * {t.out_stride[o]}) * s_gd, "
        "mask=m, other=0.0)"
        for o in range(t.O)
    ]


def _gen_bwd(t: SCTables, need_gx: bool, need_gc: bool) -> str:
    """d/dx by the reverse walk: entering monomial j computes P_j and seeds its adjoint
    A_d = sum_terms coeff * g; leaving it (all its children done) adds A_d P_{d-1} to gx[l] and
    A_d x_l to the parent's adjoint. d/dcoeff: the tile's sum of g_o P_j per term."""
    lay, D = _Layout(t), t.D
    w = Writer()
    w("@triton.jit")
    w(
        f"def sc_bwd({_ARGS}, g_ptr, s_gn, s_gd, gx_ptr, gc_ptr, R, Cp, BLOCK_N: tl.constexpr, "
        "BLOCK_C: tl.constexpr):"
    )
    w.indent()
    _prologue(w, t, _g_loads(t))
    if need_gc:
        _weight_grad_base(w)
    _zeros(w, [f"P{d}" for d in range(1, D + 1)] + [f"X{d}" for d in range(1, D + 1)])
    if need_gx:
        _zeros(w, [f"A{d}" for d in range(1, D + 1)] + [f"gx{l}" for l in range(t.L)])
    _walk_open(w, t, lay, reverse=need_gx)
    _enter_forward(w, D, tangent=False)
    if need_gx:
        w("seed = zero")

    def term():
        _pick_g(w, t)
        if need_gx:
            w(f"seed += {_coef()} * go")
        if need_gc:
            _weight_grad(w, "go * p")

    _term_loop(w, lay, term)
    if need_gx:
        _depth_chain(w, D, lambda d: w(f"A{d} = seed"))
        _leave_header(w, t, lay)

        def leave(d):
            if d == 1:
                w("v = A1")
            else:
                w(f"v = A{d} * P{d - 1}")
                w(f"A{d - 1} += A{d} * X{d}")

        _depth_chain(w, D, leave)
        _chain(w, "lj", t.L, lambda l: w(f"gx{l} += v"))
        w.dedent()
    w.dedent()
    if need_gx:
        _store_x_like(w, t, "gx_ptr", "gx")
    return w.text()


def _gen_bwd2(
    t: SCTables,
    need_gg: bool,
    need_gx: bool,
    need_gc: bool,
    has_dx: bool,
    has_dc: bool,
) -> str:
    """Gradients of <dx, gx> + <dcoeff, gc> (gx, gc: the backward of <g, out>) with respect to g, x
    and coeff. Entering monomial j: P_j and its tangent T_j along dx; gg_o += coeff T_j + dcoeff
    P_j; d/dcoeff += g_o T_j; adjoint seeds AT_d = sum g coeff, AP_d = sum g dcoeff. Leaving it: the
    reverse of T_d = T_{d-1} x + P_{d-1} dx and P_d = P_{d-1} x into the parent's adjoints and
    xb[l]."""
    lay, D = _Layout(t), t.D
    w = Writer()
    w("@triton.jit")
    w(
        f"def sc_bwd2({_ARGS}, g_ptr, s_gn, s_gd, dx_ptr, s_dn, s_dc, s_dl, dc_ptr, s_de, s_dr, "
        "s_dcc, gg_ptr, gx_ptr, gc_ptr, R, Cp, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):"
    )
    w.indent()
    loads = _g_loads(t)
    if has_dx:
        loads.append("db = dx_ptr + node[:, None] * s_dn + cols[None, :] * s_dc")
    _prologue(w, t, loads)
    if has_dc:
        w("dcb = dc_ptr + elem * s_de + cols * s_dcc")
    gc_needed = (
        need_gc and has_dx
    )  # d/dcoeff of <g, sum coeff T>; the dcoeff term has no coeff in it
    if gc_needed:
        _weight_grad_base(w)
    names = [f"P{d}" for d in range(1, D + 1)] + [f"X{d}" for d in range(1, D + 1)]
    if has_dx:
        names += [f"T{d}" for d in range(1, D + 1)] + [f"DX{d}" for d in range(1, D + 1)]
    if need_gg:
        names += [f"gg{o}" for o in range(t.O)]
    if need_gx:
        names += [f"AT{d}" for d in range(1, D + 1)] + [f"AP{d}" for d in range(1, D + 1)]
        names += [f"xb{l}" for l in range(t.L)]
    _zeros(w, names)
    _walk_open(w, t, lay, reverse=need_gx)
    if has_dx:
        w(f"dl = tl.load(db + tl.load(tab_ptr + {lay.LAST} + j) * s_dl, mask=m, other=0.0)")
    _enter_forward(w, D, tangent=has_dx)
    if need_gx:
        w("st = zero")
        w("sp = zero")

    def term():
        if need_gg:
            parts = ([f"{_coef()} * tv"] if has_dx else []) + (
                [f"{_coef('dcb', 's_dr')} * p"] if has_dc else []
            )
            if parts:
                w(f"v = {' + '.join(parts)}")
                _chain(w, "o", t.O, lambda k: w(f"gg{k} += v"))
        if gc_needed or need_gx:
            _pick_g(w, t)
        if gc_needed:
            _weight_grad(w, "go * tv")
        if need_gx:
            if has_dx:
                w(f"st += go * {_coef()}")
            if has_dc:
                w(f"sp += go * {_coef('dcb', 's_dr')}")

    _term_loop(w, lay, term)
    if need_gx:

        def seed(d):
            w(f"AT{d} = st")
            w(f"AP{d} = sp")

        _depth_chain(w, D, seed)
        _leave_header(w, t, lay)

        def leave(d):
            if d == 1:  # P = x[l]; T = dx[l] has no x in it
                w("v = AP1")
                return
            parts = []
            if has_dx:
                w(f"AT{d - 1} += AT{d} * X{d}")
                w(f"AP{d - 1} += AT{d} * DX{d} + AP{d} * X{d}")
                parts.append(f"AT{d} * T{d - 1}")
            else:
                w(f"AP{d - 1} += AP{d} * X{d}")
            parts.append(f"AP{d} * P{d - 1}")
            w(f"v = {' + '.join(parts)}")

        _depth_chain(w, D, leave)
        _chain(w, "lj", t.L, lambda l: w(f"xb{l} += v"))
        w.dedent()
    w.dedent()
    if need_gg:
        _store_out(w, t, "gg_ptr", "gg")
    if need_gx:
        _store_x_like(w, t, "gx_ptr", "xb")
    return w.text()


_HEADER = (
    '"""Generated by cfm_plugins.ops.triton.symmetric_contraction from a descriptor: do not '
    'edit."""\n'
    "import triton\nimport triton.language as tl\n\n\n"
)


def source(t: SCTables, kernel: str, **flags) -> str:
    """The module source of one kernel variant: ``fwd``; ``bwd`` (need_gx, need_gc); ``bwd2``
    (need_gg, need_gx, need_gc, has_dx, has_dc).

    Generated per descriptor *shape*: the number of components L, of output components O and the
    correlation order are unrolled into register tiles and uniform branches (``if depth == ...``,
    ``if o == ...``), the output layout is constant; the walk itself (the depth-first order, each
    monomial's depth, last factor and terms) is the int32 table :attr:`SCTables.walk`, read by the
    program, the same for every program (cached, uniform loads). Per depth a tile holds P, and
    the factor x, tangent and adjoints where a pass needs them, beside the output, grad-output and
    x-gradient tiles of a node tile, whatever the number of monomials (494 for a MACE-MP-medium
    layer).

    Why not the whole tree as straight-line code, with the tables as constants: Triton's
    ``TritonGPUCoalesce`` pass is quadratic in the number of memory operations of a kernel (it
    takes the def-use slice of every load and store), and with one load per term the
    MACE-MP-medium forward (930 lines) took minutes of that pass alone to compile, the double
    backward several times longer, and the interpreter was slow on it too. The walk compiles in
    seconds and keeps registers bounded."""
    if kernel == "fwd":
        body = _gen_fwd(t)
    elif kernel == "bwd":
        body = _gen_bwd(t, flags["need_gx"], flags["need_gc"])
    elif kernel == "bwd2":
        body = _gen_bwd2(
            t,
            flags["need_gg"],
            flags["need_gx"],
            flags["need_gc"],
            flags["has_dx"],
            flags["has_dc"],
        )
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
# Launchers: the operators' CUDA kernels (and, in the tests, their CPU kernels under the
# interpreter)
# ---------------------------------------------------------------------------------------------
_TABLES = _codegen.TableCache(SCTables.from_operator)
_KERNELS = _codegen.KernelCache("sc", source)
_WALKS: dict[tuple[int, str], tuple] = {}


def _kernel(desc, meta, kernel: str, device, **flags):
    """(the jitted kernel of this variant, the walk table on ``device``)."""
    tables = _TABLES.get(desc, meta)
    return _KERNELS.get(tables, kernel, **flags), _walk(tables, device)


def _walk(tables, device) -> torch.Tensor:
    """The walk table of ``tables`` on ``device``, copied there once and kept."""
    key = (id(tables), str(device))
    hit = _WALKS.get(key)
    if hit is None or hit[0] is not tables:
        hit = _WALKS[key] = (tables, torch.as_tensor(tables.walk, device=device))
        while len(_WALKS) > 64:
            _WALKS.pop(next(iter(_WALKS)))
    return hit[1]


def prepare(desc, meta) -> None:
    """Do now what the first launch with these descriptor tensors would: parse them on the host
    (on a GPU one device-to-host copy) and copy the walk table to their device. Called outside any
    compiled or captured region (:func:`cfm_plugins.ops._backend.prepare_kernels`): inside a CUDA
    graph's warm-up the copy would be a synchronisation and the kept walk table an allocation of
    the graph's memory pool that no output tracks (torch refuses it: "Detected 2 tensor(s) in the
    cudagraph pool not tracked as outputs")."""
    _walk(_TABLES.get(desc, meta), desc[0].device)


def _check(op: str, x, coeff, elem, order, chunk_ptr, desc, meta) -> None:
    """The checks of the C++ binding layer (sc_ops.h make_args), without the contiguity rule."""
    if len(desc) != 8 or len(meta) != 8:
        raise RuntimeError(
            f"{op}: the descriptor is 8 tensors and 8 ints, got {len(desc)} and {len(meta)}"
        )
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{op}: x must be float32 or float64, got {x.dtype}")
    if coeff.dtype != x.dtype or coeff.device != x.device:
        raise RuntimeError(
            f"{op}: coeff is {coeff.dtype} on {coeff.device}, expected {x.dtype} on {x.device}"
        )
    if x.dim() != 3 or x.shape[1] != meta[6] or x.shape[2] != meta[0]:
        raise RuntimeError(f"{op}: x must be [N, {meta[6]}, {meta[0]}], got {list(x.shape)}")
    if coeff.dim() != 3 or coeff.shape[1] != meta[5] or coeff.shape[2] != meta[7]:
        raise RuntimeError(
            f"{op}: coeff must be [E, {meta[5]}, {meta[7]}], got {list(coeff.shape)}"
        )
    for name, idx in (("elem", elem), ("order", order), ("chunk_ptr", chunk_ptr)):
        if idx.dtype != torch.int64 or idx.device != x.device:
            raise RuntimeError(
                f"{op}: {name} must be int64 on {x.device}, got {idx.dtype} on {idx.device}"
            )
    if elem.numel() != x.shape[0] or order.numel() != x.shape[0] or chunk_ptr.numel() < 1:
        raise RuntimeError(f"{op}: elem and order must have one entry per node")
    for i, d in enumerate(desc):
        if d.device != x.device:
            raise RuntimeError(
                f"{op}: descriptor table {i} is on {d.device} but x is on {x.device} "
                "(move the module with .to())"
            )


def _check_like(op: str, name: str, t: torch.Tensor, ref: torch.Tensor, shape) -> None:
    if t.dtype != ref.dtype or t.device != ref.device or list(t.shape) != list(shape):
        raise RuntimeError(
            f"{op}: {name} must be {ref.dtype} {list(shape)} on {ref.device}, got {t.dtype} "
            f"{list(t.shape)} on {t.device}"
        )


def _grid(cfg: TileConfig, n: int, n_chunks: int, channels: int) -> tuple[tuple, int]:
    """(grid, split) of a launch. GPU-first work decomposition (the C++ CUDA kernel loops over
    128 nodes per thread instead):

    - a program owns a tile of ``BLOCK_N`` nodes of one element by ``BLOCK_C`` channels, so the
      element's folded weights ``coeff[e, row, c]`` are loaded once per tile (one channel vector
      per term, broadcast over the tile's nodes). The module sorts nodes by element and cuts them
      into chunks of at most :data:`CHUNK` nodes of one element (``order``, ``chunk_ptr``); the
      grid is (chunk, tile within the chunk, channel tile), and a chunk longer than
      ``split * BLOCK_N`` nodes is still covered (each program strides over it);
    - forward: the pre-order walk, outputs accumulated per component, stored in mace's layout;
    - backward: the walk with leave events (children before their parent is left) gives
      ``d out / d x``; the weight gradient ``d out / d coeff[e]`` is a sum over the element's
      nodes: each program writes the sum over its tile into its own slot of a partial buffer
      (:class:`_WeightGrad`), and :mod:`._reduce` adds the slots of each element in a fixed order
      (deterministic, no atomics: a run repeats bit for bit);
    - double backward: the walk with the tangent (``T[j] = T[parent] x[last] + P[parent]
      dx[last]``) and the reverse of both, as ``cuda/symmetric_contraction/sc_math.h`` does per
      node."""
    split = max(1, min(math.ceil(CHUNK / cfg.block_rows), math.ceil(n / cfg.block_rows)))
    return (n_chunks, split, math.ceil(channels / cfg.block_c)), split


def _fit(chunk_ptr, meta) -> tuple[int, int]:
    return _codegen.widest_segment(chunk_ptr), int(meta[6])


def _common(x, coeff, elem, order, chunk_ptr, slots, walk):
    """The arguments of ``_ARGS`` up to ``tab_ptr``; ``slots``: the first weight-gradient slot of
    each chunk (any int64 tensor where the kernel writes no partial slots: it is not read)."""
    idx = [t.contiguous() for t in (elem, order, chunk_ptr, slots)]
    return [x, *x.stride(), coeff, *coeff.stride(), *idx, walk]


class _WeightGrad:
    """The weight gradient of one launch: a partial buffer (one slot per program with nodes)
    reduced per element in a fixed order.

    Chunk ``k``'s programs with nodes are its first ``min(ceil(len_k / block_n), split)``; their
    slots follow the previous chunk's (``slots[k]``, computed on the device). The buffer's size
    depends only on the shapes (a traced step's chunk list ends in empty chunks, which take no
    slot): at most ``ceil(n / block_n) + chunks`` slots, and never more than ``chunks * split``.
    The slots of a chunk's programs that have nodes are consecutive, so an empty chunk takes
    none."""

    def __init__(
        self, coeff: torch.Tensor, chunk_ptr: torch.Tensor, n: int, split: int, block_n: int
    ):
        E, R, Cp = coeff.shape
        n_chunks = chunk_ptr.numel() - 1
        tiles = torch.clamp(
            torch.div(
                chunk_ptr[1:] - chunk_ptr[:-1] + (block_n - 1), block_n, rounding_mode="floor"
            ),
            max=split,
        )
        self.slots = torch.cumsum(tiles, 0) - tiles
        size = min(n_chunks * split, -(-n // block_n) + n_chunks)
        self.target = torch.empty(size, R, Cp, dtype=coeff.dtype, device=coeff.device)

    def finish(
        self, coeff, elem, order, chunk_ptr, channels: int, split: int, block_n: int
    ) -> torch.Tensor:
        from cfm_plugins.ops.triton._reduce import element_sum

        return element_sum(
            self.target, self.slots, coeff, elem, order, chunk_ptr, channels, split, block_n
        )


def _walk_launch(kernel: str, flags: dict, ins: tuple, outputs: list, gc: bool | None):
    """Launch the walk kernel ``sc_<kernel>`` of ``flags`` for the operator's inputs ``ins``
    (``x, coeff, elem, order, chunk_ptr, desc, meta``) with the tile :func:`launch` picks. Its
    arguments: those of ``_ARGS``, then ``outputs`` (the kernel's own, up to its weight-gradient
    pointer), then for ``bwd`` and ``bwd2`` (``gc`` not None) the weight gradient's partial buffer
    (:class:`_WeightGrad`, where ``gc``) and its sizes. The weight gradient, reduced per element,
    where ``gc``; else None."""
    x, coeff, elem, order, chunk_ptr, desc, meta = ins
    kern, walk = _kernel(desc, meta, kernel, x.device, **flags)
    n, n_chunks, channels = x.shape[0], chunk_ptr.numel() - 1, meta[6]
    _, R, Cp = coeff.shape
    result = {}

    def run(cfg):
        grid, split = _grid(cfg, n, n_chunks, channels)
        wg = _WeightGrad(coeff, chunk_ptr, n, split, cfg.block_rows) if gc else None
        args = _common(x, coeff, elem, order, chunk_ptr, wg.slots if wg else chunk_ptr, walk)
        args += [channels, split, *outputs]
        if gc is not None:
            args += [wg.target if wg else x.new_empty(0), R, Cp]
        compiled = run_tile(kern, grid, cfg, args, "BLOCK_N")
        if wg is not None:
            result["gc"] = wg.finish(coeff, elem, order, chunk_ptr, channels, split, cfg.block_rows)
        return compiled

    launch(f"sc_{kernel}", x, n, run, fit=_fit(chunk_ptr, meta))
    return result.get("gc")


def fwd(x, coeff, elem, order, chunk_ptr, desc, meta):
    """``cfm::symmetric_contraction_fwd``: out [N, out_dim] in mace's layout."""
    ins = (x, coeff, elem, order, chunk_ptr, desc, meta)
    _check("cfm::symmetric_contraction_fwd", *ins)
    out = torch.empty(x.shape[0], meta[4], dtype=x.dtype, device=x.device)
    if x.shape[0] > 0:
        _walk_launch("fwd", {}, ins, [out], None)  # no weight gradient: no slots
    return out


def bwd(gout, x, coeff, elem, order, chunk_ptr, desc, meta, need_gx, need_gc):
    """``cfm::symmetric_contraction_bwd``: (d/dx, d/dcoeff) of <gout, out>."""
    op = "cfm::symmetric_contraction_bwd"
    ins = (x, coeff, elem, order, chunk_ptr, desc, meta)
    _check(op, *ins)
    _check_like(op, "gout", gout, x, [x.shape[0], meta[4]])
    none = x.new_empty(0)
    if not (need_gx or need_gc):
        return none, none
    gx = x.new_empty(x.shape) if need_gx else none
    if x.shape[0] == 0:
        return (gx, torch.zeros_like(coeff) if need_gc else none)
    flags = dict(need_gx=bool(need_gx), need_gc=bool(need_gc))
    gc = _walk_launch("bwd", flags, ins, [gout, *gout.stride(), gx], bool(need_gc))
    return gx, none if gc is None else gc


def bwd2(
    gout, x, coeff, dx, dcoeff, elem, order, chunk_ptr, desc, meta, need_ggout, need_gx, need_gc
):
    """``cfm::symmetric_contraction_bwd2``: gradients of <dx, gx> + <dcoeff, gc> with respect to
    (gout, x, coeff), where (gx, gc) is ``bwd`` of (gout, x, coeff)."""
    op = "cfm::symmetric_contraction_bwd2"
    ins = (x, coeff, elem, order, chunk_ptr, desc, meta)
    _check(op, *ins)
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
    flags = dict(
        need_gg=bool(need_ggout),
        need_gx=bool(need_gx),
        need_gc=gc_computed,
        has_dx=has_dx,
        has_dc=has_dc,
    )
    dx_args = [dx, *dx.stride()] if has_dx else [none, 0, 0, 0]
    dc_args = [dcoeff, *dcoeff.stride()] if has_dc else [none, 0, 0, 0]
    outputs = [gout, *gout.stride(), *dx_args, *dc_args, gg, gx2]
    gc = _walk_launch("bwd2", flags, ins, outputs, gc_computed)
    if gc is None:
        gc = torch.zeros_like(coeff) if gc_wanted else none
    return gg, gx2, gc


def specimen(t: SCTables, channels: int, dtype_name: str, split: int = 8) -> dict:
    """Argument values of a typical launch (contiguous tensors, ``channels`` channels), for the
    ahead-of-time compile check (:mod:`cfm_plugins.ops.triton.aot`): pointer types and
    sizes/strides."""
    fp = "*fp64" if dtype_name == "float64" else "*fp32"
    cp = -(-channels // 16) * 16
    x = dict(s_xn=channels * t.L, s_xc=t.L, s_xl=1)
    return dict(
        x_ptr=fp,
        **x,
        c_ptr=fp,
        s_ce=t.R * cp,
        s_cr=cp,
        s_cc=1,
        elem_ptr="*i64",
        order_ptr="*i64",
        chunk_ptr="*i64",
        slot_ptr="*i64",
        tab_ptr="*i32",
        C=channels,
        SPLIT=split,
        out_ptr=fp,
        g_ptr=fp,
        s_gn=t.out_dim,
        s_gd=1,
        gx_ptr=fp,
        gc_ptr=fp,
        R=t.R,
        Cp=cp,
        dx_ptr=fp,
        s_dn=x["s_xn"],
        s_dc=x["s_xc"],
        s_dl=1,
        dc_ptr=fp,
        s_de=t.R * cp,
        s_dr=cp,
        s_dcc=1,
        gg_ptr=fp,
    )


def compiled_name(kernel: str, flags: dict) -> str:
    """A readable name of a kernel variant (``bwd[gx,gc]``) for reports."""
    on = [k.replace("need_", "").replace("has_", "") for k, v in sorted(flags.items()) if v]
    return f"sc_{kernel}" + (f"[{','.join(on)}]" if on else "")
