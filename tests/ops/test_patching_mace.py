"""patch_model on MACE models as mace's own compile recipe leaves them: after
``mace.tools.compile.prepare`` every ``SymmetricContraction`` is an fx ``GraphModule``
(``torch.fx.symbolic_trace``), recognised by the parameters and buffers it keeps and swapped
exactly as the stock module."""

from __future__ import annotations

import logging

import mace  # noqa: F401  (before e3nn)
import pytest
import torch
from mace.tools.compile import prepare

from cfm_plugins.ops import _backend
from cfm_plugins.ops.patching import find_modules, patch_model, unpatch_model
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from cfm_plugins.testing import mace_model
from tests.ops.test_export import batch, rel_err

pytestmark = pytest.mark.skipif(
    not _backend.operators_available(), reason="the compiled cfm:: operator library is not built"
)

SMALL = dict(hidden="8x0e+8x1o", max_ell=2, correlation=3, num_interactions=2)


def energy_forces(model, data):
    data = {k: v.clone() for k, v in data.items()}
    out = model(data, training=False, compute_force=True)
    return out["energy"].detach(), out["forces"].detach()


def test_patch_model_swaps_the_symmetric_contraction_traced_by_mace_compile_prepare():
    stock = mace_model(**SMALL)
    prepared = prepare(mace_model)(**SMALL)
    sc = prepared.products[0].symmetric_contractions
    assert isinstance(sc, torch.fx.GraphModule) and type(sc).__name__ == "SymmetricContraction"
    data = batch()
    e_ref, f_ref = energy_forces(stock, data)
    state = {k: v.clone() for k, v in prepared.state_dict().items()}

    names = ["products.0.symmetric_contractions", "products.1.symmetric_contractions"]
    assert find_modules(prepared, ["symmetric_contraction"]) == {"symmetric_contraction": names}
    report = patch_model(prepared)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    assert report.swapped["symmetric_contraction"] == names and not report.left
    assert all(isinstance(prepared.get_submodule(n), FusedSymmetricContraction) for n in names)
    # the same parameters and buffers under the same keys (a checkpoint loads either way)
    patched_state = prepared.state_dict()
    assert list(patched_state) == list(state)
    assert all(torch.equal(patched_state[k], state[k]) for k in state)
    assert {id(p) for p in prepared.parameters()} >= {
        id(p) for p in sc.parameters()
    }  # shared, not copied

    e, f = energy_forces(prepared, data)
    assert rel_err(e, e_ref) < 1e-10 and rel_err(f, f_ref) < 1e-10
    again = patch_model(prepared)  # patching twice swaps nothing more
    assert again.total == 0 and again.already["symmetric_contraction"] == names

    restored = unpatch_model(prepared)
    assert restored.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    assert prepared.products[0].symmetric_contractions is sc
    e, f = energy_forces(prepared, data)
    assert rel_err(e, e_ref) < 1e-10 and rel_err(f, f_ref) < 1e-10


def test_unpatch_after_to_gives_the_traced_module_the_moved_tensors():
    """``.to()`` on a patched model replaces the buffers the fused module holds; the traced module
    restored gets them (and runs in the new dtype)."""
    prepared = prepare(mace_model)(**SMALL)
    sc = prepared.products[0].symmetric_contractions
    x = torch.randn(4, 8, 9, dtype=torch.float64)
    y = torch.eye(2, dtype=torch.float64).repeat(2, 1)
    ref = sc(x, y)
    assert patch_model(prepared, ["symmetric_contraction"]).total == 2
    prepared.float()
    unpatch_model(prepared)
    restored = prepared.products[0].symmetric_contractions
    assert restored is sc
    assert {t.dtype for t in [*sc.parameters(), *sc.buffers()]} == {torch.float32}
    torch.testing.assert_close(sc(x.float(), y.float()), ref.float(), rtol=1e-5, atol=1e-6)


def test_a_traced_module_with_the_layout_but_other_code_is_left_with_a_warning(caplog):
    """Recognised by its parameters alone, the traced code is checked: one that computes
    something else is left as it is, with a warning naming it and saying what to do."""
    prepared = prepare(mace_model)(**SMALL)
    sc = prepared.products[1].symmetric_contractions
    for node in sc.graph.nodes:  # the traced code, changed: the output doubled
        if node.op == "output":
            with sc.graph.inserting_before(node):
                doubled = sc.graph.call_function(torch.mul, (node.args[0], 2.0))
            node.args = (doubled,)
    sc.recompile()
    with caplog.at_level(logging.WARNING, logger="cfm_plugins.fused"):
        report = patch_model(prepared, ["symmetric_contraction"])
    assert report.swapped["symmetric_contraction"] == ["products.0.symmetric_contractions"]
    assert [name for name, _ in report.left] == ["products.1.symmetric_contractions"]
    assert prepared.products[1].symmetric_contractions is sc
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "products.1.symmetric_contractions" in warnings[0]
    assert "mace.tools.compile.prepare" in warnings[0] and "before" in warnings[0]
