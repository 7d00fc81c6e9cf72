"""binpack's loss_weighting=per_sample in nequip-train: each term of nequip's weighted-sum loss
scaled by the step's graph or atom factor; nequip's logged value and its validation metrics
untouched."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

import torch  # noqa: E402

from cfm_plugins.sampler.weighting import LossScale  # noqa: E402
from cfm_plugins_adapters.nequip.weighting import LossWeighting, loss_terms, loss_weightings  # noqa: E402
from tests.helpers.nequip_models import tiny_batch  # noqa: E402


def energy_force_loss(**kwargs):
    from nequip.train import EnergyForceLoss

    return EnergyForceLoss(coeffs={"total_energy": 1.0, "forces": 3.0}, **kwargs)


def preds_and_target():
    from nequip.data import AtomicDataDict

    batch = dict(tiny_batch())
    g = torch.Generator().manual_seed(5)
    n_graphs = int(batch[AtomicDataDict.NUM_NODES_KEY].shape[0])
    target = dict(
        batch,
        total_energy=torch.randn(n_graphs, 1, generator=g, dtype=torch.float64),
        forces=torch.randn(batch["pos"].shape, generator=g, dtype=torch.float64),
    )
    preds = dict(
        batch,
        total_energy=torch.randn(n_graphs, 1, generator=g, dtype=torch.float64, requires_grad=True),
        forces=torch.randn(
            batch["pos"].shape, generator=g, dtype=torch.float64, requires_grad=True
        ),
    )
    return preds, target


def weighted_sum_grads(manager, preds, target):
    for k in ("total_energy", "forces"):
        preds[k].grad = None
    out = manager(preds, target, prefix="train_loss_step/")
    value = out["train_loss_step/weighted_sum"]
    value.backward()
    return value.detach(), preds["total_energy"].grad.clone(), preds["forces"].grad.clone()


def test_terms_scaled_by_the_step_factors_value_unchanged():
    manager = energy_force_loss()
    kinds, reason = loss_terms(manager)
    assert reason is None and kinds == {"per_atom_energy_mse": "graphs", "forces_mse": "atoms"}
    preds, target = preds_and_target()
    ref_value, ref_e, ref_f = weighted_sum_grads(manager, preds, target)

    callback = LossWeighting()
    callback._wrap(manager, kinds)
    callback.current = LossScale(graphs=2.5, atoms=0.4)
    value, grad_e, grad_f = weighted_sum_grads(manager, preds, target)
    assert value == ref_value  # nequip logs its own loss
    torch.testing.assert_close(grad_e, 2.5 * ref_e, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad_f, 0.4 * ref_f, rtol=1e-12, atol=0)
    callback.current = None  # outside a training batch (the hook clears it at on_train_batch_end)
    _, grad_e, grad_f = weighted_sum_grads(manager, preds, target)
    assert torch.equal(grad_e, ref_e) and torch.equal(grad_f, ref_f)


def test_losses_that_are_not_plain_means_cannot_be_reweighted():
    from nequip.train import EnergyForceMetrics

    class Module:
        loss = None

    module = Module()
    module.loss = energy_force_loss()
    assert loss_weightings(module)[1] == ("stock", "per_sample")
    # the RMSE metrics (roots of means) in a weighted sum
    module.loss = EnergyForceMetrics(coeffs={"total_energy_rmse": 1.0, "forces_rmse": 1.0})
    description, weightings = loss_weightings(module)
    assert (
        weightings == ("stock",)
        and "not a mean" in description
        and "RootMeanSquaredError" in description
    )
    # per-type forces: an average of per-type means, a weighting of its own
    module.loss = energy_force_loss(
        per_type_forces_coeffs={"Cu": 1.0, "Ni": 2.0}, type_names=["Cu", "Ni"]
    )
    description, weightings = loss_weightings(module)
    assert weightings == ("stock",) and "per_type" in description
