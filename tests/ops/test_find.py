"""fused with HydraGNN: MACE-style modules are found by structure, not by class.

HydraGNN's later stacks carry a vendored copy of MACE's ``SymmetricContraction``; the test builds
such a copy (mace's own source loaded as another module, so its class is not mace's) inside a
HydraGNN stack (a ``hydragnn.models.Base`` subclass with a MACE-style conv: e3nn uvu tensor
product + scatter + symmetric contraction) and checks that the swap finds and fuses them exactly.
"""
from __future__ import annotations

import importlib.util
import logging
import types

import pytest

pytest.importorskip("hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)")
pytest.importorskip("mace", reason="mace-torch is not installed (the [mace] extra)")

import mace.modules  # noqa: E402,F401  (before e3nn: mace sets what e3nn 0.4.4 needs on new torch)
import torch  # noqa: E402
from e3nn import o3  # noqa: E402

import hydragnn  # noqa: E402
from cfm_plugins.ops.find import find_by_structure, patch_by_structure, unpatch_by_structure  # noqa: E402
from cfm_plugins.ops.patching import patch_model  # noqa: E402

CHANNELS = 4


def vendored_symmetric_contraction_class():
    """mace's SymmetricContraction source loaded as another module: what a vendored copy is."""
    import mace.modules.symmetric_contraction as sc

    spec = importlib.util.spec_from_file_location("vendored_mace.symmetric_contraction", sc.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.SymmetricContraction is not sc.SymmetricContraction
    return mod.SymmetricContraction


class MaceStyleConv(torch.nn.Module):
    """One MACE-style layer for HydraGNN's conv interface ``conv(x, pos, edge_index) -> (x, pos)``."""

    def __init__(self, input_dim, output_dim, sc_class):
        super().__init__()
        c = CHANNELS
        self.embed = torch.nn.Linear(input_dim, c)
        self.irreps_sh = o3.Irreps("1x0e+1x1o")
        irreps_mid = o3.Irreps(f"{c}x0e+{c}x1o")
        self.conv_tp = o3.TensorProduct(
            o3.Irreps(f"{c}x0e"), self.irreps_sh, irreps_mid,
            [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True)], shared_weights=False, internal_weights=False)
        self.radial = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.SiLU(),
                                          torch.nn.Linear(8, self.conv_tp.weight_numel))
        self.symmetric_contractions = sc_class(irreps_in=irreps_mid, irreps_out=o3.Irreps(f"{c}x0e"),
                                               correlation=2, num_elements=1)
        self.out = torch.nn.Linear(c, output_dim)

    def forward(self, x, pos, edge_index):
        src, dst = edge_index
        vec = pos[src] - pos[dst]
        sh = o3.spherical_harmonics(self.irreps_sh, vec, normalize=True)
        w = self.radial(vec.norm(dim=1, keepdim=True))
        msg = self.conv_tp(self.embed(x)[src], sh, w)
        node = torch.zeros(x.shape[0], msg.shape[1], dtype=msg.dtype).index_add_(0, dst, msg)
        c = CHANNELS  # mace's [nodes, channels, (l,m)] layout for the contraction
        feats = torch.cat([node[:, :c].unsqueeze(-1), node[:, c:].reshape(-1, c, 3)], dim=-1)
        y = torch.ones(x.shape[0], 1, dtype=x.dtype)
        return self.out(self.symmetric_contractions(feats, y)), pos


class MaceStyleStack(hydragnn.models.Base):
    """A HydraGNN stack (Base: heads, losses, BatchNorm between convs) holding MACE-style layers."""

    def __init__(self, sc_class, *args, **kwargs):
        self._sc_class = sc_class
        super().__init__(*args, **kwargs)

    def get_conv(self, input_dim, output_dim):
        return MaceStyleConv(input_dim, output_dim, self._sc_class)


