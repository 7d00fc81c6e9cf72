"""The symmetric contraction descriptor (ops/descriptors/symmetric_contraction.py), folded from a
real mace SymmetricContraction's U matrices: one monomial per multiset, derivative terms."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)

from cfm_plugins.ops.descriptors.symmetric_contraction import derivative_terms
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from tests.helpers.mace_models import mace_module


def test_descriptor_folds_symmetric_tuples():
    sc = mace_module("0e+1o", 8, 3, 3, False)
    d = FusedSymmetricContraction.from_mace(sc).descriptor
    assert all(list(m) == sorted(m) for m in d.monomials)  # one monomial per multiset
    assert len(set(d.monomials)) == len(d.monomials)
    assert d.max_degree == 3 and d.num_rows < sum(
        u.numel() for n, u in sc.named_buffers() if "U_matrix" in n
    )
    for j, l, lower, mult in derivative_terms(
        d
    ):  # derivative form: multiplicity times a lower monomial
        assert mult == d.monomials[j].count(l) and lower != -2 or len(d.monomials[j]) == 3
