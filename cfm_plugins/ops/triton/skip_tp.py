"""Triton kernels of ``cfm::skip_tp_{fwd,bwd}``: the skip connection as one GEMM tile per group of
nodes of one element.

The descriptor's tables (:mod:`cfm_plugins.ops.descriptors.skip_tp`: the destination's irrep
blocks and the paths into them, int32, and the paths' coefficients, float64) are read by the
kernels at run time: not generated, the same two kernels serve every model.

- ``skip_apply`` (forward; node-feature gradient with the transposed tables, :func:`_apply`):
  ``tl.dot`` tiles of at most ``TILE_NODES`` nodes of one element; every output element is
  written by one program, and the grid depends on the shapes only (capturable, no wait).
- ``skip_wgrad`` (weight gradient, :func:`bwd`): sums per element in a fixed order, no atomics.

Double backward needs no kernel of its own: the map is bilinear, and the operators' C++ autograd
writes every derivative with these two operators again. The fused module runs these kernels only
where the ``skip_tp`` kernel was named (``fused_kernels``; :mod:`cfm_plugins.ops.skip_tp`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
import triton
import triton.language as tl

from cfm_plugins.ops.triton import _codegen
from cfm_plugins.ops.triton._codegen import interpreting
from cfm_plugins.ops.triton.configs import TileConfig, launch, pick, run_tile

__all__ = ["SkipTables", "fwd", "bwd", "prepare", "specimen", "TILE_NODES", "KERNELS"]

#: nodes per tile of ``skip_apply``: the tile slots are ``nodes // TILE_NODES + elements``
TILE_NODES = 32
#: the kernels (names in profiles, configs and the ahead-of-time check)
KERNELS = ("skip_apply", "skip_wgrad")


class SkipTables:
    """The host copy of one orientation's tables (the operator's ``desc`` and ``meta``), with the
    job tables of a launch kept per tile width and device."""

    def __init__(self, desc, meta, transposed: bool):
        if len(desc) != 2 or len(meta) != 7:
            raise ValueError(
                f"cfm::skip_tp: the descriptor is 2 tensors and 7 ints, got {len(desc)} and "
                f"{len(meta)}"
            )
        ints = desc[0].detach().cpu().numpy().astype(np.int64)
        self.n_paths = int(meta[4])
        self.n_blocks = int(meta[6] if transposed else meta[5])
        self.dim_src = int(meta[1] if transposed else meta[0])
        self.dim_dst = int(meta[0] if transposed else meta[1])
        self.num_elements = int(meta[2])
        self.weight_numel = int(meta[3])
        nb, npth = self.n_blocks, self.n_paths
        if ints.size != 4 * nb + 1 + 6 * npth or desc[1].numel() != npth:
            raise ValueError("cfm::skip_tp: inconsistent descriptor sizes")
        self.blocks = ints[: 3 * nb].reshape(nb, 3)
        self.path_ptr = ints[3 * nb : 4 * nb + 1]
        self.paths = ints[4 * nb + 1 :].reshape(npth, 6)
        self._jobs: dict = {}

    @property
    def max_mul(self) -> int:
        return int(self.blocks[:, 1].max(initial=1))

    def apply_jobs(self, block_w: int, device) -> torch.Tensor:
        """``[jobs, 2]`` int32 (destination block, first channel): the second grid axis of
        ``skip_apply``."""
        key = ("apply", block_w, str(device))
        if key not in self._jobs:
            rows = [
                (b, w0)
                for b in range(self.n_blocks)
                for w0 in range(0, int(self.blocks[b, 1]), block_w)
            ]
            self._jobs[key] = _int32(rows, 2, device)
        return self._jobs[key]

    def wgrad_jobs(self, block_u: int, block_w: int, device) -> torch.Tensor:
        """``[jobs, 6]`` int32 (path, first u, first w, destination offset, its multiplicity,
        components): the second grid axis of ``skip_wgrad``."""
        key = ("wgrad", block_u, block_w, str(device))
        if key not in self._jobs:
            rows = []
            for b in range(self.n_blocks):
                off, mul, dim = (int(v) for v in self.blocks[b])
                for p in range(int(self.path_ptr[b]), int(self.path_ptr[b + 1])):
                    K = int(self.paths[p, 1])
                    rows += [
                        (p, u0, w0, off, mul, dim)
                        for u0 in range(0, K, block_u)
                        for w0 in range(0, mul, block_w)
                    ]
            self._jobs[key] = _int32(rows, 6, device)
        return self._jobs[key]


def _int32(rows, width: int, device) -> torch.Tensor:
    a = np.asarray(rows, dtype=np.int32).reshape(-1, width)
    return torch.from_numpy(a).to(device)


_TABLES = _codegen.TableCache(lambda desc, meta: SkipTables(desc, meta, False))
_TABLES_T = _codegen.TableCache(lambda desc, meta: SkipTables(desc, meta, True))


def prepare(desc, desc_t, meta) -> None:
    """Parse both orientations' tables on the host and keep the job tables of the tiles a launch
    in either dtype picks on their device, now, outside any compiled or captured region (on a GPU
    the first parse is a device-to-host copy, and a table made inside a CUDA graph's warm-up would
    live in its memory pool)."""
    device = desc[0].device
    t = _TABLES.get(desc, meta)
    for dtype_name in ("float32", "float64"):
        for tables in (t, _TABLES_T.get(desc_t, meta)):
            tile = _dot_tile(pick("skip_apply", dtype_name, 0, fit=_apply_fit(tables)))
            tables.apply_jobs(tile.block_c, device)
        tile = _dot_tile(pick("skip_wgrad", dtype_name, 0, fit=_wgrad_fit(t)))
        t.wgrad_jobs(tile.block_rows, tile.block_c, device)


def _dot_tile(cfg: TileConfig) -> TileConfig:
    """``cfg`` with rows and channels of at least 16: ``tl.dot``'s smallest tile."""
    return replace(cfg, block_rows=max(16, cfg.block_rows), block_c=max(16, cfg.block_c))


