"""Sparse descriptor of MACE's symmetric contraction (the product basis), built from U buffers.

*What* is computed, independent of *how* (the kernels in ``cuda/symmetric_contraction/`` and the
pure-torch fallback in :mod:`cfm_plugins.ops.symmetric_contraction` both read this). For one node
``n`` and one channel ``c`` MACE's contraction of output irrep ``i`` is::

    out[i, m] = sum_nu sum_{l_1..l_nu} (sum_k U_nu[m, l_1..l_nu, k] W_nu[elem, k, c])
                * prod_a x[c, l_a]

:func:`build_descriptor` folds mace's U tensors into an :class:`SCDescriptor`, a polynomial in
``x`` of monomials and terms (its docstring gives the folding, the monomial tree and the
derivatives).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["SCBlock", "SCDescriptor", "build_descriptor", "fold_u", "derivative_terms"]


def fold_u(U: np.ndarray, nu: int, num_ell: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Fold ``U[m, l_1..l_nu, k]`` over the orderings of each index multiset.

    Returns ``A[m, s, k]`` (s over the sorted multisets) and the multisets (sorted tuples).
    """
    M, K = U.shape[0], U.shape[-1]
    flat = U.reshape(M, num_ell**nu, K)
    tuples = np.array(list(itertools.product(range(num_ell), repeat=nu)), dtype=np.int64).reshape(
        -1, nu
    )
    keys = np.sort(tuples, axis=1)
    code = np.zeros(len(keys), dtype=np.int64)
    for a in range(nu):
        code = code * num_ell + keys[:, a]
    uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
    A = np.zeros((M, len(uniq), K), dtype=np.float64)
    np.add.at(A, (slice(None), inv.ravel()), flat)  # A[:, inv[t]] += flat[:, t]
    monos = [tuple(int(v) for v in keys[f]) for f in first]
    return A, monos


@dataclass
class SCBlock:
    """Terms that share one weight tensor (output irrep ``irrep``, correlation order ``nu``)."""

    irrep: int
    nu: int
    row0: int  # first coefficient row of the block
    A: np.ndarray  # [rows, K]


@dataclass
class SCDescriptor:
    """Sparse polynomial form of a whole ``SymmetricContraction`` (all output irreps).

    The product ``prod_a x[l_a]`` depends only on the *multiset* {l_1..l_nu}, so the index tuples
    are folded (:func:`fold_u`): for every multiset ("monomial") the U entries of all its
    orderings are summed (exact, whether or not U is symmetric). Only nonzero (output component,
    monomial) rows are kept; each becomes one *term* with a coefficient vector ``A[term, k]`` over
    the K weights of its (irrep, nu) block. The kernels fold the weights once per call,
    ``coeff[e, term, c] = sum_k A[term, k] W[e, k, c]``.

    Monomials form a tree: monomial ``j`` = monomial ``parent[j]`` times ``x[last[j]]``
    (degree-1 monomials have parent -1), sorted by degree, so one multiplication generates each
    monomial from an earlier one, once per channel, and every term reuses it.

    Derived descriptors: differentiating the polynomial gives polynomials of the same family. The
    backward kernel walks the same tree in reverse order (:attr:`reverse_order`: children before
    parents, the adjoint of ``P[j] = P[parent] * x[last]``), seeded by the terms; the double
    backward walks it forwards with a tangent (``T[j] = T[parent] x[last] + P[parent] dx[last]``)
    and then in reverse again. :func:`derivative_terms` lists the explicit first-derivative form
    (d monomial / d x[l] = multiplicity times a lower monomial) for inspection and tests.
    """

    num_ell: int
    channels: int
    irrep_dims: list  # 2L+1 per output irrep
    monomials: list  # sorted tuples of ell indices, by degree then lexicographic
    parent: np.ndarray  # [J] int32, -1 for degree 1
    last: np.ndarray  # [J] int32
    slot: np.ndarray  # [J] int32: row of the stored-monomial scratch, -1 if never a parent
    num_slots: int
    term_ptr: np.ndarray  # [J+1] int32: terms of monomial j are term_ptr[j]..term_ptr[j+1]
    term_row: np.ndarray  # [T] int32: coefficient row of each term
    term_out: np.ndarray  # [T] int32: output component of each term
    out_base: (
        np.ndarray
    )  # [O] int64: offset of output component o in a node's output row (channel 0)
    out_stride: np.ndarray  # [O] int32: channel stride of output component o
    out_dim: int  # length of a node's output row = channels * sum(irrep_dims)
    blocks: list = field(default_factory=list)  # SCBlock, rows in coefficient order

    @property
    def num_rows(self) -> int:
        return int(len(self.term_row))

    @property
    def num_out(self) -> int:
        return int(len(self.out_base))

    @property
    def max_degree(self) -> int:
        return max((len(m) for m in self.monomials), default=0)

    @property
    def reverse_order(self) -> np.ndarray:
        """Backward descriptor: monomials children-first (the adjoint walk of the tree)."""
        return np.arange(len(self.monomials) - 1, -1, -1, dtype=np.int32)

    def int_tensors(self, device) -> dict:
        """The integer arrays the kernels read, as contiguous tensors on ``device``."""

        def t(a, dt):
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dt, device=device)

        return {
            "parent": t(self.parent, torch.int32),
            "last": t(self.last, torch.int32),
            "slot": t(self.slot, torch.int32),
            "term_ptr": t(self.term_ptr, torch.int32),
            "term_row": t(self.term_row, torch.int32),
            "term_out": t(self.term_out, torch.int32),
            "out_base": t(self.out_base, torch.int64),
            "out_stride": t(self.out_stride, torch.int32),
        }


