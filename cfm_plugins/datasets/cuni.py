"""A size-diverse CuNi training set with real EMT labels, in the extended XYZ form mace_run_train
reads.

Structures (all rattled, random Cu/Ni composition, :func:`make_structure`): bulk fcc cells of 4
to ``max_atoms`` atoms, (111) and (100) surface slabs with vacuum, and clusters. Labels
(:func:`label`) are ASE's EMT energies, forces and (bulk only) stress under the keys mace-torch
0.3.16 reads by default (``REF_energy``, ``REF_forces``, ``REF_stress``). The training file
starts with one ``config_type=IsolatedAtom`` entry per element, from which ``--E0s=isolated`` (or
the default E0s extraction) takes the atomic reference energies.

:func:`make_dataset` writes ``train.xyz``, ``valid.xyz``, ``test.xyz`` and ``cell512.xyz`` (a
512-atom cell for MD timings, :func:`make_cell512`); :func:`make_structures` returns labelled
``Atoms``. Deterministic for a seed. Needs ASE (the ``[mace]``, ``[nequip]`` or ``[test]``
extra). Command line: ``python examples/make_dataset.py --out DIR --n-train 200 --n-valid 20
--seed 0 [--max-atoms 500]``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from ase import Atoms
from ase.build import bulk, fcc100, fcc111
from ase.calculators.emt import EMT
from ase.cluster import Icosahedron, Octahedron
from ase.io import read, write

ELEMENTS = ("Cu", "Ni")
LATTICE = {"Cu": 3.61, "Ni": 3.52}  # fcc lattice constants (A), close to EMT's own minima
ENERGY_KEY, FORCES_KEY, STRESS_KEY = "REF_energy", "REF_forces", "REF_stress"
#: fraction of each structure kind in the generated sets
KIND_WEIGHTS = {"bulk_cubic": 0.35, "bulk_primitive": 0.25, "slab": 0.2, "cluster": 0.2}
HIST_EDGES = (1, 8, 16, 32, 64, 128, 256, 512, 1024)


# ----------------------------------------------------------------------------- helpers
def _composition(rng: np.random.Generator, n: int) -> tuple[np.ndarray, float]:
    """Random Cu/Ni symbols for n sites, with a random Ni fraction; returns (symbols, x_Ni)."""
    x_ni = float(rng.uniform(0.0, 1.0))
    symbols = np.where(rng.random(n) < x_ni, "Ni", "Cu")
    return symbols, x_ni


def _lattice_constant(x_ni: float) -> float:
    return (1 - x_ni) * LATTICE["Cu"] + x_ni * LATTICE["Ni"]


def _rattle(atoms: Atoms, rng: np.random.Generator, stdev: float) -> None:
    atoms.positions += rng.normal(0.0, stdev, size=atoms.positions.shape)


def _log_uniform_size(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _repeats(
    rng: np.random.Generator, target: int, per_cell: int, max_atoms: int
) -> tuple[int, int, int]:
    """Three repeat counts whose product times ``per_cell`` is near ``target`` and <= max_atoms."""
    cells = max(1, target // per_cell)
    reps = [1, 1, 1]
    # grow the smallest direction first (random among ties) until the cell count is reached
    while reps[0] * reps[1] * reps[2] < cells:
        smallest = min(reps)
        axis = int(rng.choice([i for i in range(3) if reps[i] == smallest]))
        reps[axis] += 1
        if reps[0] * reps[1] * reps[2] * per_cell > max_atoms:
            reps[axis] -= 1
            break
    return tuple(reps)


# ----------------------------------------------------------------------------- builders
def make_bulk(rng: np.random.Generator, max_atoms: int, cubic: bool) -> Atoms:
    """A strained, rattled fcc CuNi cell: repeats of the cubic (4 atoms) or primitive (1 atom)
    cell."""
    per_cell = 4 if cubic else 1
    target = _log_uniform_size(rng, 4, max_atoms)
    reps = _repeats(rng, target, per_cell, max_atoms)
    if (
        per_cell * reps[0] * reps[1] * reps[2] < 4
    ):  # a primitive cell of fewer than 4 atoms: grow it
        reps = (2, 2, 1)
    atoms = bulk("Cu", "fcc", a=1.0, cubic=cubic).repeat(reps)
    symbols, x_ni = _composition(rng, len(atoms))
    atoms.set_chemical_symbols(symbols)
    a = _lattice_constant(x_ni) * (1 + rng.uniform(-0.03, 0.03))  # volume strain
    strain = np.eye(3) + rng.uniform(-0.02, 0.02, size=(3, 3))  # small shear / uniaxial strain
    atoms.set_cell(atoms.cell.array * a, scale_atoms=True)
    atoms.set_cell(atoms.cell.array @ strain, scale_atoms=True)
    _rattle(atoms, rng, float(rng.uniform(0.02, 0.12)))
    atoms.info["config_type"] = "bulk_cubic" if cubic else "bulk_primitive"
    return atoms


def make_slab(rng: np.random.Generator, max_atoms: int) -> Atoms:
    """A (111) or (100) slab, periodic in x and y, with 6-9 A of vacuum on each side."""
    facet = "111" if rng.random() < 0.5 else "100"
    top = max(1, min(6, max_atoms // 4))  # at least 2x2 atoms per layer within max_atoms
    layers = int(rng.integers(min(3, top), top + 1))
    side_max = max(2, int(math.sqrt(max_atoms / layers)))
    target = _log_uniform_size(rng, 4 * layers, max(4 * layers + 1, max_atoms))
    side = int(np.clip(round(math.sqrt(target / layers)), 2, side_max))
    nx = side
    ny = int(np.clip(side + rng.integers(-1, 2), 2, max(2, max_atoms // (nx * layers))))
    builder = fcc111 if facet == "111" else fcc100
    symbols, x_ni = _composition(rng, nx * ny * layers)
    atoms = builder(
        "Cu",
        size=(nx, ny, layers),
        a=_lattice_constant(x_ni),
        vacuum=float(rng.uniform(6, 9)),
        orthogonal=(facet == "100"),
    )
    atoms.set_chemical_symbols(symbols)
    atoms.info.pop("adsorbate_info", None)  # a dict: extended XYZ cannot store it
    _rattle(atoms, rng, float(rng.uniform(0.02, 0.1)))
    atoms.info["config_type"] = f"slab{facet}"
    return atoms


def make_cluster(rng: np.random.Generator, max_atoms: int) -> Atoms:
    """A non-periodic cluster: an icosahedron, an octahedron or a spherical cut of bulk fcc."""
    shape = rng.choice(["icosahedron", "octahedron", "sphere"])
    a = _lattice_constant(float(rng.uniform(0, 1)))
    atoms = None
    if shape == "icosahedron":  # 13, 55, 147, 309, 561 atoms
        shells = [k for k in range(2, 7) if (10 * k**3 - 15 * k**2 + 11 * k - 3) // 3 <= max_atoms]
        if shells:
            atoms = Icosahedron("Cu", int(rng.choice(shells)), latticeconstant=a)
    elif shape == "octahedron":  # length 3..6, cutoff for truncated / cuboctahedral shapes
        options = [
            (n, c)
            for n in range(3, 8)
            for c in range(0, (n - 1) // 2 + 1)
            if len(Octahedron("Cu", n, c)) <= max_atoms
        ]
        if options:
            n, c = options[int(rng.integers(len(options)))]
            atoms = Octahedron("Cu", n, c, latticeconstant=a)
    if atoms is None:  # spherical cut of a rattled bulk block
        target = _log_uniform_size(rng, 4, max(5, max_atoms))
        radius = (3 * target / (4 * math.pi) * a**3 / 4) ** (1 / 3)
        reps = int(math.ceil(2 * radius / a)) + 1
        block = bulk("Cu", "fcc", a=a, cubic=True).repeat((reps, reps, reps))
        centre = block.cell.array.sum(axis=0) / 2 + rng.uniform(-0.5, 0.5, 3)
        dist = np.linalg.norm(block.positions - centre, axis=1)
        keep = np.argsort(dist, kind="stable")[: max(4, min(target, max_atoms))]
        atoms = block[np.sort(keep)]
        shape = "sphere"
    symbols, _ = _composition(rng, len(atoms))
    atoms.set_chemical_symbols(symbols)
    atoms.set_pbc(False)
    atoms.center(vacuum=6.0)  # a box for viewers; MACE and EMT ignore it when pbc is False
    _rattle(atoms, rng, float(rng.uniform(0.02, 0.1)))
    atoms.info["config_type"] = f"cluster_{shape}"
    return atoms


def isolated_atoms(symbols=ELEMENTS) -> list[Atoms]:
    """One ``config_type=IsolatedAtom`` entry per element (default Cu and Ni), labelled with EMT
    (for the E0s)."""
    out = []
    for symbol in symbols:
        atoms = Atoms(symbol, positions=[[10.0, 10.0, 10.0]], cell=[20.0, 20.0, 20.0], pbc=False)
        atoms.info["config_type"] = "IsolatedAtom"
        out.append(label(atoms, with_stress=False))
    return out


def make_cell512(seed: int = 0) -> Atoms:
    """A labelled, rattled 512-atom CuNi cell (8x8x8 primitive fcc, about 50% Ni) for MD."""
    rng = np.random.default_rng([seed, 512])
    atoms = bulk("Cu", "fcc", a=_lattice_constant(0.5)).repeat((8, 8, 8))
    atoms.set_chemical_symbols(np.where(rng.random(len(atoms)) < 0.5, "Ni", "Cu"))
    _rattle(atoms, rng, 0.05)
    atoms.info["config_type"] = "md_cell512"
    return label(atoms, with_stress=True)


# ----------------------------------------------------------------------------- labels and sets
def label(atoms: Atoms, with_stress: bool | None = None) -> Atoms:
    """Store EMT energy, forces (and stress, default: when fully periodic) under the REF_ keys.

    The keys are those mace-torch 0.3.16 reads by default: ``REF_energy`` (info), ``REF_forces``
    (arrays) and ``REF_stress`` (info, Voigt order, eV/A^3). mace rewrites the plain names
    ``energy``/``forces``/``stress`` (unsafe with ASE >= 3.23), so they are never used."""
    if with_stress is None:
        with_stress = bool(atoms.pbc.all())
    atoms.calc = EMT()
    atoms.info[ENERGY_KEY] = float(atoms.get_potential_energy())
    atoms.arrays[FORCES_KEY] = np.array(atoms.get_forces())
    if with_stress:
        atoms.info[STRESS_KEY] = np.array(atoms.get_stress(voigt=True))
    atoms.calc = None
    return atoms


#: the fewest atoms a structure of :func:`make_structure` has (a cubic fcc cell; the smallest
# cluster)
MIN_ATOMS = 4


def make_structure(rng: np.random.Generator, max_atoms: int = 500) -> Atoms:
    """One random, labelled structure of a random kind (see :data:`KIND_WEIGHTS`).

    - bulk fcc cells of 4 to ``max_atoms`` atoms: repeats of the cubic (4-atom) and the primitive
      (1-atom) cell, lattice constant from Vegard's law with a random strain (volume and shear);
    - (111) and (100) surface slabs with vacuum (periodic in x and y only);
    - clusters (not periodic): icosahedra, cuboctahedra, octahedra and random spherical cuts of
      bulk."""
    kinds, weights = zip(*KIND_WEIGHTS.items())
    kind = kinds[int(rng.choice(len(kinds), p=np.array(weights) / sum(weights)))]
    if kind == "bulk_cubic":
        atoms = make_bulk(rng, max_atoms, cubic=True)
    elif kind == "bulk_primitive":
        atoms = make_bulk(rng, max_atoms, cubic=False)
    elif kind == "slab":
        atoms = make_slab(rng, max_atoms)
    else:
        atoms = make_cluster(rng, max_atoms)
    return label(atoms)


def make_structures(n: int, seed: int, max_atoms: int = 500, progress=None) -> list[Atoms]:
    """``n`` labelled structures; the same list for the same (n, seed, max_atoms)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        out.append(make_structure(rng, max_atoms))
        if progress is not None:
            progress(i + 1, n)
    return out


