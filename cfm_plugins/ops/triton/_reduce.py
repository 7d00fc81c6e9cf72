"""Deterministic per-element sum of the symmetric contraction's weight-gradient partials.

The backward kernels write, per program tile with nodes, the tile's sum over nodes of
``d out / d coeff`` into its own slot ``slots[chunk] + sub`` of a partial buffer ``[slots, R, Cp]``
(a chunk's programs with nodes are its first ``min(ceil(len / BLOCK_N), SPLIT)``; an empty chunk
has none). The chunks of one element are consecutive (the module sorts nodes by element), so the
gradient of element ``e`` is the sum of the slots of its chunks: this kernel adds them in a fixed
order (chunks in order, tiles in order), without atomics, so a run repeats bit for bit. Padded
channels (``C <= c < Cp``) are zero.

Not generated (no descriptor in it): an ordinary Triton kernel in this file, jitted on first use
in the mode in force (compiled, or interpreted under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from cfm_plugins.ops.triton._codegen import interpreting
from cfm_plugins.ops.triton.configs import launch

_JITTED: dict[bool, object] = {}


def _element_sum(
    part_ptr,
    slot_ptr,
    chunk_ptr,
    lo_ptr,
    hi_ptr,
    out_ptr,
    W,
    C,
    Cp,
    SPLIT,
    BLOCK_N,
    BLOCK: tl.constexpr,
):
    e = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < W
    valid = inside & ((offs % Cp) < C)
    lo = tl.load(lo_ptr + e)
    hi = tl.load(hi_ptr + e)
    acc = tl.full([BLOCK], 0, out_ptr.dtype.element_ty)
    for ch in range(lo, hi):
        n = tl.load(chunk_ptr + ch + 1) - tl.load(chunk_ptr + ch)
        tiles = tl.minimum((n + BLOCK_N - 1) // BLOCK_N, SPLIT)
        first = tl.load(slot_ptr + ch)
        for sub in range(0, tiles):
            acc += tl.load(part_ptr + (first + sub) * W + offs, mask=valid, other=0.0)
    tl.store(out_ptr + e * W + offs, acc, mask=inside)


def element_sum(
    partial: torch.Tensor,
    slots: torch.Tensor,
    coeff: torch.Tensor,
    elem: torch.Tensor,
    order: torch.Tensor,
    chunk_ptr: torch.Tensor,
    channels: int,
    split: int,
    block_n: int,
) -> torch.Tensor:
    """``gc[e] = sum of the partial slots of element e's chunks`` (shape and dtype of ``coeff``);
    ``slots[k]``: the first slot of chunk ``k``."""
    E, R, Cp = coeff.shape
    gc = torch.empty(E, R, Cp, dtype=coeff.dtype, device=coeff.device)
    n_chunks = chunk_ptr.numel() - 1
    if E == 0 or R * Cp == 0:
        return gc
    if n_chunks == 0 or order.numel() == 0:
        return gc.zero_()
    # element of each chunk (chunks hold nodes of one element, in element order; E for an empty
    # chunk, which a traced forward puts at the end), then each element's range of chunks; no host
    # synchronisation
    starts = chunk_ptr[:-1]
    first_node = order.index_select(0, starts.clamp(max=order.numel() - 1))
    chunk_elem = torch.where(starts < chunk_ptr[1:], elem.index_select(0, first_node), E)
    ids = torch.arange(E, device=coeff.device, dtype=chunk_elem.dtype)
    lo = torch.searchsorted(chunk_elem, ids)
    hi = torch.searchsorted(chunk_elem, ids, right=True)
    W = R * Cp
    mode = interpreting()
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_element_sum)

    def run(cfg):
        block = min(cfg.block_c, triton.next_power_of_2(W))
        return _JITTED[mode][(E, math.ceil(W / block))](
            partial,
            slots,
            chunk_ptr,
            lo,
            hi,
            gc,
            W,
            channels,
            Cp,
            split,
            block_n,
            BLOCK=block,
            num_warps=cfg.num_warps,
        )

    launch("sc_reduce", coeff, W, run)
    return gc
