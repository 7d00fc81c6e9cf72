"""Sparse descriptor of the channelwise ("uvu") tensor product used for MACE/NequIP messages.

What is computed (per edge ``e`` from sender ``s`` to receiver ``r``, per path ``p``, per channel
``c`` of that path)::

    out[r, k, c] += sum_{(i, j, k, coef) in path p}  coef * x[s, i, c] * y[e, j] * w[e, p, c]

``coef`` is the Wigner 3j symbol of the path times e3nn's path normalization. :func:`from_e3nn`
reads a built e3nn ``TensorProduct`` into a :class:`ConvTPDescriptor` (its docstring gives the
layouts and tables), whose tables serve the forward and every derivative.

Pure python/numpy: no torch, no e3nn import here (``from_e3nn`` reads a built module).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

#: CG entries smaller than this (relative to the path's largest) are round-off of exact zeros.
ZERO_TOL = 1e-12


@dataclass(frozen=True)
class PathInfo:
    """One uvu instruction: which irrep blocks it reads and writes, and its dense coefficients."""

    i_in1: int
    i_in2: int
    i_out: int
    l_in1: int
    l_in2: int
    l_out: int
    mul: int
    weight_offset: int
    path_weight: float
    #: nonzero entries as rows (i, j, k, coef), coef including path_weight
    entries: np.ndarray = field(repr=False)


@dataclass(frozen=True, eq=False)
class ConvTPDescriptor:
    """Flat int32/float64 tables read by the CPU and CUDA kernels.

    ``x`` is stored *channel-last* per irrep block (block offset + component * mul + channel), so
    every inner loop runs over contiguous channels. ``y`` (the edge attributes, multiplicity 1 per
    irrep) and ``w`` (per-edge weights, e3nn's flat layout: path offset + channel) keep e3nn's
    layout. ``coef`` is the Wigner 3j symbol of the path times ``ins.path_weight`` of the built
    ``TensorProduct``, which already holds irrep/path normalization and any user weight.

    The entries are grouped into *pairs* ``(in component, out component)``: per edge the scalar
    ``R[q] = sum_{entries of pair q} coef * y[e, j]`` is formed once, then every channel does one
    multiply-add per pair. The same tables serve all derivatives of the trilinear form:

    - gradient w.r.t. node features: :meth:`transpose` (in and out swapped), run by the same
      segment kernel over edges grouped by *sender* and gathering the output gradient of the
      receiver;
    - gradient w.r.t. edge attributes and weights: a per-edge kernel on the untransposed tables;
    - double backward: these same kernels with the cotangents substituted (the form is trilinear).
    """

    dim_in: int  # width of the node rows read (channel-last)
    dim_edge: int  # width of the edge attribute rows (y)
    dim_out: int  # width of the node rows written (channel-last)
    weight_numel: int  # width of the per-edge weight rows (w)
    path_mul: np.ndarray  # [P] channels of the path
    path_woff: np.ndarray  # [P] offset of the path in a weight row
    path_pair_start: np.ndarray  # [P+1] pairs of path p: path_pair_start[p]:path_pair_start[p+1]
    pair_in: np.ndarray  # [Q] offset of the pair's input component row (channel 0)
    pair_out: np.ndarray  # [Q] offset of the pair's output component row (channel 0)
    pair_ent_start: np.ndarray  # [Q+1] entries of pair q
    ent_j: np.ndarray  # [NE] edge attribute component of the entry
    ent_coef: np.ndarray  # [NE] float64 coefficient
    transposed: bool = False

    @property
    def num_paths(self) -> int:
        return int(self.path_mul.shape[0])

    @property
    def num_pairs(self) -> int:
        return int(self.pair_in.shape[0])

    @property
    def num_entries(self) -> int:
        return int(self.ent_j.shape[0])

    def transpose(self) -> ConvTPDescriptor:
        """The descriptor of the input gradient: reads output rows, writes input rows."""
        return ConvTPDescriptor(
            dim_in=self.dim_out,
            dim_edge=self.dim_edge,
            dim_out=self.dim_in,
            weight_numel=self.weight_numel,
            path_mul=self.path_mul,
            path_woff=self.path_woff,
            path_pair_start=self.path_pair_start,
            pair_in=self.pair_out,
            pair_out=self.pair_in,
            pair_ent_start=self.pair_ent_start,
            ent_j=self.ent_j,
            ent_coef=self.ent_coef,
            transposed=not self.transposed,
        )

    def int_tables(self) -> list[list[int]]:
        """The seven int tables in the order the compiled ``Descriptor`` constructors take them."""
        return [
            a.astype(np.int32).tolist()
            for a in (
                self.path_mul,
                self.path_woff,
                self.path_pair_start,
                self.pair_in,
                self.pair_out,
                self.pair_ent_start,
                self.ent_j,
            )
        ]

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """The tables as the operators take them (cuda/conv_tp/conv_tp_ops.h): one int32 array
        (path_mul | path_woff | path_pair_start | pair_in | pair_out | pair_ent_start | ent_j) and
        the float64 coefficients."""
        ints = np.concatenate(
            [
                np.asarray(a, dtype=np.int32)
                for a in (
                    self.path_mul,
                    self.path_woff,
                    self.path_pair_start,
                    self.pair_in,
                    self.pair_out,
                    self.pair_ent_start,
                    self.ent_j,
                )
            ]
        )
        return ints, np.ascontiguousarray(self.ent_coef, dtype=np.float64)

    def meta(self) -> list[int]:
        """The operators' ``meta`` ints: [dim_in, dim_out, n_paths, n_pairs, max_mul]."""
        max_mul = int(self.path_mul.max()) if self.num_paths else 1
        return [self.dim_in, self.dim_out, self.num_paths, self.num_pairs, max_mul]

    def key(self) -> str:
        """A content hash: equal tables give equal keys (used to cache compiled handles)."""
        h = hashlib.sha1()
        h.update(
            np.asarray(
                [self.dim_in, self.dim_edge, self.dim_out, self.weight_numel, int(self.transposed)],
                dtype=np.int64,
            ).tobytes()
        )
        for a in (
            self.path_mul,
            self.path_woff,
            self.path_pair_start,
            self.pair_in,
            self.pair_out,
            self.pair_ent_start,
            self.ent_j,
        ):
            h.update(np.ascontiguousarray(a, dtype=np.int32).tobytes())
        h.update(np.ascontiguousarray(self.ent_coef, dtype=np.float64).tobytes())
        return h.hexdigest()


def channel_last_permutation(irreps) -> np.ndarray:
    """``perm`` with ``x_cl = x[:, perm]``: e3nn's mul_ir layout (channel, component) to
    channel-last (component, channel) per irrep block. ``irreps``: list of (mul, dim)."""
    perm = []
    off = 0
    for mul, dim in irreps:
        for m in range(dim):
            perm.extend(off + c * dim + m for c in range(mul))
        off += mul * dim
    return np.asarray(perm, dtype=np.int64)


def _offsets(sizes) -> list[int]:
    out, acc = [], 0
    for s in sizes:
        out.append(acc)
        acc += s
    return out


def build(
    irreps_in1, irreps_in2, irreps_out, instructions, wigner_3j
) -> tuple[ConvTPDescriptor, list[PathInfo]]:
    """Build the descriptor from irreps given as lists of ``(mul, l)`` and instructions as tuples
    ``(i_in1, i_in2, i_out, mode, has_weight, path_weight)``; ``wigner_3j(l1, l2, l3)`` returns the
    dense float64 array e3nn uses. Raises ValueError for what the kernels do not cover."""
    dims1 = [2 * l + 1 for _, l in irreps_in1]
    dims2 = [2 * l + 1 for _, l in irreps_in2]
    dimso = [2 * l + 1 for _, l in irreps_out]
    off1 = _offsets(m * d for (m, _), d in zip(irreps_in1, dims1))
    off2 = _offsets(m * d for (m, _), d in zip(irreps_in2, dims2))
    offo = _offsets(m * d for (m, _), d in zip(irreps_out, dimso))

    paths: list[PathInfo] = []
    woff = 0
    for n, (i1, i2, io, mode, has_weight, path_weight) in enumerate(instructions):
        mul1, l1 = irreps_in1[i1]
        mul2, l2 = irreps_in2[i2]
        mulo, lo = irreps_out[io]
        if mode != "uvu":
            raise ValueError(f"instruction {n}: connection mode {mode!r}; only 'uvu' is fused")
        if not has_weight:
            raise ValueError(f"instruction {n}: has no weight; only weighted uvu paths are fused")
        if mul2 != 1:
            raise ValueError(
                f"instruction {n}: irreps_in2 multiplicity {mul2}; the fused kernel needs 1 "
                "(edge attributes such as spherical harmonics)"
            )
        if mulo != mul1:
            raise ValueError(
                f"instruction {n}: output multiplicity {mulo} != input multiplicity {mul1}"
            )
        if mul1 == 0:
            continue  # e3nn produces no code for empty paths; they own no weights either
        cg = np.asarray(wigner_3j(l1, l2, lo), dtype=np.float64) * float(path_weight)
        big = np.abs(cg).max() if cg.size else 0.0
        idx = np.argwhere(np.abs(cg) > ZERO_TOL * max(big, 1e-300))
        ent = np.array([(i, j, k, cg[i, j, k]) for i, j, k in idx], dtype=np.float64).reshape(-1, 4)
        paths.append(PathInfo(i1, i2, io, l1, l2, lo, mul1, woff, float(path_weight), ent))
        woff += mul1 * mul2

    path_mul, path_woff, path_pair_start = [], [], [0]
    pair_in, pair_out, pair_ent_start = [], [], [0]
    ent_j, ent_coef = [], []
    for p in paths:
        path_mul.append(p.mul)
        path_woff.append(p.weight_offset)
        # pairs in (k, i) order so consecutive pairs write the same output row
        order = sorted(
            range(len(p.entries)), key=lambda t: (p.entries[t, 2], p.entries[t, 0], p.entries[t, 1])
        )
        last = None
        for t in order:
            i, j, k, c = p.entries[t]
            i, j, k = int(i), int(j), int(k)
            if (i, k) != last:
                if last is not None:
                    pair_ent_start.append(len(ent_j))
                pair_in.append(off1[p.i_in1] + i * p.mul)
                pair_out.append(offo[p.i_out] + k * p.mul)
                last = (i, k)
            ent_j.append(off2[p.i_in2] + j)
            ent_coef.append(c)
        if last is not None:
            pair_ent_start.append(len(ent_j))
        path_pair_start.append(len(pair_in))

    i32 = lambda a: np.asarray(a, dtype=np.int32)  # noqa: E731
    desc = ConvTPDescriptor(
        dim_in=sum(m * d for (m, _), d in zip(irreps_in1, dims1)),
        dim_edge=sum(m * d for (m, _), d in zip(irreps_in2, dims2)),
        dim_out=sum(m * d for (m, _), d in zip(irreps_out, dimso)),
        weight_numel=woff,
        path_mul=i32(path_mul),
        path_woff=i32(path_woff),
        path_pair_start=i32(path_pair_start),
        pair_in=i32(pair_in),
        pair_out=i32(pair_out),
        pair_ent_start=i32(pair_ent_start),
        ent_j=i32(ent_j),
        ent_coef=np.asarray(ent_coef, dtype=np.float64),
    )
    return desc, paths


def from_e3nn(tp) -> tuple[ConvTPDescriptor, list[PathInfo]]:
    """Descriptor of a built ``e3nn.o3.TensorProduct`` (uvu, per-edge weights).

    The coefficients are read from the module: its ``instructions`` carry the normalized
    ``path_weight`` (e3nn folds irrep_normalization, path_normalization and the user path weight
    into it, and multiplies each path's output by it), and the 3j symbols are e3nn's own
    ``o3.wigner_3j`` in float64 (what its generated code uses; its specialized l=0 branches are the
    same numbers, 1/sqrt(2l+1))."""
    import torch
    from e3nn import o3

    if getattr(tp, "shared_weights", False) or getattr(tp, "internal_weights", False):
        raise ValueError(
            "FusedConvTP needs per-edge weights (shared_weights=False, internal_weights=False)"
        )
    as_list = lambda irreps: [(mul, ir.l) for mul, ir in irreps]  # noqa: E731
    ins = [
        (i.i_in1, i.i_in2, i.i_out, i.connection_mode, i.has_weight, i.path_weight)
        for i in tp.instructions
    ]
    for n, (i1, i2, io, *_rest) in enumerate(ins):
        p1, p2, po = tp.irreps_in1[i1].ir.p, tp.irreps_in2[i2].ir.p, tp.irreps_out[io].ir.p
        if p1 * p2 != po:
            raise ValueError(f"instruction {n}: parity mismatch")
    desc, paths = build(
        as_list(tp.irreps_in1),
        as_list(tp.irreps_in2),
        as_list(tp.irreps_out),
        ins,
        lambda a, b, c: o3.wigner_3j(a, b, c, dtype=torch.float64).numpy(),
    )
    if desc.weight_numel != tp.weight_numel:
        raise ValueError(
            f"weight layout mismatch: descriptor {desc.weight_numel} vs e3nn {tp.weight_numel}"
        )
    return desc, paths
