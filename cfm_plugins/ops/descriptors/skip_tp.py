"""Descriptor of the skip connection: e3nn's ``FullyConnectedTensorProduct`` of node features with
a one-hot of the element, as a per-element linear map.

With the one-hot ``y`` only the node's element ``e(n)`` contributes, so MACE's
``skip_tp(node_feats, node_attrs)`` is::

    out[n, o + w*D + m] = sum_{paths into block o} coef * sum_u x[n, i + u*D + m] * W[u, e(n), w]

(``D = 2l + 1`` components, e3nn's ``mul x ir`` layout: multiplicity-major; ``W`` e3nn's weights
of the path, in its flat layout, so the fused module shares the parameter). :func:`from_e3nn`
reads a built module into a :class:`SkipTPDescriptor` (its docstring gives the tables; that of
:func:`from_e3nn`, ``coef`` and why only one element contributes).

Pure python/numpy: no torch, no e3nn import here (``from_e3nn`` reads a built module).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["SkipTPDescriptor", "from_e3nn", "why_not"]


@dataclass(frozen=True, eq=False)
class SkipTPDescriptor:
    """The paths of the skip connection and the tables of one orientation: ``transposed`` False
    for the forward (destination the output rows), True for the node-feature gradient
    (destination the input rows).

    The tables (the kernels are GEMMs of one element's rows): *blocks* of the destination
    (offset, multiplicity, components, first path) and *paths* into them (source offset,
    contracted multiplicity ``K``, weight offset, the weight's strides along ``K``, along the
    destination's multiplicity, and along the element). The forward's destination is the output
    (``K = mul_in``, weight rows contiguous along ``w``); :meth:`transpose` gives the node-feature
    gradient's (destination the input, ``K = mul_out``, the weight read transposed). The weight
    gradient reads the forward tables. Every block of the destination is listed, also one no path
    reaches (its rows are written with zeros), so the kernels write every element of their
    outputs.
    """

    dim_in: int  # width of the node-feature rows
    dim_out: int  # width of the output rows
    num_elements: int  # E: the one-hot's width, the weights' middle dimension
    weight_numel: int
    in_blocks: tuple  # every irrep block of the input: (offset, mul, dim)
    out_blocks: tuple  # every irrep block of the output: (offset, mul, dim)
    path_io: tuple  # per path: (in_off, mul_in, out_off, mul_out, dim)
    coef: tuple  # per path: path_weight / sqrt(dim)
    woff: tuple  # per path: offset of its weights W[u, e, w] in e3nn's flat weight vector
    transposed: bool = False

    @property
    def dim_src(self) -> int:
        """Width of the rows the kernel of this orientation reads."""
        return self.dim_out if self.transposed else self.dim_in

    @property
    def dim_dst(self) -> int:
        """Width of the rows it writes."""
        return self.dim_in if self.transposed else self.dim_out

    @property
    def blocks(self) -> tuple:
        """Every destination block, ``(offset, mul, dim)``."""
        return self.in_blocks if self.transposed else self.out_blocks

    @property
    def order(self) -> list[int]:
        """The paths grouped by destination block (in the blocks' order)."""
        key = 0 if self.transposed else 2
        return [
            p for off, _, _ in self.blocks for p, io in enumerate(self.path_io) if io[key] == off
        ]

    @property
    def path_ptr(self) -> list[int]:
        """``[n_blocks + 1]``: the paths of block ``b`` are ``order[path_ptr[b]:path_ptr[b+1]]``."""
        key = 0 if self.transposed else 2
        counts = [sum(io[key] == off for io in self.path_io) for off, _, _ in self.blocks]
        return [0] + list(np.cumsum(counts, dtype=np.int64).tolist())

    @property
    def paths(self) -> list[tuple[int, ...]]:
        """Per path (grouped): ``(src_off, K, woff, k_stride, n_stride, e_stride)``: ``W[k, e, n]``
        of the contraction at ``woff + k*k_stride + e*e_stride + n*n_stride``."""
        E, out = self.num_elements, []
        for p in self.order:
            i_off, mul_in, o_off, mul_out, _ = self.path_io[p]
            if self.transposed:  # K = w (stride 1), n = u (stride E*mul_out)
                out.append((o_off, mul_out, self.woff[p], 1, E * mul_out, mul_out))
            else:  # K = u (stride E*mul_out), n = w (stride 1)
                out.append((i_off, mul_in, self.woff[p], E * mul_out, 1, mul_out))
        return out

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_paths(self) -> int:
        return len(self.path_io)

    def meta(self) -> list[int]:
        """The operators' ``meta`` (the same for both orientations): ``[dim_in, dim_out,
        num_elements, weight_numel, n_paths, n_blocks (output), n_blocks_t (input)]``."""
        return [
            self.dim_in,
            self.dim_out,
            self.num_elements,
            self.weight_numel,
            self.num_paths,
            len(self.out_blocks),
            len(self.in_blocks),
        ]

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 ``blocks (3 per block) | path_ptr (n_blocks + 1) | paths (6 per path)``, float64
        ``coef`` per path in the same order): the operators' ``desc``."""
        ints = np.asarray(
            [v for b in self.blocks for v in b]
            + list(self.path_ptr)
            + [v for p in self.paths for v in p],
            dtype=np.int64,
        )
        if ints.size and (ints.max() >= 2**31 or ints.min() < 0):
            raise ValueError("skip_tp descriptor: an offset does not fit in int32")
        coef = np.asarray([self.coef[p] for p in self.order], dtype=np.float64)
        return ints.astype(np.int32), coef

    def transpose(self) -> SkipTPDescriptor:
        """The other orientation (the forward's for the node-feature gradient's, and back)."""
        return dataclasses.replace(self, transposed=not self.transposed)


def _irrep_blocks(irreps) -> list[tuple[int, int, int]]:
    """(offset, mul, dim) of every irrep block with a nonzero width."""
    out, off = [], 0
    for mul, ir in irreps:
        if mul * ir.dim:
            out.append((off, int(mul), int(ir.dim)))
        off += mul * ir.dim
    return out


def why_not(tp) -> str:
    """Why ``tp`` is not a tensor product this descriptor describes ("" where it is): an
    e3nn-interface tensor product with shared internal weights, a second input of one block of
    ``Ex0e`` (the one-hot of the element) and only weighted ``uvw`` instructions reading it."""
    for a in ("irreps_in1", "irreps_in2", "irreps_out", "instructions", "weight_numel"):
        if not hasattr(tp, a):
            return f"no attribute {a!r} (not an e3nn tensor product)"
    if not (getattr(tp, "internal_weights", False) and getattr(tp, "shared_weights", False)):
        return "its weights are not internal and shared (a per-node weight is no skip connection)"
    in2 = list(tp.irreps_in2)
    if len(in2) != 1 or in2[0].ir.l != 0 or in2[0].ir.p != 1 or in2[0].mul < 1:
        return f"its second input {tp.irreps_in2} is not one block of scalars Nx0e"
    E = int(in2[0].mul)
    ins = list(tp.instructions or [])
    if not ins:
        return "it has no instruction"
    for i in ins:
        if getattr(i, "connection_mode", None) != "uvw" or not getattr(i, "has_weight", False):
            return f"instruction {i} is not a weighted 'uvw' one"
        mul_in, ir_in = tp.irreps_in1[i.i_in1]
        mul_out, ir_out = tp.irreps_out[i.i_out]
        if i.i_in2 != 0 or ir_in != ir_out:
            return f"instruction {i} does not map an input irrep to the same output irrep"
        if tuple(i.path_shape) != (mul_in, E, mul_out):
            return f"instruction {i} has path shape {i.path_shape}, not {(mul_in, E, mul_out)}"
    numel = sum(math.prod(i.path_shape) for i in ins)
    if numel != tp.weight_numel:
        return f"its weights ({tp.weight_numel}) are not its instructions' ({numel})"
    return ""


def from_e3nn(tp) -> SkipTPDescriptor:
    """The forward tables of a built e3nn ``FullyConnectedTensorProduct`` of node features with an
    ``Ex0e`` one-hot (a ``ValueError`` saying why where it is not one, :func:`why_not`).

    MACE's interaction blocks build ``skip_tp = FullyConnectedTensorProduct(irreps_in, Ex0e,
    irreps_out)`` and call it with ``node_attrs``, the one-hot of each node's element among the
    ``E`` of the model's table. Every instruction is ``(i_in, 0, i_out, "uvw")`` with
    ``irreps_in[i_in].ir == irreps_out[i_out].ir`` (times ``0e``), its weights ``W[u, v, w]``
    (``path_shape = (mul_in, E, mul_out)``) at its offset of e3nn's flat weight vector. e3nn
    evaluates ``sum_{u,v} W[u, v, w] x[n, u, m] y[n, v]`` for all ``E`` values of ``v``; with
    ``y`` one-hot only ``v = e(n)``, the node's element, contributes (the module docstring's
    formula). ``coef`` is e3nn's ``path_weight`` (irrep and path normalisation: ``sqrt(dim / (sum
    of mul_in * E over the paths into the block))`` for ``component``/``element``) divided by
    ``sqrt(D)``, the value of the Wigner 3j symbol ``(l, 0, l)`` that e3nn's specialised code
    divides by (its general code multiplies by the same symbol). The weights stay in e3nn's flat
    layout, so the fused module shares the parameter.
    """
    why = why_not(tp)
    if why:
        raise ValueError(why)
    E = int(tp.irreps_in2[0].mul)
    in_off = np.concatenate([[0], np.cumsum([m * ir.dim for m, ir in tp.irreps_in1])]).astype(int)
    out_off = np.concatenate([[0], np.cumsum([m * ir.dim for m, ir in tp.irreps_out])]).astype(int)
    path_io, coef, woffs, woff = [], [], [], 0
    for i in tp.instructions:
        mul_in, ir = tp.irreps_in1[i.i_in1]
        mul_out = tp.irreps_out[i.i_out].mul
        if mul_in * mul_out * ir.dim:  # e3nn skips empty instructions (their weights stay)
            path_io.append((in_off[i.i_in1], mul_in, out_off[i.i_out], mul_out, ir.dim))
            coef.append(float(i.path_weight) / math.sqrt(ir.dim))
            woffs.append(woff)
        woff += math.prod(i.path_shape)
    return SkipTPDescriptor(
        dim_in=int(tp.irreps_in1.dim),
        dim_out=int(tp.irreps_out.dim),
        num_elements=E,
        weight_numel=int(tp.weight_numel),
        in_blocks=tuple(_irrep_blocks(tp.irreps_in1)),
        out_blocks=tuple(_irrep_blocks(tp.irreps_out)),
        path_io=tuple(tuple(int(v) for v in io) for io in path_io),
        coef=tuple(coef),
        woff=tuple(woffs),
    )
