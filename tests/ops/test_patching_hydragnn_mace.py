"""The kernel table on HydraGNN's own MACE stack (HydraGNN from source: ``MACEStack``, its vendored
copy of mace's modules), built as HydraGNN's scripts build it (``create_model_config``) from the
example's interatomic-potential config (correlation 3, max_ell 2, 2 layers, float64).

The existing forms must find both kernels there: the vendored ``SymmetricContraction`` by its
layout, and the interaction block's ``conv_tp`` (HydraGNN's block calls it in e3nn's form and
scatters with torch_scatter itself, so the uvu form swaps the product alone). Fused equals stock to
1e-10 in energies, forces and the gradients of a force loss (double backward), and passes
gradcheck/gradgradcheck through the fused modules.
"""
from __future__ import annotations

import pytest

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

import torch  # noqa: E402

from cfm_plugins.ops.patching import find_modules, patch_model, unpatch_model  # noqa: E402
from tests.helpers.hydragnn_source import build_model, energy_forces, single_process_group  # noqa: E402

FUSED = {"FusedSymmetricContraction", "FusedConvTP"}


@pytest.fixture(scope="module")
def stack():
    """(model, graphs): the MACE stack (hidden 8) on 6 small EMT graphs with forces; float64."""
    import torch.distributed as dist
    from cfm_plugins.datasets.clusters import make_dataset

    dtype = torch.get_default_dtype()
    created = single_process_group()
    graphs = make_dataset(6, seed=2, max_atoms=30, forces=True)
    model, _ = build_model(graphs, hidden_dim=8)
    yield model, graphs
    torch.set_default_dtype(dtype)  # create_model_config set float64 (the config's precision)
    if created:
        dist.destroy_process_group()


def _force_loss_and_grads(model, batch):
    """A float64 energy + force MSE (HydraGNN's own casts its loss to float32) and its parameter gradients."""
    energy, forces = energy_forces(model, batch, create_graph=True)
    loss = (energy - batch.energy.double()).square().mean() + (forces - batch.forces.double()).square().mean()
    model.zero_grad()
    loss.backward()
    return energy.detach(), forces.detach(), loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters()
                                                             if p.grad is not None}


def test_fused_mace_stack_equals_stock_in_energies_forces_and_force_training_gradients(stack):
    from torch_geometric.data import Batch

    model, graphs = stack
    assert type(model.model).__name__ == "MACEStack" and next(model.parameters()).dtype == torch.float64
    batch = Batch.from_data_list(graphs[:4])
    e0, f0, l0, g0 = _force_loss_and_grads(model, batch)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    found = find_modules(model)
    report = patch_model(model)
    try:
        assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2}, report.describe()
        assert report.swapped == found
        assert all(n.startswith("model.graph_convs.") for names in report.swapped.values() for n in names)
        assert sum(type(m).__name__ in FUSED for m in model.modules()) == 4
        after = model.state_dict()  # the swap keeps every key and value: checkpoints load either way
        assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)

        e1, f1, l1, g1 = _force_loss_and_grads(model, batch)
        torch.testing.assert_close(e1, e0, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(f1, f0, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(l1, l0, rtol=1e-10, atol=0)
        assert g1.keys() == g0.keys() and any("symmetric_contractions" in k for k in g1)
        for k in g0:
            torch.testing.assert_close(g1[k], g0[k], rtol=1e-10, atol=1e-12, msg=k)
        # HydraGNN's own loss (float32 by its design) on the fused model
        data = batch.clone()
        for key in ("pos", "energy", "forces", "x"):
            data[key] = data[key].double()
        data.pos.requires_grad_(True)
        loss, tasks = model.energy_force_loss(model(data), data)
        assert torch.isfinite(loss) and len(tasks) == 3
    finally:
        assert unpatch_model(model).total == 4
    assert not FUSED & {type(m).__name__ for m in model.modules()}
    e2, f2, _, _ = _force_loss_and_grads(model, batch)
    torch.testing.assert_close(f2, f0, rtol=1e-12, atol=1e-14)


def test_double_backward_through_the_fused_modules_passes_gradcheck(stack):
    """gradcheck and gradgradcheck of the energy of one small graph in the positions and in a
    direction of the symmetric contraction's weights (force training differentiates twice)."""
    from torch.func import functional_call
    from torch_geometric.data import Batch

    model, graphs = stack
    graph = min(graphs, key=lambda g: g.num_nodes).clone()
    assert 3 <= graph.num_nodes <= 12, graph.num_nodes
    report = patch_model(model)
    try:
        assert report.total == 4
        name = next(k for k, _ in model.named_parameters() if "graph_convs.1." in k and k.endswith("weights_max"))
        w0 = dict(model.named_parameters())[name].detach()
        direction = torch.randn(w0.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        data = Batch.from_data_list([graph])
        data.x = data.x.double()

        def energy(pos, t):
            d = data.clone()
            d.pos = pos
            out = functional_call(model, {name: w0 + t * direction}, (d,))
            return out[0].sum()

        pos = data.pos.double().clone().requires_grad_(True)
        t = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(energy, (pos, t), eps=1e-6, atol=1e-6, rtol=1e-5)
        assert torch.autograd.gradgradcheck(energy, (pos, t), eps=1e-6, atol=1e-6, rtol=1e-5)
    finally:
        unpatch_model(model)