def _apply_fit(t: SkipTables) -> tuple[int, int]:
    """Rows and channels of a ``skip_apply`` tile at most (the interpreter's tile shrinks to
    them)."""
    return TILE_NODES * int(t.blocks[:, 2].max(initial=1)), t.max_mul


def _wgrad_fit(t: SkipTables) -> tuple[int, int]:
    return int(t.paths[:, 1].max(initial=1)), t.max_mul


# ---------------------------------------------------------------------------------------------
# The kernels
# ---------------------------------------------------------------------------------------------
def _skip_apply(
    order_ptr,
    elem_ptr,
    src_ptr,
    w_ptr,
    dst_ptr,
    job_ptr,
    blk_ptr,
    pptr_ptr,
    path_ptr,
    coef_ptr,
    E,
    dim_src,
    dim_dst,
    TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    IEEE: tl.constexpr,
    DOT: tl.constexpr,
):
    t = tl.program_id(0)
    j = tl.program_id(1)
    b = tl.load(job_ptr + 2 * j)
    w0 = tl.load(job_ptr + 2 * j + 1)
    dst_off = tl.load(blk_ptr + 3 * b)
    Nd = tl.load(blk_ptr + 3 * b + 1)
    D = tl.load(blk_ptr + 3 * b + 2)
    p0 = tl.load(pptr_ptr + b)
    p1 = tl.load(pptr_ptr + b + 1)
    # this tile slot's element and nodes: the elements' tiles in order, TILE nodes each
    ee = tl.arange(0, BLOCK_E)
    em = ee < E
    lo = tl.load(elem_ptr + ee, mask=em, other=0)
    hi = tl.load(elem_ptr + ee + 1, mask=em, other=0)
    nt = (hi - lo + TILE - 1) // TILE
    last = tl.associative_scan(nt, 0, tl.standard._sum_combine)  # tiles up to each element
    first = last - nt
    sel = em & (first <= t) & (t < last)
    e = tl.reduce(tl.where(sel, ee, 0), 0, tl.standard._sum_combine)
    s0 = tl.reduce(tl.where(sel, lo + (t - first) * TILE, 0), 0, tl.standard._sum_combine)
    end = tl.reduce(tl.where(sel, hi, 0), 0, tl.standard._sum_combine)
    s1 = tl.minimum(s0 + TILE, end)  # no element selected: s0 = s1 = 0, no rows
    rows = (s1 - s0) * D
    wv = w0 + tl.arange(0, BLOCK_W)
    wm = wv < Nd
    for r0 in range(0, rows, BLOCK_M):
        r = r0 + tl.arange(0, BLOCK_M)
        rm = r < rows
        k = r // D
        m = r - k * D
        node = tl.load(order_ptr + s0 + k, mask=rm, other=0)
        acc = tl.full([BLOCK_M, BLOCK_W], 0, dst_ptr.dtype.element_ty)
        for p in range(p0, p1):
            src_off = tl.load(path_ptr + 6 * p)
            K = tl.load(path_ptr + 6 * p + 1)
            woff = tl.load(path_ptr + 6 * p + 2).to(tl.int64)
            ks = tl.load(path_ptr + 6 * p + 3)
            ns = tl.load(path_ptr + 6 * p + 4)
            es = tl.load(path_ptr + 6 * p + 5)
            c = tl.load(coef_ptr + p).to(dst_ptr.dtype.element_ty)
            wbase = w_ptr + woff + e.to(tl.int64) * es
            srow = src_ptr + node * dim_src + src_off + m
            if DOT:
                for k0 in range(0, K, BLOCK_K):
                    kk = k0 + tl.arange(0, BLOCK_K)
                    km = kk < K
                    a = tl.load(
                        srow[:, None] + kk[None, :] * D, mask=rm[:, None] & km[None, :], other=0.0
                    )
                    bw = tl.load(
                        wbase + kk[:, None] * ks + wv[None, :].to(tl.int64) * ns,
                        mask=km[:, None] & wm[None, :],
                        other=0.0,
                    )
                    if IEEE:
                        acc = tl.dot(a * c, bw, acc, input_precision="ieee")
                    else:
                        acc = tl.dot(a * c, bw, acc, out_dtype=tl.float64)
            else:  # rank-1 updates (float64 on AMD, whose tl.dot lowering fails)
                for kk in range(0, K):
                    a = tl.load(srow + kk * D, mask=rm, other=0.0)
                    bw = tl.load(wbase + kk * ks + wv.to(tl.int64) * ns, mask=wm, other=0.0)
                    acc += (a * c)[:, None] * bw[None, :]
        tl.store(
            dst_ptr + node[:, None] * dim_dst + dst_off + wv[None, :] * D + m[:, None],
            acc,
            mask=rm[:, None] & wm[None, :],
        )


