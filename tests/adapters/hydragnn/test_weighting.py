"""binpack's loss_weighting=per_sample in HydraGNN 3.0: each head's loss gradient scaled by its
batch's graph or atom factor, HydraGNN's loss value and its validation untouched."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)

import hydragnn  # noqa: E402
import torch  # noqa: E402

from cfm_plugins.sampler import BinPackBatchSampler  # noqa: E402
from cfm_plugins.sampler.weighting import LossScale  # noqa: E402
from cfm_plugins_adapters.hydragnn.weighting import (
    TrainingScales,
    loss_from_config,
    loss_weightings,
)  # noqa: E402

HEADS = {
    "graph": {
        "num_sharedlayers": 1,
        "dim_sharedlayers": 8,
        "num_headlayers": 1,
        "dim_headlayers": [8],
    },
    "node": {"num_headlayers": 1, "dim_headlayers": [8], "type": "mlp"},
}


def two_head_model(loss="mse"):
    """A HydraGNN GIN stack with a graph head and a node head (task weights 1 and 3)."""
    torch.manual_seed(0)
    return hydragnn.models.GINStack(
        1,
        8,
        [1, 1],
        ["graph", "node"],
        HEADS,
        "relu",
        loss,
        False,
        loss_weights=[1.0, 3.0],
        num_conv_layers=1,
        num_nodes=6,
    )


def predictions(graphs=3, nodes=11):
    g = torch.Generator().manual_seed(2)
    pred = [
        torch.randn(graphs, 1, generator=g, requires_grad=True),
        torch.randn(nodes, 1, generator=g, requires_grad=True),
    ]
    value = torch.randn(graphs + nodes, generator=g)
    head_index = [torch.arange(graphs), torch.arange(graphs, graphs + nodes)]
    return pred, value, head_index


def grads(loss_fn, pred, value, head_index):
    for p in pred:
        p.grad = None
    total, tasks = loss_fn(pred, value, head_index)
    total.backward()
    return total.detach(), [t.detach() for t in tasks], [p.grad.clone() for p in pred]


def test_head_losses_scaled_by_the_batch_factor_value_unchanged():
    model = two_head_model()
    stock_loss = model.loss
    pred, value, head_index = predictions()
    ref_total, ref_tasks, ref_grads = grads(stock_loss, pred, value, head_index)

    scales = TrainingScales()
    scales.sampler = object()  # a training sampler that weighs per sample exists
    scales.wrap_loss(model)
    model.train()
    scales.current = LossScale(graphs=2.0, atoms=0.5)
    total, tasks, got = grads(model.loss, pred, value, head_index)
    assert total == ref_total and all(
        torch.equal(a, b) for a, b in zip(tasks, ref_tasks)
    )  # HydraGNN's values
    torch.testing.assert_close(
        got[0], 2.0 * ref_grads[0], rtol=1e-6, atol=0
    )  # graph head: graph factor
    torch.testing.assert_close(
        got[1], 0.5 * ref_grads[1], rtol=1e-6, atol=0
    )  # node head: atom factor

    # validation and test: eval() mode, or no training batch under way -> HydraGNN's own loss
    model.eval()
    assert all(
        torch.equal(a, b) for a, b in zip(grads(model.loss, pred, value, head_index)[2], ref_grads)
    )
    model.train()
    scales.current = None
    assert all(
        torch.equal(a, b) for a, b in zip(grads(model.loss, pred, value, head_index)[2], ref_grads)
    )


def test_a_loss_that_is_not_a_mean_is_refused():
    scales = TrainingScales()
    with pytest.raises(ValueError, match="is not a mean .mse or mae.; set loss_weighting=stock"):
        scales.wrap_loss(two_head_model("rmse"))
    assert loss_weightings("mse") == ("stock", "per_sample") and loss_weightings("rmse") == (
        "stock",
    )


def test_loader_tells_the_loss_each_batch_factor_and_forgets_it_after_the_pass():
    from torch_geometric.loader import DataLoader

    from cfm_plugins.datasets.clusters import make_dataset

    graphs = make_dataset(24, seed=4, max_atoms=60)
    atoms = np.array([g.num_nodes for g in graphs])
    sampler = BinPackBatchSampler(
        atoms, 120, rank=0, world_size=1, seed=0, atoms=atoms, loss_weighting="per_sample"
    )
    scales = TrainingScales()
    scales.sampler = sampler
    loader = scales.loader_class(DataLoader)(graphs, batch_sampler=sampler)
    expected = sampler.loss_scales("batch")
    seen = []
    for batch in loader:
        seen.append((scales.current.graphs, scales.current.atoms))
        # HydraGNN's per-rank mean: the factor is the batch's count against the epoch's mean count
        assert scales.current.graphs == pytest.approx(
            batch.num_graphs * len(expected) / len(graphs), rel=1e-12
        )
        assert scales.current.atoms == pytest.approx(
            batch.num_nodes * len(expected) / atoms.sum(), rel=1e-12
        )
    assert np.allclose(seen, expected[: len(seen)]) and len(seen) == len(expected)
    assert scales.current is None  # validation after the epoch sees HydraGNN's own loss


def test_the_loss_is_read_from_the_json_config(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"NeuralNetwork": {"Training": {"loss_function_type": "mae"}}}')
    assert loss_from_config(["python", "train.py", str(cfg)]) == "mae"
    assert loss_from_config(["python", "train.py"]) is None
