"""patch_model/unpatch_model of the symmetric contraction on real MACE and ScaleShiftMACE models
(mace's constructors)."""

from __future__ import annotations

import mace  # noqa: F401  (before e3nn)
import numpy as np
import pytest
import torch
from ase.build import bulk
from e3nn import o3
from mace import data, modules, tools
from mace.tools import torch_geometric

from cfm_plugins.ops.patching import patch_model, unpatch_model
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

SC = ("symmetric_contraction",)


def build(cls_name: str):
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        block = modules.interaction_classes["RealAgnosticResidualInteractionBlock"]
        kw = dict(
            r_max=4.5,
            num_bessel=6,
            num_polynomial_cutoff=5,
            max_ell=3,
            interaction_cls=block,
            interaction_cls_first=block,
            num_interactions=2,
            num_elements=2,
            hidden_irreps=o3.Irreps("8x0e+8x1o"),
            MLP_irreps=o3.Irreps("8x0e"),
            atomic_energies=np.array([-4.4, -3.5]),
            avg_num_neighbors=10.0,
            atomic_numbers=[28, 29],
            correlation=3,
            gate=torch.nn.functional.silu,
        )
        if cls_name == "ScaleShiftMACE":
            model = modules.ScaleShiftMACE(**kw, atomic_inter_scale=0.8, atomic_inter_shift=0.1)
        else:
            model = modules.MACE(**kw)
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def batch():
    atoms = bulk("Ni", "fcc", a=3.52).repeat((2, 2, 2))
    atoms.symbols[::3] = "Cu"
    atoms.rattle(0.1, seed=3)
    z_table = tools.AtomicNumberTable([28, 29])
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ds = [
            data.AtomicData.from_config(data.config_from_atoms(atoms), z_table=z_table, cutoff=4.5)
        ]
        return next(iter(torch_geometric.dataloader.DataLoader(ds, batch_size=1)))
    finally:
        torch.set_default_dtype(prev)


def energy_forces(model, b):
    out = model(b.clone().to_dict(), training=False, compute_force=True)
    return out["energy"].detach(), out["forces"].detach()


@pytest.mark.parametrize("cls_name", ["MACE", "ScaleShiftMACE"])
def test_patch_matches_stock_and_unpatch_restores(cls_name):
    model = build(cls_name)
    b = batch()
    keys = list(model.state_dict())
    e0, f0 = energy_forces(model, b)
    stock = [m for m in model.modules() if type(m).__name__ == "SymmetricContraction"]
    assert patch_model(model, SC).total == 2 == len(stock)
    assert sum(isinstance(m, FusedSymmetricContraction) for m in model.modules()) == 2
    assert list(model.state_dict()) == keys
    e1, f1 = energy_forces(model, b)
    assert torch.allclose(e1, e0, rtol=1e-12, atol=1e-12)
    assert torch.allclose(f1, f0, rtol=1e-10, atol=1e-12)
    assert patch_model(model, SC).total == 0  # idempotent
    # a state_dict saved with the plugin loads into a stock model and vice versa
    other = build(cls_name)
    other.load_state_dict(model.state_dict())
    model.load_state_dict(other.state_dict())
    assert unpatch_model(model, SC).total == 2
    assert [type(m) for m in model.modules() if type(m).__name__ == "SymmetricContraction"] == [
        type(s) for s in stock
    ]
    assert not any(isinstance(m, FusedSymmetricContraction) for m in model.modules())
    e2, f2 = energy_forces(model, b)
    assert torch.equal(e2, e0) and torch.equal(f2, f0)
