"""A tiny NequIP GNN (nequip's own constructor) and a CuNi batch for it. Import only where nequip is
installed (.venv-nequip)."""

from __future__ import annotations

import numpy as np
import torch


def tiny_model(
    l_max: int = 2,
    layers: int = 2,
    features: int = 8,
    radial_depth: int = 1,
    dtype: str = "float64",
):
    from nequip.model import NequIPGNNModel
    from nequip.utils.global_state import set_global_state

    set_global_state()
    return NequIPGNNModel(
        seed=3,
        model_dtype=dtype,
        type_names=["Cu", "Ni"],
        r_max=4.0,
        l_max=l_max,
        num_layers=layers,
        num_features=features,
        radial_mlp_depth=radial_depth,
        radial_mlp_width=16,
        avg_num_neighbors=12.0,
        per_type_energy_shifts={"Cu": -3.0, "Ni": -4.0},
        per_type_energy_scales={"Cu": 1.0, "Ni": 1.2},
    )


def tiny_batch(seed: int = 0):
    from ase.build import bulk
    from nequip.data import AtomicDataDict
    from nequip.data.ase import from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper, NeighborListTransform

    rng = np.random.default_rng(seed)
    frames = []
    for reps in ((2, 1, 1), (2, 2, 1)):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(reps)
        sym = np.array(a.get_chemical_symbols())
        sym[rng.random(len(a)) < 0.4] = "Ni"
        a.set_chemical_symbols(sym)
        a.rattle(0.1, seed=int(rng.integers(1000)))
        d = from_ase(a)
        d = ChemicalSpeciesToAtomTypeMapper(
            model_type_names=["Cu", "Ni"],
            chemical_species_to_atom_type_map={"Cu": "Cu", "Ni": "Ni"},
        )(d)
        frames.append(NeighborListTransform(r_max=4.0)(d))
    return AtomicDataDict.batched_from_list(frames)


def run_model(model, batch):
    out = model(dict(batch))
    e, f = out["total_energy"], out["forces"]
    loss = e.square().sum() + f.square().sum()  # forces inside the loss: a double backward
    grads = torch.autograd.grad(
        loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True
    )
    return e.detach(), f.detach(), grads


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))
