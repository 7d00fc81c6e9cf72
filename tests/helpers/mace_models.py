"""Small MACE models and modules built with mace's own constructors (weights perturbed), and CuNi
structures to evaluate them on. Import only where mace is installed."""

from __future__ import annotations

import copy
import functools

import mace  # noqa: F401  (before e3nn: sets what e3nn 0.4.4 needs on new torch)
import numpy as np
import torch
from ase.build import bulk
from e3nn import o3
from mace import data, tools
from mace.modules.symmetric_contraction import SymmetricContraction

from cfm_plugins.datasets import cuni
from cfm_plugins.testing import mace_conv_tp, mace_model


def build_model(seed: int, dtype=torch.float64) -> torch.nn.Module:
    """A small ScaleShiftMACE (16x0e+16x1o, correlation 3, r_max 5, 2 interactions), weights
    perturbed."""
    return mace_model("16x0e+16x1o", r_max=5.0, num_bessel=8, dtype=dtype, seed=seed)


def structures():
    """Periodic CuNi cells (cubic and primitive repeats, strained), a slab and a non-periodic
    cluster."""
    rng = np.random.default_rng(11)
    out = [
        cuni.make_bulk(rng, 40, cubic=True),
        cuni.make_bulk(rng, 30, cubic=False),
        cuni.make_slab(rng, 36),
        cuni.make_cluster(rng, 40),
    ]
    odd = bulk("Ni", "fcc", a=3.55).repeat((2, 2, 2))  # a hand-made periodic cell too
    odd.symbols[::3] = "Cu"
    odd.rattle(0.08, seed=2)
    out.append(odd)
    assert not out[3].pbc.any() and out[0].pbc.all()
    return out


def random_walk(atoms, steps: int, step_size: float, seed: int = 0):
    """Positions of ``atoms`` moved a little at each step (a random walk in A, not wrapped into the
    cell): successive MD-like structures."""
    rng = np.random.default_rng(seed)
    positions = atoms.positions.copy()
    for _ in range(steps):
        positions = positions + rng.normal(scale=step_size, size=positions.shape)
        yield positions


def mace_tp(hidden: str, lmax: int, channels: int, dtype=torch.float64) -> o3.TensorProduct:
    """The conv_tp of a mace RealAgnostic*InteractionBlock (see
    cfm_plugins.testing.mace_conv_tp)."""
    return mace_conv_tp(hidden, lmax, channels, dtype)


SH = (
    "0e+1o+2e+3o"  # MACE's node features before the product: (lmax+1)^2 = 16 components per channel
)


@functools.cache
def _mace_module(hidden: str, mul: int, corr: int, elements: int, reduced: bool, seed: int = 0):
    torch.manual_seed(seed)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        irreps_in = o3.Irreps("+".join(f"{mul}x{ir}" for ir in SH.split("+")))
        irreps_out = o3.Irreps("+".join(f"{mul}x{ir}" for ir in hidden.split("+")))
        sc = SymmetricContraction(
            irreps_in, irreps_out, corr, num_elements=elements, use_reduced_cg=reduced
        )
    finally:
        torch.set_default_dtype(prev)
    with torch.no_grad():
        for p in sc.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p))
    return sc


def mace_module(hidden, mul, corr, elements, reduced, dtype=torch.float64):
    """A fresh copy (tests may change dtype/weights) of a cached mace SymmetricContraction, weights
    randomized with torch.randn (mace leaves some at structured values)."""
    return copy.deepcopy(_mace_module(hidden, mul, corr, elements, reduced)).to(dtype)


# -- MACE models with chosen interaction blocks (the conv TP tests and the kernel table's toy
# kernel)
BLOCKS = [
    "RealAgnosticResidualInteractionBlock",
    "RealAgnosticInteractionBlock",
    "RealAgnosticDensityResidualInteractionBlock",
]


def tiny_mace(kind: str, block: str, first: str, seed: int = 0) -> torch.nn.Module:
    """A 2-layer MACE or ScaleShiftMACE (8x0e+8x1o, max_ell 3, correlation 2, Ni/Cu) with the given
    interaction blocks, float64, every weight perturbed (no exact zeros)."""
    return mace_model(
        "8x0e+8x1o",
        kind=kind,
        interaction=block,
        first=first,
        r_max=4.5,
        num_bessel=6,
        correlation=2,
        mlp="8x0e",
        avg_num_neighbors=10.0,
        seed=seed,
    )


def mace_batch(seed: int = 0):
    """A CuNi fcc cell and one isolated atom, as a mace batch dict (float64)."""
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 1))
    rng = np.random.default_rng(seed)
    atoms.symbols[rng.choice(len(atoms), len(atoms) // 3, replace=False)] = "Ni"
    atoms.rattle(0.1, seed=seed)
    isolated = bulk("Cu", "fcc", a=3.6, cubic=True)[:1]  # one atom in a big box: no neighbours
    isolated.set_cell([20, 20, 20])
    z_table = tools.AtomicNumberTable([28, 29])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        items = [
            data.AtomicData.from_config(data.config_from_atoms(a), z_table=z_table, cutoff=4.5)
            for a in (atoms, isolated)
        ]
    finally:
        torch.set_default_dtype(previous)
    loader = tools.torch_geometric.dataloader.DataLoader(items, batch_size=2, shuffle=False)
    return next(iter(loader)).to_dict()


def run_mace(model, b):
    """Energies, forces and stress of a training-mode forward."""
    b = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
    out = model(b, training=True, compute_force=True, compute_stress=True)
    return out["energy"].detach(), out["forces"].detach(), out["stress"].detach()


def mace_cluster_batch(n_atoms: int = 5, seed: int = 0, cutoff: float = 4.5):
    """A small non-periodic CuNi cluster (atoms ~2.5 A apart, every pair within ``cutoff``) as a
    mace batch dict (float64): few nodes and edges, for the Triton interpreter (~1 ms per tile
    operation per program)."""
    from ase import Atoms

    rng = np.random.default_rng(seed)
    base = np.array(
        [
            [0, 0, 0],
            [2.5, 0, 0],
            [0, 2.5, 0],
            [0, 0, 2.5],
            [2.5, 2.5, 0],
            [2.5, 0, 2.5],
            [0, 2.5, 2.5],
            [2.5, 2.5, 2.5],
        ],
        dtype=float,
    )[:n_atoms]
    atoms = Atoms(
        ["Cu" if i % 3 else "Ni" for i in range(n_atoms)],
        positions=base + rng.normal(0, 0.1, base.shape),
    )
    z_table = tools.AtomicNumberTable([28, 29])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        item = data.AtomicData.from_config(
            data.config_from_atoms(atoms), z_table=z_table, cutoff=cutoff
        )
    finally:
        torch.set_default_dtype(previous)
    loader = tools.torch_geometric.dataloader.DataLoader([item], batch_size=1, shuffle=False)
    return next(iter(loader)).to_dict()