@pytest.fixture
def f64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def build(sc_class):
    torch.manual_seed(0)
    heads = {"graph": {"num_sharedlayers": 1, "dim_sharedlayers": 8, "num_headlayers": 1, "dim_headlayers": [8]}}
    model = MaceStyleStack(sc_class, 1, 8, [1], ["graph"], heads, "relu", "mse", False,
                           loss_weights=[1.0], num_conv_layers=2, num_nodes=None)
    return model.eval()


def batch():
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(1)
    graphs = []
    for n in (5, 9):
        pos = torch.randn(n, 3, generator=g) * 1.5
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        keep = i != j
        graphs.append(Data(x=torch.randint(1, 30, (n, 1), generator=g).double(), pos=pos,
                           edge_index=torch.stack([i[keep], j[keep]]), y=torch.zeros(1)))
    return Batch.from_data_list(graphs)


def test_structural_finder_fuses_a_hydragnn_model_holding_mace_style_modules(f64):
    model = build(vendored_symmetric_contraction_class())
    data = batch()
    ref = model(data)[0]
    ref.sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    keys = {k: v.clone() for k, v in model.state_dict().items()}

    found = find_by_structure(model)
    assert len(found["symmetric_contraction"]) == 2 and len(found["conv_tp"]) == 2, found
    # the class-based swap misses the vendored contraction: that is why the finder exists
    assert patch_model(model, ("symmetric_contraction",)).total == 0

    report = patch_by_structure(model)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2}
    names = {type(m).__name__ for m in model.modules()}
    assert {"FusedSymmetricContraction", "FusedConvTP"} <= names
    state = model.state_dict()
    assert state.keys() == keys.keys() and all(torch.equal(state[k], keys[k]) for k in keys)

    out = model(data)[0]
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    out.sum().backward()
    for k, p in model.named_parameters():
        if k in ref_grads:
            torch.testing.assert_close(p.grad, ref_grads[k], rtol=1e-9, atol=1e-12, msg=k)

    assert unpatch_by_structure(model).total == 4
    assert not {"FusedSymmetricContraction", "FusedConvTP"} & {type(m).__name__ for m in model.modules()}
    torch.testing.assert_close(model(data)[0], ref, rtol=1e-12, atol=1e-14)


def test_adapter_seam_swaps_by_structure_or_says_once_which_stack_has_nothing(f64, caplog):
    from cfm_plugins.config import Config
    from cfm_plugins.manager import create_manager
    from cfm_plugins_adapters.hydragnn.seams import make_get_distributed_model

    config = Config(enabled=["hydragnn", "fused"])
    create_manager(config)  # the declared defaults (fused_kernels: both kernels)
    session = types.SimpleNamespace(config=config, dist=None)
    stock_wrap = hydragnn.utils.distributed.get_distributed_model  # no process group: returns the model
    caplog.set_level(logging.INFO, logger="cfm_plugins.hydragnn")

    model = make_get_distributed_model(stock_wrap, session, None)(build(vendored_symmetric_contraction_class()))
    assert "found by structure in the HydraGNN MaceStyleStack" in caplog.text
    assert sum(type(m).__name__ == "FusedSymmetricContraction" for m in model.modules()) == 2

    caplog.clear()
    gin = hydragnn.models.GINStack(1, 8, [1], ["graph"], {"graph": {"num_sharedlayers": 1, "dim_sharedlayers": 8,
                                                                    "num_headlayers": 1, "dim_headlayers": [8]}},
                                   "relu", "mse", False, loss_weights=[1.0], num_conv_layers=2)
    seam = make_get_distributed_model(stock_wrap, session, None)
    before = {k: v.clone() for k, v in gin.state_dict().items()}
    seam(gin)
    seam(gin)  # said once only
    msgs = [r.getMessage() for r in caplog.records if "has no MACE-style" in r.getMessage()]
    assert len(msgs) == 1 and "GINStack" in msgs[0] and "nothing was swapped" in msgs[0]
    assert all(torch.equal(gin.state_dict()[k], v) for k, v in before.items())