def size_histogram(frames, edges=HIST_EDGES) -> list[tuple[str, int]]:
    """``("lo-hi", count)`` of the structures whose atom count falls in each range of ``edges``."""
    sizes = np.array([len(a) for a in frames])
    return [
        (f"{lo}-{hi - 1}", int(((sizes >= lo) & (sizes < hi)).sum()))
        for lo, hi in zip(edges[:-1], edges[1:])
    ]


def make_dataset(
    out,
    n_train: int = 200,
    n_valid: int = 20,
    n_test: int | None = None,
    seed: int = 0,
    max_atoms: int = 500,
    verbose: bool = False,
) -> dict[str, Path]:
    """Write train/valid/test (and cell512) extended XYZ files into ``out``; return their paths.

    The three splits come from independent random streams of ``seed``, so their contents do not
    depend on each other's sizes. ``train.xyz`` starts with the isolated-atom entries.
    """
    n_test = n_valid if n_test is None else n_test
    if max_atoms < MIN_ATOMS:
        raise ValueError(
            f"max_atoms={max_atoms}: the smallest structure made has {MIN_ATOMS} atoms (a cubic "
            f"fcc cell); give max_atoms >= {MIN_ATOMS}"
        )
    for name, n in (("n_train", n_train), ("n_valid", n_valid), ("n_test", n_test)):
        if n < 0:
            raise ValueError(f"{name}={n}: a number of structures must be >= 0")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def progress(name):
        def report(i, n):
            if verbose and (i == n or i % max(1, n // 4) == 0):
                print(f"  {name}: {i}/{n}", flush=True)

        return report

    paths = {}
    splits = {"train": (n_train, 0), "valid": (n_valid, 1), "test": (n_test, 2)}
    for name, (n, stream) in splits.items():
        frames = make_structures(
            n, seed=[seed, stream], max_atoms=max_atoms, progress=progress(name)
        )
        if name == "train":
            frames = isolated_atoms() + frames
        paths[name] = out / f"{name}.xyz"
        write(paths[name], frames, format="extxyz")
    paths["cell512"] = out / "cell512.xyz"
    write(paths["cell512"], make_cell512(seed), format="extxyz")
    return paths


def summary(paths: dict[str, Path]) -> str:
    """A few lines per file of :func:`make_dataset`: frames, atom counts, kinds, a size
    histogram."""
    lines = []
    for name, path in paths.items():
        frames = (
            read(path, index=":") if Path(path).stat().st_size else []
        )  # a split of 0 structures
        sizes = [len(a) for a in frames if a.info.get("config_type") != "IsolatedAtom"]
        kinds: dict[str, int] = {}
        for a in frames:
            kinds[a.info.get("config_type", "?")] = kinds.get(a.info.get("config_type", "?"), 0) + 1
        atoms = (
            f"atoms {min(sizes)}..{max(sizes)} (total {sum(sizes)})" if sizes else "no structures"
        )
        lines.append(f"{name}: {len(frames)} frames, {atoms} -> {path}")
        if kinds:
            lines.append("  kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        if len(sizes) > 1:
            lines.append(
                "  atoms histogram: "
                + ", ".join(
                    f"{b}: {c}"
                    for b, c in size_histogram(
                        [a for a in frames if a.info.get("config_type") != "IsolatedAtom"]
                    )
                    if c
                )
            )
    return "\n".join(lines)