def _skip_wgrad(
    order_ptr,
    elem_ptr,
    x_ptr,
    g_ptr,
    gw_ptr,
    job_ptr,
    path_ptr,
    coef_ptr,
    dim_x,
    dim_g,
    BLOCK_U: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IEEE: tl.constexpr,
    DOT: tl.constexpr,
):
    e = tl.program_id(0)
    j = tl.program_id(1)
    p = tl.load(job_ptr + 6 * j)
    u0 = tl.load(job_ptr + 6 * j + 1)
    w0 = tl.load(job_ptr + 6 * j + 2)
    dst_off = tl.load(job_ptr + 6 * j + 3)
    Nd = tl.load(job_ptr + 6 * j + 4)
    D = tl.load(job_ptr + 6 * j + 5)
    src_off = tl.load(path_ptr + 6 * p)
    U = tl.load(path_ptr + 6 * p + 1)
    woff = tl.load(path_ptr + 6 * p + 2).to(tl.int64)
    ks = tl.load(path_ptr + 6 * p + 3)
    es = tl.load(path_ptr + 6 * p + 5)
    c = tl.load(coef_ptr + p).to(gw_ptr.dtype.element_ty)
    s0 = tl.load(elem_ptr + e)
    rows = (tl.load(elem_ptr + e + 1) - s0) * D
    uu = u0 + tl.arange(0, BLOCK_U)
    um = uu < U
    wv = w0 + tl.arange(0, BLOCK_W)
    wm = wv < Nd
    acc = tl.full([BLOCK_U, BLOCK_W], 0, gw_ptr.dtype.element_ty)
    if DOT:
        for r0 in range(0, rows, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            rm = r < rows
            k = r // D
            m = r - k * D
            node = tl.load(order_ptr + s0 + k, mask=rm, other=0)
            xt = tl.load(
                x_ptr + node[None, :] * dim_x + src_off + uu[:, None] * D + m[None, :],
                mask=um[:, None] & rm[None, :],
                other=0.0,
            )
            gt = tl.load(
                g_ptr + node[:, None] * dim_g + dst_off + wv[None, :] * D + m[:, None],
                mask=rm[:, None] & wm[None, :],
                other=0.0,
            )
            if IEEE:
                acc = tl.dot(xt, gt, acc, input_precision="ieee")
            else:
                acc = tl.dot(xt, gt, acc, out_dtype=tl.float64)
    else:  # rank-1 updates, one row at a time (float64 on AMD, whose tl.dot lowering fails)
        for r in range(0, rows):
            k = r // D
            m = r - k * D
            node = tl.load(order_ptr + s0 + k)
            xv = tl.load(x_ptr + node * dim_x + src_off + uu * D + m, mask=um, other=0.0)
            gv = tl.load(g_ptr + node * dim_g + dst_off + wv * D + m, mask=wm, other=0.0)
            acc += xv[:, None] * gv[None, :]
    tl.store(
        gw_ptr + woff + uu[:, None].to(tl.int64) * ks + e.to(tl.int64) * es + wv[None, :],
        acc * c,
        mask=um[:, None] & wm[None, :],
    )


_JITTED: dict[tuple[str, bool], object] = {}


def _jitted(name: str):
    """The kernel ``name`` jitted in the mode in force (compiled, or interpreted)."""
    key = (name, interpreting())
    if key not in _JITTED:
        _JITTED[key] = triton.jit({"skip_apply": _skip_apply, "skip_wgrad": _skip_wgrad}[name])
    return _JITTED[key]


# ---------------------------------------------------------------------------------------------
# Launchers: the operators' CUDA kernels (and, in the tests, their CPU kernels under the
# interpreter)
# ---------------------------------------------------------------------------------------------
def _use_dot(x: torch.Tensor) -> bool:
    """Whether the kernels multiply tiles with ``tl.dot`` (else rank-1 updates): not in float64 on
    AMD GPUs, where triton 3.7.1's lowering of a float64 ``tl.dot`` to MFMA fails on gfx942
    ("Unsupported data type", found by ``make triton-check``)."""
    return not (x.dtype == torch.float64 and torch.version.hip is not None)


def _dot_flags(x: torch.Tensor) -> dict:
    """The kernels' constexprs ``IEEE`` (float32 ``tl.dot`` in IEEE precision, never TF32) and
    ``DOT`` (:func:`_use_dot`) for inputs like ``x``."""
    return dict(IEEE=x.dtype == torch.float32, DOT=_use_dot(x))


def _check(op: str, x, w, order, elem_ptr, desc, desc_t, meta) -> None:
    """The checks of the C++ binding layer (skip_tp_ops.h) that need no host copy."""
    if len(meta) != 7 or len(desc) != 2 or len(desc_t) != 2:
        raise RuntimeError(f"{op}: the descriptor is 2 + 2 tensors and 7 ints")
    if x.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"{op}: x must be float32 or float64, got {x.dtype}")
    if w.dtype != x.dtype or w.device != x.device:
        raise RuntimeError(f"{op}: w is {w.dtype} on {w.device}, expected {x.dtype} on {x.device}")
    if x.dim() != 2 or x.shape[1] != meta[0]:
        raise RuntimeError(f"{op}: x must be [N, {meta[0]}], got {list(x.shape)}")
    if w.dim() != 1 or w.shape[0] != meta[3]:
        raise RuntimeError(f"{op}: w must be [{meta[3]}], got {list(w.shape)}")
    for name, t, n in (("order", order, x.shape[0]), ("elem_ptr", elem_ptr, meta[2] + 1)):
        if t.dtype != torch.int64 or t.device != x.device or t.dim() != 1 or t.shape[0] != n:
            raise RuntimeError(
                f"{op}: {name} must be int64 [{n}] on {x.device}, got {t.dtype} "
                f"{list(t.shape)} on {t.device}"
            )
    for d in (*desc, *desc_t):
        if d.device != x.device:
            raise RuntimeError(
                f"{op}: a descriptor table is on {d.device} but the inputs are on {x.device} "
                "(move the module with .to())"
            )


