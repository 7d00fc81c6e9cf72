"""The fused kernels in HydraGNN's own MACE stack (HydraGNN from source: ``MACEStack``, its vendored
copy of mace's modules), built as HydraGNN's scripts build it (``create_model_config``) from the
example's interatomic-potential config (correlation 3, max_ell 2, 2 layers, float64).

The kernel table's built-in forms find both kernels there: the vendored ``SymmetricContraction``
by its layout, and the interaction block's ``conv_tp`` (called in e3nn's form: the product alone).
The adapter's form (:mod:`cfm_plugins_adapters.hydragnn.interaction`, what ``fused`` uses under
cfm-run) swaps the block whole, product and scatter fused. Either way fused equals stock to 1e-10
in energies, forces and the gradients of a force loss (double backward), and the adapter's
passes gradcheck/gradgradcheck; a block computing something else keeps the generic form.
"""

from __future__ import annotations

import pytest

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

import torch  # noqa: E402

from cfm_plugins.ops import kernel_table  # noqa: E402
from cfm_plugins.ops.patching import find_modules, patch_model, unpatch_model  # noqa: E402
from cfm_plugins_adapters.hydragnn import interaction  # noqa: E402
from tests.helpers.hydragnn_source import build_model, energy_forces, single_process_group  # noqa: E402

FUSED = {"FusedSymmetricContraction", "FusedConvTP"}
BLOCKS = [f"model.graph_convs.{i}.module_1" for i in (0, 1)]


@pytest.fixture
def block_form():
    """The adapter's form registered first in ``conv_tp`` for the test (as cfm-run does with
    fused)."""
    saved = kernel_table.kernels()["conv_tp"]
    interaction.register_form()
    yield
    kernel_table.register_kernel(saved, replace=True)


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
    """A float64 energy + force MSE (HydraGNN's own casts its loss to float32) and its parameter
    gradients."""
    energy, forces = energy_forces(model, batch, create_graph=True)
    loss = (energy - batch.energy.double()).square().mean() + (
        forces - batch.forces.double()
    ).square().mean()
    model.zero_grad()
    loss.backward()
    return (
        energy.detach(),
        forces.detach(),
        loss.detach(),
        {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None},
    )


def test_built_in_forms_fuse_the_mace_stack_exactly(stack):
    """Without the adapter's form: the symmetric contractions and the products alone."""
    from torch_geometric.data import Batch

    model, graphs = stack
    assert not any(f.name.startswith("HydraGNN") for f in kernel_table.kernels()["conv_tp"].forms)
    assert (
        type(model.model).__name__ == "MACEStack"
        and next(model.parameters()).dtype == torch.float64
    )
    batch = Batch.from_data_list(graphs[:4])
    e0, f0, l0, g0 = _force_loss_and_grads(model, batch)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    found = find_modules(model)
    report = patch_model(model)
    try:
        assert report.counts == {  # its blocks' skip connection is a Linear: no skip_tp
            "symmetric_contraction": 2,
            "conv_tp": 2,
            "skip_tp": 0,
        }, report.describe()
        assert report.swapped == found
        assert all(
            n.startswith("model.graph_convs.") for names in report.swapped.values() for n in names
        )
        assert sum(type(m).__name__ in FUSED for m in model.modules()) == 4
        after = (
            model.state_dict()
        )  # the swap keeps every key and value: checkpoints load either way
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


def test_adapter_form_fuses_the_interaction_blocks_whole_and_exactly(stack, block_form):
    from torch_geometric.data import Batch

    model, graphs = stack
    batch = Batch.from_data_list(graphs[:4])
    e0, f0, l0, g0 = _force_loss_and_grads(model, batch)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = patch_model(model)
    try:
        assert report.swapped["conv_tp"] == BLOCKS, report.describe()
        assert report.counts["symmetric_contraction"] == 2
        blocks = [m for m in model.modules() if isinstance(m, interaction.FusedInteractionBlock)]
        assert len(blocks) == 2 and all(type(b.conv_tp).__name__ == "FusedConvTP" for b in blocks)
        after = model.state_dict()
        assert after.keys() == state.keys() and all(torch.equal(after[k], state[k]) for k in state)
        e1, f1, l1, g1 = _force_loss_and_grads(model, batch)
        torch.testing.assert_close(e1, e0, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(f1, f0, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(l1, l0, rtol=1e-10, atol=0)
        assert g1.keys() == g0.keys()
        for k in g0:
            torch.testing.assert_close(g1[k], g0[k], rtol=1e-10, atol=1e-12, msg=k)
        assert patch_model(model).total == 0  # already fused: nothing more
    finally:
        assert unpatch_model(model).swapped["conv_tp"] == BLOCKS
    assert not any(isinstance(m, interaction.FusedInteractionBlock) for m in model.modules())
    assert not FUSED & {type(m).__name__ for m in model.modules()}
    torch.testing.assert_close(_force_loss_and_grads(model, batch)[1], f0, rtol=1e-12, atol=1e-14)


def test_a_block_computing_something_else_keeps_the_product_alone_fused(stack, block_form, caplog):
    """The fused block re-states HydraGNN's forward: a block class whose forward differs (here its
    messages doubled) fails the form's check and only its conv_tp is swapped."""
    model, _ = stack
    block = model.model.graph_convs[0].module_1
    stock_cls = type(block)

    class Changed(stock_cls):
        def forward(self, *args):
            message, sc = super().forward(*args)
            return 2 * message, sc

    # HydraGNN's class, as another version of it would be
    Changed.__module__, Changed.__name__ = stock_cls.__module__, stock_cls.__name__
    block.__class__ = Changed
    try:
        report = patch_model(model, ("conv_tp",))
        assert report.swapped["conv_tp"] == ["model.graph_convs.0.module_1.conv_tp", BLOCKS[1]]
        assert "computes something the fused block does not" in caplog.text
    finally:
        unpatch_model(model)
        block.__class__ = stock_cls
    assert not FUSED & {type(m).__name__ for m in model.modules()}


def test_double_backward_through_the_fused_modules_passes_gradcheck(stack, block_form):
    """gradcheck and gradgradcheck of the energy of one small graph in the positions and in a
    direction of the symmetric contraction's weights (force training differentiates twice), with
    the forms training uses (the adapter's block form)."""
    from torch.func import functional_call
    from torch_geometric.data import Batch

    model, graphs = stack
    graph = min(graphs, key=lambda g: g.num_nodes).clone()
    assert 3 <= graph.num_nodes <= 12, graph.num_nodes
    report = patch_model(model)
    try:
        assert report.swapped["conv_tp"] == BLOCKS and report.total == 4
        name = next(
            k
            for k, _ in model.named_parameters()
            if "graph_convs.1." in k and k.endswith("weights_max")
        )
        w0 = dict(model.named_parameters())[name].detach()
        direction = torch.randn(
            w0.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
        )
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
