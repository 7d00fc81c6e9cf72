"""A HydraGNN stack holding MACE-style modules (an e3nn uvu tensor product + scatter + a vendored
copy of MACE's ``SymmetricContraction``), what HydraGNN's later stacks carry. Import only where
HydraGNN, torch_geometric and mace are installed."""

from __future__ import annotations

import importlib.util

import hydragnn
import mace.modules  # noqa: F401  (before e3nn: mace sets what e3nn 0.4.4 needs on new torch)
import torch
from e3nn import o3

CHANNELS = 4


def vendored_symmetric_contraction_class():
    """mace's SymmetricContraction source loaded as another module: what a vendored copy is."""
    import mace.modules.symmetric_contraction as sc

    spec = importlib.util.spec_from_file_location(
        "vendored_mace.symmetric_contraction", sc.__file__
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.SymmetricContraction is not sc.SymmetricContraction
    return mod.SymmetricContraction


class MaceStyleConv(torch.nn.Module):
    """One MACE-style layer for HydraGNN's conv interface ``conv(x, pos, edge_index) -> (x,
    pos)``."""

    def __init__(self, input_dim, output_dim, sc_class):
        super().__init__()
        c = CHANNELS
        self.embed = torch.nn.Linear(input_dim, c)
        self.irreps_sh = o3.Irreps("1x0e+1x1o")
        irreps_mid = o3.Irreps(f"{c}x0e+{c}x1o")
        self.conv_tp = o3.TensorProduct(
            o3.Irreps(f"{c}x0e"),
            self.irreps_sh,
            irreps_mid,
            [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True)],
            shared_weights=False,
            internal_weights=False,
        )
        self.radial = torch.nn.Sequential(
            torch.nn.Linear(1, 8), torch.nn.SiLU(), torch.nn.Linear(8, self.conv_tp.weight_numel)
        )
        self.symmetric_contractions = sc_class(
            irreps_in=irreps_mid, irreps_out=o3.Irreps(f"{c}x0e"), correlation=2, num_elements=1
        )
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


def build(sc_class):
    torch.manual_seed(0)
    heads = {
        "graph": {
            "num_sharedlayers": 1,
            "dim_sharedlayers": 8,
            "num_headlayers": 1,
            "dim_headlayers": [8],
        }
    }
    model = MaceStyleStack(
        sc_class,
        1,
        8,
        [1],
        ["graph"],
        heads,
        "relu",
        "mse",
        False,
        loss_weights=[1.0],
        num_conv_layers=2,
        num_nodes=None,
    )
    return model.eval()


def batch():
    from torch_geometric.data import Batch, Data

    g = torch.Generator().manual_seed(1)
    graphs = []
    for n in (5, 9):
        pos = torch.randn(n, 3, generator=g) * 1.5
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        keep = i != j
        graphs.append(
            Data(
                x=torch.randint(1, 30, (n, 1), generator=g).double(),
                pos=pos,
                edge_index=torch.stack([i[keep], j[keep]]),
                y=torch.zeros(1),
            )
        )
    return Batch.from_data_list(graphs)
