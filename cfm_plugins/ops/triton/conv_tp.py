"""Triton kernels of ``cfm::conv_tp_{fwd,bwd}``, generated from the descriptor.

The descriptor (:mod:`cfm_plugins.ops.descriptors.conv_tp`) lists paths (channels, weight offset),
pairs (input row, output row) and CG entries per pair. Per edge ``R[q] = sum coef * y[j]`` over the
entries of pair ``q``; then ``out[k, c] += R[q] * x[i, c] * w[p, c]``. Here the tables are code:
CG entries are float literals (exact in float64), row offsets constants. Two kernels:

- ``segment`` (forward; node-feature gradient with the transposed tables, :func:`_gen_segment`):
  a segmented, atomic-free, deterministic sum over each node's edges, no per-edge message;
- ``edge`` (edge-attribute and weight gradients, :func:`_gen_edge`): per block of edges, no atomics.

Outputs the kernels store whole are not zero-filled (:func:`_output`). Double backward needs no
kernel of its own: the form is trilinear and the operators' C++ autograd writes every derivative
with these two operators again.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from cfm_plugins.ops._debug import UNFILLED_ENV, unfilled
from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton._codegen import Writer, fmt_float, tl_sum
from cfm_plugins.ops.triton.configs import launch, run_tile

__all__ = ["TPTables", "fwd", "bwd", "source", "kernel_variants", "UNFILLED_ENV"]


@dataclass(frozen=True)
class TPTables:
    """The descriptor as the generator reads it (host copies of one ``desc`` and its ``meta``)."""

    dim_in: int
    dim_out: int
    path_mul: tuple
    path_woff: tuple
    path_pairs: tuple  # per path: tuple of (pair_in, pair_out, ((ent_j, coef), ...))

    @classmethod
    def from_operator(cls, desc, meta) -> TPTables:
        """From the operator's ``desc`` ([ints (int32), coef (float64)]) and ``meta``
        ([dim_in, dim_out, n_paths, n_pairs, max_mul])."""
        if len(desc) != 2 or len(meta) != 5:
            raise ValueError(
                f"cfm::conv_tp: the descriptor is 2 tensors and 5 ints, got {len(desc)} and "
                f"{len(meta)}"
            )
        ints = desc[0].detach().cpu().numpy().astype(np.int64)
        coef = desc[1].detach().cpu().numpy().astype(np.float64)
        P, Q = int(meta[2]), int(meta[3])
        if ints.size != 3 * P + 1 + 3 * Q + 1 + coef.size:
            raise ValueError("cfm::conv_tp: inconsistent descriptor sizes")
        mul, woff, pstart = ints[:P], ints[P : 2 * P], ints[2 * P : 3 * P + 1]
        o = 3 * P + 1
        pin, pout, estart = (
            ints[o : o + Q],
            ints[o + Q : o + 2 * Q],
            ints[o + 2 * Q : o + 3 * Q + 1],
        )
        ent_j = ints[o + 3 * Q + 1 :]
        return cls._build(
            int(meta[0]), int(meta[1]), mul, woff, pstart, pin, pout, estart, ent_j, coef
        )

    @classmethod
    def from_descriptor(cls, d) -> TPTables:
        """From a :class:`~cfm_plugins.ops.descriptors.conv_tp.ConvTPDescriptor` (or its
        transpose)."""
        return cls._build(
            d.dim_in,
            d.dim_out,
            d.path_mul,
            d.path_woff,
            d.path_pair_start,
            d.pair_in,
            d.pair_out,
            d.pair_ent_start,
            d.ent_j,
            d.ent_coef,
        )

    @classmethod
    def _build(cls, dim_in, dim_out, mul, woff, pstart, pin, pout, estart, ent_j, coef) -> TPTables:
        paths = []
        for p in range(len(mul)):
            pairs = []
            for q in range(int(pstart[p]), int(pstart[p + 1])):
                ents = tuple(
                    (int(ent_j[t]), float(coef[t]))
                    for t in range(int(estart[q]), int(estart[q + 1]))
                )
                pairs.append((int(pin[q]), int(pout[q]), ents))
            paths.append(tuple(pairs))
        return cls(
            int(dim_in),
            int(dim_out),
            tuple(int(m) for m in mul),
            tuple(int(w) for w in woff),
            tuple(paths),
        )

    @property
    def max_mul(self) -> int:
        return max(self.path_mul, default=1)

    def edge_components(self) -> list[int]:
        """Edge-attribute components any entry reads."""
        return sorted({j for pairs in self.path_pairs for _, _, ents in pairs for j, _ in ents})

    @functools.cached_property
    def out_row_mul(self) -> dict[int, int]:
        """Each output row the pairs write (its first column), with the channels the segment
        kernel stores there."""
        return {k: self.path_mul[p] for p, pairs in enumerate(self.path_pairs) for _, k, _ in pairs}

    @functools.cached_property
    def out_width(self) -> int | None:
        """``n`` where the segment kernel stores exactly the output columns ``0..n-1`` for every
        node, edges or none; None where it leaves gaps."""
        return _width(k + c for k, mul in self.out_row_mul.items() for c in range(mul))

    @functools.cached_property
    def w_width(self) -> int | None:
        """``n`` where the edge kernel stores exactly the weight-gradient columns ``0..n-1`` for
        every edge (each path with pairs); None where it leaves gaps."""
        return _width(
            self.path_woff[p] + c
            for p, pairs in enumerate(self.path_pairs)
            if pairs
            for c in range(self.path_mul[p])
        )

    @functools.cached_property
    def y_width(self) -> int | None:
        """``n`` where the edge kernel stores exactly the edge-attribute gradient columns ``0..n-1``
        (the components the entries read); None where it leaves gaps."""
        return _width(self.edge_components())


def _width(columns) -> int | None:
    """``n`` where ``columns`` (ints >= 0, repeats allowed) are exactly ``0..n-1``, else None."""
    seen = set(columns)
    return len(seen) if seen == set(range(len(seen))) else None


# ---------------------------------------------------------------------------------------------
# Source generation
# ---------------------------------------------------------------------------------------------
def _pair_coef(ents, y: str = "y") -> str:
    """``R[q]`` of one pair: its CG entries as literals times the edge attributes."""
    return " + ".join(f"{fmt_float(c)} * {y}{j}" for j, c in ents)


def _mask_names(w: Writer, t: TPTables, rows: str) -> dict[int, str]:
    """One channel mask per distinct path multiplicity, and its 2D form with the row mask."""
    names = {}
    for mul in sorted(set(t.path_mul)):
        w(f"cm{mul} = cols < {mul}")
        w(f"m{mul} = {rows}[:, None] & cm{mul}[None, :]")
        names[mul] = f"m{mul}"
    return names


def _gen_segment(t: TPTables, name: str = "tp_segment", weights=None) -> str:
    """out[n, k, c] = sum over the node's edges of sum_q R_q x[other, i_q, c] w[p, c].

    One program per node and channel tile, looping over the node's edges ``BLOCK_E`` at a time
    through the CSR grouping (edges sorted by receiver for the forward, by sender for the
    gradient). Per block of edges the edge attributes, each path's weights and each input row are
    loaded once (``[BLOCK_E, BLOCK_C]`` gathers of the other end's rows), and every output row adds
    its pairs' products to a ``[BLOCK_E, BLOCK_C]`` tile of per-lane partial sums; each row sums
    over its edges once, after the loop, and is stored once: a segmented, atomic-free scatter,
    deterministic, with no per-edge message in memory. Per-edge weights are read once. A node
    without edges stores zeros.

    ``other_ptr`` holds the other end of each edge already in CSR order (the launcher gathers it
    once, ``other[perm]``), so a block's node rows wait on one index load, not two in a row.

    Compile time: for a MACE-MP-medium layer (0e+1o x spherical harmonics l<=3, 40 output rows,
    ~100 pairs) this kernel is ~250 lines; Triton's coalescing pass costs grow with the square of
    a kernel's memory operations, which is why the loads are per row and per path (not per pair).

    ``weights`` (default :class:`_StoredWeights`: rows of ``w``) says where each path's weights
    ``w{p}`` come from (:mod:`.conv_tp_radial` computes them from the radial MLP's last layer)."""
    weights = weights or _StoredWeights()
    w = Writer()
    w("@triton.jit")
    w(
        f"def {name}(ptr_ptr, perm_ptr, other_ptr, x_ptr, s_xn, s_xd, y_ptr, s_ye, s_yd, "
        f"{weights.args}, out_ptr, BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr"
        f"{weights.constexprs}):"
    )
    w.indent()
    weights.setup(w)
    w("n = tl.program_id(0).to(tl.int64)  # n * dim_out passes 2**31 from 2**31 / dim_out nodes")
    w("cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)")
    w("lo = tl.load(ptr_ptr + n)")
    w("hi = tl.load(ptr_ptr + n + 1)")
    outs = sorted({k for pairs in t.path_pairs for _, k, _ in pairs})
    for k in outs:
        w(f"acc{k} = tl.full([BLOCK_E, BLOCK_C], 0, out_ptr.dtype.element_ty)")
    w("for k0 in range(lo, hi, BLOCK_E):")
    w.indent()
    w("ks = k0 + tl.arange(0, BLOCK_E)")
    w("em = ks < hi")
    w("e = tl.load(perm_ptr + ks, mask=em, other=0)")
    w("src = tl.load(other_ptr + ks, mask=em, other=0)")
    for j in t.edge_components():
        w(f"y{j} = tl.load(y_ptr + e * s_ye + {j} * s_yd, mask=em, other=0.0)")
    masks = _mask_names(w, t, "em")
    w("xrow = x_ptr + src[:, None] * s_xn")
    weights.block(w)
    loaded_x = set()
    for p, pairs in enumerate(t.path_pairs):
        if not pairs:
            continue
        mask = masks[t.path_mul[p]]
        weights.path(w, p, t.path_woff[p], t.path_mul[p], mask)
        terms: dict[int, list[str]] = {}
        for q, (i, k, ents) in enumerate(pairs):
            if i not in loaded_x:
                w(f"x{i} = tl.load(xrow + ({i} + cols[None, :]) * s_xd, mask={mask}, other=0.0)")
                loaded_x.add(i)
            w(f"r{p}_{q} = ({_pair_coef(ents)})[:, None]")
            terms.setdefault(k, []).append(f"r{p}_{q} * x{i} * w{p}")
        # the path's output rows take their products here, so that its weights and CG factors die
        # before the next path's load (all paths' live at once spilled in float64)
        for k, parts in terms.items():
            w(f"acc{k} += {' + '.join(parts)}")
    w.dedent()
    w("orow = out_ptr + n * " + str(t.dim_out))
    for k in outs:  # TPTables.out_width reads these stores: the launchers leave the output unfilled
        w(f"tl.store(orow + {k} + cols, {tl_sum(f'acc{k}', 0)}, mask=cols < {t.out_row_mul[k]})")
    return w.text()


class _StoredWeights:
    """The segment kernel's per-edge weights read from ``w`` (:func:`_gen_segment`'s hooks: the
    weight arguments, further constexprs, lines at the start, per block of edges, per path)."""

    args = "w_ptr, s_we, s_wd"
    constexprs = ""

    def setup(self, w: Writer) -> None:
        pass

    def block(self, w: Writer) -> None:
        w("wrow = w_ptr + e[:, None] * s_we")

    def path(self, w: Writer, p: int, woff: int, mul: int, mask: str) -> None:
        w(f"w{p} = tl.load(wrow + ({woff} + cols[None, :]) * s_wd, mask={mask}, other=0.0)")


def _gen_edge(t: TPTables, need_y: bool, need_w: bool, name: str = "tp_edge") -> str:
    """Per edge: gw[p, c] = sum_q R_q x[i_q, c] g[k_q, c]; gy[j] = sum_entries coef * sum_c x g w.

    One program per ``BLOCK_E`` edges, looping over channel tiles at run time (not unrolled: a
    kernel's compile time grows with the square of its memory operations); the weight gradient of
    each (edge, path, channel) is written once, the edge-attribute gradient is a sum over channels
    inside the program. No atomics."""
    w = Writer()
    # E, the edge count, changes with every batch: specialised (divisible by 16 or not, equal to 1),
    # each edge kernel would compile again for every class of it a run meets. It only bounds the
    # mask of the last block, where the hint buys nothing.
    w('@triton.jit(do_not_specialize=["E"])')
    w(
        f"def {name}(sender_ptr, receiver_ptr, x_ptr, s_xn, s_xd, g_ptr, s_gn, s_gd, y_ptr, s_ye, "
        "s_yd, w_ptr, s_we, s_wd, gy_ptr, s_gye, gw_ptr, s_gwe, E, BLOCK_E: tl.constexpr, "
        "BLOCK_C: tl.constexpr):"
    )
    w.indent()
    # 64-bit rows: eid * s_we passes 2**31 from 2**31 / weights-per-edge edges (1.68M for 128
    # channels of 0e+1o with l<=3: 1280 weights an edge); in 32 bits it wraps
    w("eid = tl.program_id(0).to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)")
    w("em = eid < E")
    w("snd = tl.load(sender_ptr + eid, mask=em, other=0)")
    w("rcv = tl.load(receiver_ptr + eid, mask=em, other=0)")
    w("xrow = x_ptr + snd[:, None] * s_xn")
    w("grow = g_ptr + rcv[:, None] * s_gn")
    w("wrow = w_ptr + eid[:, None] * s_we")
    gy_seen: set[int] = set()
    if need_y:  # edge-attribute gradients: sums over every channel tile
        for j in t.edge_components():
            w(f"gy{j} = tl.full([BLOCK_E], 0, gy_ptr.dtype.element_ty)")
    w(
        f"for c0 in range(0, {t.max_mul}, BLOCK_C):  # a runtime loop: one copy of the body to "
        "compile"
    )
    w.indent()
    w("cols = c0 + tl.arange(0, BLOCK_C)")
    if need_w:
        # loaded per channel tile on purpose: loads after the gw stores of the previous tile cannot
        # be hoisted out of the loop, so neither can the ~100 R_q built from them (hoisted, they
        # spilled)
        for j in t.edge_components():
            w(f"y{j} = tl.load(y_ptr + eid * s_ye + {j} * s_yd, mask=em, other=0.0)")
    masks = _mask_names(w, t, "em")
    loaded = set()
    for p, pairs in enumerate(t.path_pairs):
        if not pairs:
            continue
        mask = masks[t.path_mul[p]]
        if need_y:
            w(
                f"w{p} = tl.load(wrow + ({t.path_woff[p]} + cols[None, :]) * s_wd, mask={mask}, "
                "other=0.0)"
            )
        gw_terms = []
        for q, (i, k, ents) in enumerate(pairs):
            if ("x", i) not in loaded:
                w(f"x{i} = tl.load(xrow + ({i} + cols[None, :]) * s_xd, mask={mask}, other=0.0)")
                loaded.add(("x", i))
            if ("g", k) not in loaded:
                w(f"g{k} = tl.load(grow + ({k} + cols[None, :]) * s_gd, mask={mask}, other=0.0)")
                loaded.add(("g", k))
            if need_w:  # R_q per channel tile: a few flops, no registers held across the loop
                w(f"r{p}_{q} = ({_pair_coef(ents)})[:, None]")
                gw_terms.append(f"r{p}_{q} * x{i} * g{k}")
            if need_y:  # added at once: no per-pair sum stays live to the end of the tile
                w(f"d{p}_{q} = {tl_sum(f'x{i} * g{k} * w{p}', 1)}")
                for j, c in ents:
                    w(f"gy{j} += {fmt_float(c)} * d{p}_{q}")
                    gy_seen.add(j)
        if need_w:
            w(
                f"tl.store(gw_ptr + eid[:, None] * s_gwe + {t.path_woff[p]} + cols[None, :], "
                f"{' + '.join(gw_terms)}, mask={mask})"
            )
    w.dedent()
    for j in sorted(gy_seen):
        w(f"tl.store(gy_ptr + eid * s_gye + {j}, gy{j}, mask=em)")
    return w.text()


_HEADER = (
    '"""Generated by cfm_plugins.ops.triton.conv_tp from a descriptor: do not edit."""\n'
    "import triton\nimport triton.language as tl\n\n\n"
)


def function_name(kernel: str, transposed: bool = False, **flags) -> str:
    """The generated function's name, which GPU profiles show: ``tp_segment`` (receiver sums, the
    forward), ``tp_segment_t`` (sender sums with the transposed tables, the node-feature gradient),
    ``tp_edge_wy``, ``tp_edge_w``, ``tp_edge_y`` (the weight and edge-attribute gradients asked)."""
    if kernel == "segment":
        return "tp_segment_t" if transposed else "tp_segment"
    return "tp_edge_" + "w" * bool(flags.get("need_w")) + "y" * bool(flags.get("need_y"))


def source(t: TPTables, kernel: str, transposed: bool = False, **flags) -> str:
    """The module source of one kernel: ``segment`` (any tables, plain or ``transposed``: only the
    name differs; :func:`_gen_segment`) or ``edge`` (need_y, need_w; plain tables;
    :func:`_gen_edge`). The function is named by :func:`function_name`."""
    name = function_name(kernel, transposed, **flags)
    if kernel == "segment":
        body = _gen_segment(t, name)
    elif kernel == "edge":
        body = _gen_edge(t, flags["need_y"], flags["need_w"], name)
    else:
        raise ValueError(f"unknown conv TP kernel {kernel!r}")
    return _HEADER + body


def kernel_variants() -> list[tuple[str, bool, dict]]:
    """(kernel, transposed tables, flags) of what a MACE run launches: the ahead-of-time check
    compiles these."""
    return [
        ("segment", False, {}),
        ("segment", True, {}),
        ("edge", False, dict(need_y=True, need_w=True)),
        ("edge", False, dict(need_y=False, need_w=True)),
        ("edge", False, dict(need_y=True, need_w=False)),
    ]


# ---------------------------------------------------------------------------------------------
# Launchers: the operators' CUDA kernels (and, in the tests, their CPU kernels under the
# interpreter)
# ---------------------------------------------------------------------------------------------
_TABLES = _codegen.TableCache(TPTables.from_operator)
_SENDER, _RECEIVER, _RPERM, _RPTR, _SPERM, _SPTR = range(6)


_KERNELS = _codegen.KernelCache("tp", source, function_name)


def prepare(desc, desc_t, meta) -> None:
    """Parse the descriptor tensors (and their transposed tables) on the host now, outside any
    compiled or captured region: on a GPU the first parse is a device-to-host copy, which a
    captured step must not make (see :func:`.symmetric_contraction.prepare`)."""
    _TABLES.get(desc, meta)
    _TABLES.get(desc_t, _meta_t(meta))


def _meta_t(meta) -> list:
    """The ``meta`` of the transposed tables: input and output widths swapped."""
    return [meta[1], meta[0], meta[2], meta[3], meta[4]]


def _check(op: str, x, y, w, graph, desc, meta, w_name: str = "w") -> list:
    """The checks of the C++ binding layer (conv_tp_ops.h), without the contiguity rule; the
    graph index tensors, contiguous. ``w_name``: what messages call ``w`` (the per-edge rows)."""
    if len(desc) != 2 or len(meta) != 5:
        raise RuntimeError(
            f"{op}: the descriptor is 2 tensors and 5 ints, got {len(desc)} and {len(meta)}"
        )
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{op}: x must be float32 or float64, got {x.dtype}")
    for name, t in (("y", y), (w_name, w)):
        if t.dtype != x.dtype or t.device != x.device:
            raise RuntimeError(
                f"{op}: {name} is {t.dtype} on {t.device}, expected {x.dtype} on {x.device}"
            )
    if x.dim() != 2 or x.shape[1] != meta[0]:
        raise RuntimeError(f"{op}: x must be [N, {meta[0]}], got {list(x.shape)}")
    if y.dim() != 2 or w.dim() != 2 or y.shape[0] != w.shape[0]:
        raise RuntimeError(
            f"{op}: y and {w_name} must be [E, *] alike, got {list(y.shape)} and {list(w.shape)}"
        )
    if len(graph) != 6:
        raise RuntimeError(f"{op}: graph is [sender, receiver, rperm, rptr, sperm, sptr]")
    for t in graph:
        if t.dtype != torch.int64 or t.device != x.device:
            raise RuntimeError(
                f"{op}: graph indices must be int64 on {x.device}, got {t.dtype} on {t.device}"
            )
    if graph[_SENDER].numel() != y.shape[0] or graph[_RECEIVER].numel() != y.shape[0]:
        raise RuntimeError(f"{op}: one sender and receiver per edge expected")
    if graph[_RPTR].numel() < 1 or graph[_SPTR].numel() != graph[_RPTR].numel():
        raise RuntimeError(f"{op}: bad CSR pointers")
    for i, d in enumerate(desc):
        if d.device != x.device:
            raise RuntimeError(
                f"{op}: descriptor table {i} is on {d.device} but the inputs are on {x.device} "
                "(move the module with .to())"
            )
    return [t.contiguous() for t in graph]


def _check_grad(op: str, g, x, graph, meta) -> None:
    """The output gradient ``g``: like ``x``, one row per node, ``dim_out`` columns."""
    if (
        g.dtype != x.dtype
        or g.device != x.device
        or g.dim() != 2
        or g.shape[0] != graph[_RPTR].numel() - 1
        or g.shape[1] != meta[1]
    ):
        raise RuntimeError(
            f"{op}: g must be {x.dtype} [N, {meta[1]}] on {x.device}, got {g.dtype} "
            f"{list(g.shape)} on {g.device}"
        )


def _segment(t: TPTables, node_in, y, w, ptr, perm, other, out, transposed: bool = False) -> None:
    """out[n] = sum over the edges ptr[n]:ptr[n+1] (in perm) of the tables' products."""
    n = out.shape[0]
    if n == 0 or y.shape[0] == 0:
        return
    kern = _KERNELS.get(t, "segment", transposed=transposed)
    args = [ptr, perm, other.index_select(0, perm), node_in, *node_in.stride()]
    args += [y, *y.stride(), w, *w.stride(), out]  # the other ends in CSR order, gathered once

    def run(cfg):
        grid = (n, math.ceil(t.max_mul / cfg.block_c))
        return run_tile(kern, grid, cfg, args, "BLOCK_E")

    launch("tp_segment", node_in, y.shape[0], run, fit=(_codegen.widest_segment(ptr), t.max_mul))


def _uninitialised(shape, like: torch.Tensor) -> torch.Tensor:
    """Memory the kernels overwrite whole (the tests fill it with NaN to prove they do)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _output(shape, like: torch.Tensor, width: int | None) -> torch.Tensor:
    """An output tensor ``[rows, shape[-1]]``: left uninitialised where the kernel launched
    stores the columns ``0..width-1`` of every row and that is all of them, else zeros (``width``
    None: no launch, a graph without edges; gaps: input rows no path reads, edge attributes no
    entry reads, weights of paths without pairs). A fill skipped is one pass less over the
    tensor: the weight gradient is [edges, weights] (for a MACE-MP-medium layer at 4000 atoms,
    hundreds of MB in float64). MACE's tables cover every column (``TPTables.out_width`` and
    friends say what they store). The debug switch ``CFM_PLUGINS_TRITON_UNFILLED=0`` (read once,
    :mod:`cfm_plugins.ops._debug`) zero-fills every output."""
    if width == shape[-1] and unfilled():
        return _uninitialised(shape, like)
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def fwd(x, y, w, graph, desc, desc_t, meta):
    """``cfm::conv_tp_fwd``: receiver sums [N, dim_out] of the channelwise product."""
    graph = _check("cfm::conv_tp_fwd", x, y, w, graph, desc, meta)
    t = _TABLES.get(desc, meta) if y.shape[0] > 0 else None
    out = _output((graph[_RPTR].numel() - 1, meta[1]), x, t and t.out_width)
    if t is not None:
        _segment(t, x, y, w, graph[_RPTR], graph[_RPERM], graph[_SENDER], out)
    return out


def bwd(g, x, y, w, graph, desc, desc_t, meta, need_x, need_y, need_w):
    """``cfm::conv_tp_bwd``: (d/dx, d/dy, d/dw) of <g, fwd(x, y, w)>; empty tensors for what is
    not requested."""
    op = "cfm::conv_tp_bwd"
    graph = _check(op, x, y, w, graph, desc, meta)
    _check_grad(op, g, x, graph, meta)
    none = x.new_empty(0)
    E = y.shape[0]
    # the tables of each kernel to launch: None where it is not launched
    t_t = _TABLES.get(desc_t, _meta_t(meta)) if E > 0 and need_x else None
    t = _TABLES.get(desc, meta) if E > 0 and (need_y or need_w) else None
    gx = _output((graph[_SPTR].numel() - 1, meta[0]), x, t_t and t_t.out_width) if need_x else none
    gy = _output(tuple(y.shape), x, t and t.y_width) if need_y else none
    gw = _output(tuple(w.shape), x, t and t.w_width) if need_w else none
    if t_t is not None:
        _segment(t_t, g, y, w, graph[_SPTR], graph[_SPERM], graph[_RECEIVER], gx, transposed=True)
    if t is not None:
        kern = _KERNELS.get(t, "edge", need_y=bool(need_y), need_w=bool(need_w))
        args = [graph[_SENDER], graph[_RECEIVER], x, *x.stride(), g, *g.stride(), y, *y.stride()]
        args += [w, *w.stride(), gy, gy.stride(0) if need_y else 0, gw]
        args += [gw.stride(0) if need_w else 0, E]

        def run(cfg):
            return run_tile(kern, (math.ceil(E / cfg.block_rows),), cfg, args, "BLOCK_E")

        launch("tp_edge", x, E, run, fit=(E, t.max_mul))
    return gx, gy, gw


def specimen(t: TPTables, dtype_name: str, edges: int = 312_000) -> dict:
    """Argument values of a typical launch (contiguous tensors), for the ahead-of-time compile
    check (:mod:`cfm_plugins.ops.triton.aot`): pointer types and sizes/strides."""
    fp = "*fp64" if dtype_name == "float64" else "*fp32"
    dim_edge = max(t.edge_components(), default=0) + 1
    weights = max((wo + m for wo, m in zip(t.path_woff, t.path_mul)), default=0)
    return dict(
        ptr_ptr="*i64",
        perm_ptr="*i64",
        other_ptr="*i64",
        sender_ptr="*i64",
        receiver_ptr="*i64",
        x_ptr=fp,
        s_xn=t.dim_in,
        s_xd=1,
        y_ptr=fp,
        s_ye=dim_edge,
        s_yd=1,
        w_ptr=fp,
        s_we=weights,
        s_wd=1,
        out_ptr=fp,
        g_ptr=fp,
        s_gn=t.dim_out,
        s_gd=1,
        gy_ptr=fp,
        s_gye=dim_edge,
        gw_ptr=fp,
        s_gwe=weights,
        E=edges,
    )


def compiled_name(kernel: str, transposed: bool, flags: dict) -> str:
    """A readable name of a kernel variant (``tp_segment[T]``, ``tp_edge[y,w]``) for reports."""
    on = [k.replace("need_", "") for k, v in sorted(flags.items()) if v]
    tag = ",".join((["T"] if transposed else []) + on)
    return f"tp_{kernel}" + (f"[{tag}]" if tag else "")