def _apply(t: SkipTables, desc, order, elem_ptr, src, w, dst) -> None:
    """dst = the per-element map of src with the tables ``t`` (every element of dst written; the
    callers launch it for nodes only).

    ``skip_apply``: one program per (tile of at most ``TILE_NODES`` nodes of one element, block of
    ``BLOCK_W`` destination channels of one irrep block). The tile's rows are its nodes'
    components (node, m); per path into the block, ``[rows, K] x [K, BLOCK_W]`` products of the
    rows with the element's weight block (``tl.dot``; float32 in IEEE precision, never TF32) are
    accumulated, and the tile stores its rows once: every element of the output is written by one
    program (zeros where no path reaches a block), so the output is never zero-filled. The tiles
    are found in the kernel from ``elem_ptr`` (a prefix sum over the elements' tile counts): their
    number, ``nodes // TILE_NODES + elements``, depends on the shapes only, so a launch never
    waits for the device and a CUDA graph can capture it; tiles past the last real one have no
    rows."""
    n = src.shape[0]
    E = t.num_elements
    slots = n // TILE_NODES + E
    ints = desc[0]
    nb = t.n_blocks

    tables = [ints, ints[3 * nb :], ints[4 * nb + 1 :], desc[1], E, t.dim_src, t.dim_dst]
    fixed = dict(TILE=TILE_NODES, BLOCK_K=32, BLOCK_E=max(16, triton.next_power_of_2(E)))
    fixed.update(_dot_flags(src))

    def run(cfg):
        tile = _dot_tile(cfg)
        jobs = t.apply_jobs(tile.block_c, src.device)
        args = [order, elem_ptr, src, w, dst, jobs, *tables]
        kern = _jitted("skip_apply")
        return run_tile(kern, (slots, jobs.shape[0]), tile, args, "BLOCK_M", "BLOCK_W", **fixed)

    launch("skip_apply", src, n, run, fit=_apply_fit(t))