def build_descriptor(u_per_irrep: list, channels: int, tol: float | None = None) -> SCDescriptor:
    """Build the descriptor from the U tensors of each output irrep.

    ``u_per_irrep[i]`` is the list ``[U_1, ..., U_corr]`` of irrep ``i`` as stored in mace's
    ``Contraction`` (``U_nu`` is ``[2L+1] + [num_ell]*nu + [K]``, the leading dim squeezed for L=0).
    Entries whose folded magnitude is below ``tol`` (default: 64 eps of the U dtype times max |U|)
    are treated as zero (cancellation residue of the folding).
    """
    num_ell = None
    irrep_dims = []
    raw = []  # (irrep, nu, A[m, s, k], monos)
    for i, us in enumerate(u_per_irrep):
        M = None
        for nu, U in enumerate(us, start=1):
            Ut = U.detach().to("cpu")
            eps = torch.finfo(Ut.dtype).eps if Ut.is_floating_point() else 1e-16
            U = Ut.double().numpy()
            if U.ndim == nu + 1:
                U = U[None]
            if U.ndim != nu + 2:
                raise ValueError(
                    f"U_matrix_{nu} of irrep {i} has shape {tuple(Ut.shape)}, expected "
                    f"[2L+1] + [num_ell]*{nu} + [K]"
                )
            M = U.shape[0] if M is None else M
            num_ell = U.shape[1] if num_ell is None else num_ell
            A, monos = fold_u(U, nu, num_ell)
            scale = float(np.abs(U).max()) if U.size else 0.0
            thr = tol if tol is not None else 64 * eps * max(scale, 1e-300)
            A[np.abs(A) <= thr] = 0.0
            raw.append((i, nu, A, monos))
        irrep_dims.append(int(M if M is not None else 1))
    if num_ell is None:
        raise ValueError("no U matrices given")

    # Output components, mace layout per irrep: [channels, 2L+1] flattened, irreps concatenated.
    out_base, out_stride, comp0 = [], [], []
    off = 0
    for M in irrep_dims:
        comp0.append(len(out_base))
        for m in range(M):
            out_base.append(off + m)
            out_stride.append(M)
        off += channels * M

    # Terms: nonzero (component, monomial) rows, grouped in blocks by (irrep, nu).
    mono_terms: dict = {}  # monomial tuple -> list of (row, out component)
    blocks, rows = [], 0
    for i, nu, A, monos in raw:
        keep = np.nonzero(np.any(A != 0.0, axis=-1))  # (m, s) pairs
        if len(keep[0]) == 0:
            continue
        blocks.append(SCBlock(irrep=i, nu=nu, row0=rows, A=A[keep[0], keep[1], :].copy()))
        for m, s in zip(*keep):
            mono_terms.setdefault(monos[s], []).append((rows, comp0[i] + int(m)))
            rows += 1

    # Monomial tree: every used monomial and its ancestors (prefixes of the sorted tuple).
    needed = set()
    for mono in mono_terms:
        for d in range(1, len(mono) + 1):
            needed.add(mono[:d])
    monomials = sorted(needed, key=lambda t: (len(t), t))
    index = {m: j for j, m in enumerate(monomials)}
    parent = np.array([index[m[:-1]] if len(m) > 1 else -1 for m in monomials], dtype=np.int32)
    last = np.array([m[-1] for m in monomials], dtype=np.int32)
    is_parent = np.zeros(len(monomials), dtype=bool)
    is_parent[parent[parent >= 0]] = True
    slot = np.full(len(monomials), -1, dtype=np.int32)
    slot[is_parent] = np.arange(int(is_parent.sum()), dtype=np.int32)

    term_ptr = [0]
    term_row, term_out = [], []
    for m in monomials:
        for r, o in mono_terms.get(m, []):
            term_row.append(r)
            term_out.append(o)
        term_ptr.append(len(term_row))
    return SCDescriptor(
        num_ell=int(num_ell),
        channels=int(channels),
        irrep_dims=irrep_dims,
        monomials=monomials,
        parent=parent,
        last=last,
        slot=slot,
        num_slots=int(is_parent.sum()),
        term_ptr=np.array(term_ptr, dtype=np.int32),
        term_row=np.array(term_row, dtype=np.int32),
        term_out=np.array(term_out, dtype=np.int32),
        out_base=np.array(out_base, dtype=np.int64),
        out_stride=np.array(out_stride, dtype=np.int32),
        out_dim=int(off),
        blocks=blocks,
    )


def derivative_terms(desc: SCDescriptor) -> list[tuple[int, int, int, int]]:
    """Explicit first-derivative form: ``(j, l, j_lower, multiplicity)`` with
    ``d P_j / d x[l] = multiplicity * P_{j_lower}`` (``j_lower = -1`` for the constant 1).

    Lower monomials not in the tree are reported with ``j_lower = -2`` (the kernels never need
    them: they differentiate through the tree instead)."""
    index = {m: j for j, m in enumerate(desc.monomials)}
    out = []
    for j, m in enumerate(desc.monomials):
        for l in sorted(set(m)):
            rest = list(m)
            rest.remove(l)
            lower = -1 if not rest else index.get(tuple(rest), -2)
            out.append((j, l, lower, m.count(l)))
    return out