def _uninitialised(shape, like: torch.Tensor) -> torch.Tensor:
    """Memory the kernels overwrite whole (the tests fill it with NaN to prove they do)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def fwd(x, w, order, elem_ptr, desc, desc_t, meta):
    """``cfm::skip_tp_fwd``: ``[N, dim_out]``, each node's features times its element's weights."""
    _check("cfm::skip_tp_fwd", x, w, order, elem_ptr, desc, desc_t, meta)
    x, order, elem_ptr = x.contiguous(), order.contiguous(), elem_ptr.contiguous()
    out = _uninitialised((x.shape[0], meta[1]), x)
    if x.shape[0]:
        _apply(_TABLES.get(desc, meta), desc, order, elem_ptr, x, w.contiguous(), out)
    return out


def bwd(g, x, w, order, elem_ptr, desc, desc_t, meta, need_x, need_w):
    """``cfm::skip_tp_bwd``: (d/dx, d/dw) of ``<g, fwd(x, w)>``; empty tensors for what is not
    requested.

    d/dx is ``skip_apply`` with the transposed tables (:func:`_apply`). d/dw is ``skip_wgrad``:
    one program per (element, path, ``BLOCK_U x BLOCK_W`` block of the weight), summing ``x^T g``
    over the element's rows in a fixed order (no atomics: the result repeats bit for bit) and
    storing every weight of its block, zeros for an element without nodes."""
    op = "cfm::skip_tp_bwd"
    _check(op, x, w, order, elem_ptr, desc, desc_t, meta)
    if g.dtype != x.dtype or g.device != x.device or list(g.shape) != [x.shape[0], meta[1]]:
        raise RuntimeError(
            f"{op}: g must be {x.dtype} [{x.shape[0]}, {meta[1]}] on {x.device}, got {g.dtype} "
            f"{list(g.shape)} on {g.device}"
        )
    g, x, w = g.contiguous(), x.contiguous(), w.contiguous()
    order, elem_ptr = order.contiguous(), elem_ptr.contiguous()
    gx = _uninitialised(tuple(x.shape), x) if need_x else x.new_empty(0)
    gw = _uninitialised(tuple(w.shape), w) if need_w else w.new_empty(0)
    if need_x and x.shape[0]:
        _apply(_TABLES_T.get(desc_t, meta), desc_t, order, elem_ptr, g, w, gx)
    if need_w:
        t = _TABLES.get(desc, meta)
        E = t.num_elements

        tables = [desc[0][4 * t.n_blocks + 1 :], desc[1], t.dim_src, t.dim_dst]

        def run(cfg):
            tile = _dot_tile(cfg)
            jobs = t.wgrad_jobs(tile.block_rows, tile.block_c, x.device)
            args = [order, elem_ptr, x, g, gw, jobs, *tables]
            kern, grid = _jitted("skip_wgrad"), (E, jobs.shape[0])
            return run_tile(
                kern, grid, tile, args, "BLOCK_U", "BLOCK_W", BLOCK_R=32, **_dot_flags(x)
            )

        launch("skip_wgrad", x, x.shape[0], run, fit=_wgrad_fit(t))
    return gx, gw


def specimen(kernel: str, dtype_name: str, nodes: int = 4000, elements: int = 89) -> dict:
    """Argument values of a typical launch (the MACE-MP-medium-like skip connection,
    128x0e+128x1o), for the ahead-of-time compile check (:mod:`cfm_plugins.ops.triton.aot`)."""
    fp = "*fp64" if dtype_name == "float64" else "*fp32"
    common = dict(order_ptr="*i64", elem_ptr="*i64", job_ptr="*i32", path_ptr="*i32")
    common["coef_ptr"] = "*fp64"
    if kernel == "skip_apply":
        return dict(
            common,
            src_ptr=fp,
            w_ptr=fp,
            dst_ptr=fp,
            blk_ptr="*i32",
            pptr_ptr="*i32",
            E=elements,
            dim_src=512,
            dim_dst=512,
        )
    if kernel == "skip_wgrad":
        return dict(common, x_ptr=fp, g_ptr=fp, gw_ptr=fp, dim_x=512, dim_g=512)
    raise ValueError(f"unknown skip_tp kernel {kernel!r}")


def aot_constants(kernel: str, dtype_name: str, target: str) -> dict:
    """The constexprs of ``kernel`` other than its tile, as a launch for ``target`` (``sm_90``,
    ``gfx942``, ...) in ``dtype_name`` sets them (see :func:`_use_dot`)."""
    fixed = dict(kernel_function(kernel)[2])
    fixed["IEEE"] = dtype_name == "float32"
    fixed["DOT"] = not (dtype_name == "float64" and target.startswith("gfx"))
    return fixed


def kernel_function(kernel: str):
    """The plain function of ``kernel`` (``skip_apply``, ``skip_wgrad``) for the ahead-of-time
    check, with its constexpr block names (rows, channels) and the fixed ones."""
    if kernel == "skip_apply":
        return _skip_apply, ("BLOCK_M", "BLOCK_W"), dict(TILE=TILE_NODES, BLOCK_K=32, BLOCK_E=128)
    if kernel == "skip_wgrad":
        return _skip_wgrad, ("BLOCK_U", "BLOCK_W"), dict(BLOCK_R=32)
    raise ValueError(f"unknown skip_tp kernel {kernel!r}")
