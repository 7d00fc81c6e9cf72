"""A patched MACE model leaves Python with its fused kernels: TorchScript (and LAMMPS through
``mace.cli.create_lammps_model``), torch.export + AOTInductor, torch.compile; opcheck of the
``cfm::`` operators. Everything is compared to the stock model in float64 to 1e-10."""

from __future__ import annotations

import copy
import subprocess
import sys
import zipfile
from pathlib import Path

import mace  # noqa: F401  (before e3nn)
import numpy as np
import pytest
import torch
from e3nn.util import jit
from mace import data as mace_data
from mace.tools import torch_geometric, utils

from cfm_plugins.datasets import cuni
from cfm_plugins.ops import _backend
from cfm_plugins.ops.patching import patch_model
from tests.helpers import clean_env
from tests.helpers.mace_models import build_model

pytestmark = pytest.mark.skipif(
    not _backend.operators_available(), reason="the compiled cfm:: operator library is not built"
)

ZS = [28, 29]


def rel_err(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def batch(seed: int = 3, cluster: bool = True) -> dict:
    """Small CuNi structures (a periodic cell, and a cluster) as mace's batch dict, float64."""
    rng = np.random.default_rng(seed)
    atoms = [cuni.make_bulk(rng, 12, cubic=True)] + ([cuni.make_cluster(rng, 9)] if cluster else [])
    table = utils.AtomicNumberTable(ZS)
    graphs = [
        mace_data.AtomicData.from_config(mace_data.config_from_atoms(a), z_table=table, cutoff=5.0)
        for a in atoms
    ]
    out = torch_geometric.Batch.from_data_list(graphs).to_dict()
    return {
        k: (v.double() if torch.is_floating_point(v) else v)
        for k, v in out.items()
        if torch.is_tensor(v)
    }


@pytest.fixture(scope="module")
def models():
    stock = build_model(0)
    patched = copy.deepcopy(stock)
    report = patch_model(patched)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    return stock, patched


def energy_forces(model, data):
    data = {k: v.clone() for k, v in data.items()}
    out = model(data, training=False, compute_force=True)
    return out["energy"].detach(), out["forces"].detach()


def scripted_code(module):
    for m in module.modules():
        try:
            yield m.code
        except (AttributeError, RuntimeError):  # a submodule without a forward
            pass


def test_torchscript_matches_python_and_stock(models):
    stock, patched = models
    data = batch()
    scripted = jit.compile(copy.deepcopy(patched))  # e3nn's scripting, as mace's LAMMPS export does
    e_ref, f_ref = energy_forces(stock, data)
    e_py, f_py = energy_forces(patched, data)
    e_ts, f_ts = energy_forces(scripted, data)
    assert rel_err(e_py, e_ref) < 1e-10 and rel_err(f_py, f_ref) < 1e-10
    assert rel_err(e_ts, e_py) < 1e-10 and rel_err(f_ts, f_py) < 1e-10
    # the scripted graph calls our operators (it is not the stock code path)
    code = "\n".join(scripted_code(scripted))
    assert "cfm.symmetric_contraction_fwd" in code and "cfm.conv_tp_fwd" in code
    assert "cfm.skip_tp_fwd" in code
    # and names the library they need, with the torch it was built against (issue 24)
    notes = {
        m.cfm_plugins_operators for m in scripted.modules() if hasattr(m, "cfm_plugins_operators")
    }
    assert len(notes) == 3, notes  # one per kernel
    for note in notes:
        assert (
            f"built against torch {torch.__version__}" in note
            and "cfm_plugins.load_library()" in note
        )
        assert (
            Path(_backend.library_paths()[0]).name in note and "cfm_plugins.library_paths()" in note
        )


LAMMPS_EVAL = r"""
import sys, torch
for lib in sys.argv[3:]:
    torch.ops.load_library(lib)  # our operators, without importing cfm_plugins
data = torch.load(sys.argv[2])
out = []
for path in sys.argv[1].split(","):
    m = torch.jit.load(path)
    res = m({k: v.clone() for k, v in data.items()}, data["local_or_ghost"], compute_virials=True)
    out.append({k: v.detach() for k, v in res.items() if v is not None})
torch.save(out, sys.argv[2] + ".out")
print("cfm_plugins" in sys.modules)
"""


def test_create_lammps_model_on_patched_model(models, tmp_path):
    stock, patched = models
    files = {}
    jobs = []
    for name, model in (("stock", stock), ("patched", patched)):  # both conversions at once
        files[name] = tmp_path / f"{name}.model"
        torch.save(model, files[name])
        jobs.append(
            subprocess.Popen(
                [sys.executable, "-m", "mace.cli.create_lammps_model", str(files[name])],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                env=clean_env(),
            )
        )
    for name, job in zip(files, jobs):
        _, err = job.communicate(timeout=570)
        assert job.returncode == 0, err[-3000:]
        assert (tmp_path / f"{name}.model-lammps.pt").exists()
    # without our library, torch.jit.load fails; the file names what to load (issue 24)
    lammps_file = tmp_path / "patched.model-lammps.pt"
    res = subprocess.run(
        [sys.executable, "-c", f"import torch; torch.jit.load({str(lammps_file)!r})"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode != 0 and "Unknown builtin op: cfm::" in res.stderr, res.stderr[-2000:]
    with zipfile.ZipFile(lammps_file) as z:
        pickled = b"".join(z.read(n) for n in z.namelist() if n.endswith("data.pkl"))
    assert (
        b"this model calls the cfm::conv_tp_* operators" in pickled
        and b"cfm_plugins.load_library()" in pickled
    )
    assert f"built against torch {torch.__version__}".encode() in pickled
    data = batch(cluster=False)  # LAMMPS hands over one graph (its atoms and ghosts)
    data["local_or_ghost"] = torch.ones(data["positions"].shape[0], dtype=torch.float64)
    torch.save(data, tmp_path / "data.pt")
    lammps_files = ",".join(str(tmp_path / f"{n}.model-lammps.pt") for n in ("stock", "patched"))
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            LAMMPS_EVAL,
            lammps_files,
            str(tmp_path / "data.pt"),
            *_backend.library_paths(),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=570,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-1] == "False"  # cfm_plugins itself was never imported
    stock_out, patched_out = torch.load(tmp_path / "data.pt.out")
    assert set(stock_out) == set(patched_out) >= {"total_energy_local", "forces", "virials"}
    for key in stock_out:
        assert rel_err(patched_out[key], stock_out[key]) < 1e-10, key


PATCHING_LOADS = r"""
import sys, torch
try:
    torch.jit.load(sys.argv[1])
except RuntimeError as exc:
    print("Unknown builtin op: cfm::conv_tp_" in str(exc))
import cfm_plugins.ops.patching  # noqa: F401  (what docs/export.md says loads the operators)
x, y, w, ei, ref = torch.load(sys.argv[2])
print(torch.equal(torch.jit.load(sys.argv[1])(x, y, w, ei), ref))
"""


def test_importing_patching_declares_the_operators_for_torch_jit_load(tmp_path):
    """docs/export.md: importing ``cfm_plugins.ops.patching`` loads the operator library, so a
    scripted fused module loads after it (and not before), in a fresh interpreter."""
    from cfm_plugins.ops.conv_tp import FusedConvTP
    from tests.helpers.conv_tp_cases import graph, inputs
    from tests.helpers.mace_models import mace_tp

    tp = mace_tp("0e+1o", 2, 4)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 6, 15, torch.float64)
    ei = graph(6, 15)
    torch.jit.script(fused).save(str(tmp_path / "conv.pt"))
    torch.save((x, y, w, ei, fused(x, y, w, ei).detach()), tmp_path / "inputs.pt")
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            PATCHING_LOADS,
            str(tmp_path / "conv.pt"),
            str(tmp_path / "inputs.pt"),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["True", "True"]


class Energy(torch.nn.Module):
    """A small potential over the fused conv TP: E = sum of squared receiver sums of messages built
    from edge vectors (irreps 0e+1o) and radial weights of the edge lengths."""

    def __init__(self):
        super().__init__()
        from e3nn import o3
        from mace.modules.irreps_tools import tp_out_irreps_with_instructions

        from cfm_plugins.ops.conv_tp import FusedConvTP

        irreps_in, irreps_edge = o3.Irreps("4x0e+4x1o"), o3.Irreps("1x0e+1x1o")
        out, ins = tp_out_irreps_with_instructions(irreps_in, irreps_edge, irreps_in)
        tp = o3.TensorProduct(
            irreps_in, irreps_edge, out, ins, shared_weights=False, internal_weights=False
        )
        self.tp = FusedConvTP.from_e3nn(tp)
        g = torch.Generator().manual_seed(0)
        self.radial = torch.nn.Parameter(
            torch.randn(2, tp.weight_numel, generator=g, dtype=torch.float64)
        )
        self.embed = torch.nn.Parameter(
            torch.randn(irreps_in.dim, dtype=torch.float64, generator=g)
        )

    def forward(self, positions: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        vec = positions[edge_index[1]] - positions[edge_index[0]]
        r = vec.norm(dim=-1, keepdim=True)
        y = torch.cat([torch.ones_like(r), vec / r], dim=-1)
        w = torch.cat([torch.ones_like(r), r], dim=-1) @ self.radial
        x = self.embed.expand(positions.shape[0], -1) * torch.exp(
            -positions.pow(2).sum(-1, keepdim=True) / 10
        )
        return self.tp(x, y, w, edge_index).pow(2).sum()


def small_graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(10, 3, generator=g, dtype=torch.float64) * 2
    s, r = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    keep = s != r
    return pos, torch.stack([s[keep], r[keep]])


def test_torch_export_energy():
    """torch.export of a module that calls the fused conv TP directly (no make_fx first) sees
    cfm::conv_tp_fwd as an ordinary operator, and the exported program matches eager to 1e-10.
    AOTInductor is covered by the MACE test below (energy and forces, forward and backward
    operators); compiling this toy package too cost about 45 s of the suite's time."""
    model = Energy().eval()
    pos, ei = small_graph()
    ref = model(pos, ei)
    ep = torch.export.export(model, (pos, ei))
    assert "cfm.conv_tp_fwd" in str(ep.graph)
    assert rel_err(ep.module()(pos, ei), ref) < 1e-10


BATCH_KEYS = (
    "positions",
    "node_attrs",
    "edge_index",
    "shifts",
    "unit_shifts",
    "cell",
    "batch",
    "ptr",
)


class EnergyForces(torch.nn.Module):
    """A MACE model as a function of plain tensors returning (energy, forces): what an exported
    potential is (forces by autograd inside the program)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, positions, node_attrs, edge_index, shifts, unit_shifts, cell, batch, ptr):
        data = dict(
            positions=positions,
            node_attrs=node_attrs,
            edge_index=edge_index,
            shifts=shifts,
            unit_shifts=unit_shifts,
            cell=cell,
            batch=batch,
            ptr=ptr,
        )
        out = self.model(data, training=False, compute_force=True)
        return out["energy"], out["forces"]


def test_torch_export_and_aoti_of_patched_mace_energy_and_forces(tmp_path, monkeypatch):
    """A patched MACE model's energy and forces (autograd.grad inside the program) leave Python:
    traced with fake tensors (``make_fx``, as nequip-compile does), exported with torch.export and
    compiled by AOTInductor, exact to the stock model in float64. The exported program calls our
    forward and backward operators. Shapes are those of the example batch (re-export per shape):
    with ``AOTI_RUNTIME_CHECK_INPUTS=1`` (docs/export.md) a batch of other shapes raises, naming
    the input and the dimension, where without it the package returns wrong numbers."""
    import e3nn
    from torch.fx.experimental.proxy_tensor import make_fx

    defaults = e3nn.get_optimization_defaults()
    e3nn.set_optimization_defaults(jit_script_fx=False)  # plain fx modules, which make_fx traces
    try:
        stock = build_model(0)
    finally:
        e3nn.set_optimization_defaults(**defaults)
    patched = copy.deepcopy(stock)
    assert patch_model(patched).total == 6
    data = batch()
    args = tuple(data[k] for k in BATCH_KEYS)
    e_ref, f_ref = energy_forces(stock, data)

    traced = make_fx(
        EnergyForces(patched.eval()), tracing_mode="fake", _allow_non_fake_inputs=True
    )(*[a.clone() for a in args])
    ops = {str(n.target) for n in traced.graph.nodes if str(n.target).startswith("cfm.")}
    assert {
        "cfm.symmetric_contraction_fwd.default",
        "cfm.symmetric_contraction_bwd.default",
        "cfm.conv_tp_fwd.default",
        "cfm.conv_tp_bwd.default",
        "cfm.skip_tp_fwd.default",
        "cfm.skip_tp_bwd.default",
    } <= ops, ops
    ep = torch.export.export(traced, tuple(a.clone() for a in args), strict=False)
    e_ep, f_ep = ep.module()(*[a.clone() for a in args])
    assert rel_err(e_ep, e_ref) < 1e-10 and rel_err(f_ep, f_ref) < 1e-10
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "mace.pt2"))
    monkeypatch.setenv("AOTI_RUNTIME_CHECK_INPUTS", "1")  # read at the package's first call
    runner = torch._inductor.aoti_load_package(package)
    e_aoti, f_aoti = runner(*[a.clone() for a in args])
    assert rel_err(e_aoti, e_ref) < 1e-10 and rel_err(f_aoti, f_ref) < 1e-10
    other = batch(cluster=False)  # fewer atoms and edges than the example
    n_example, n_other = args[0].shape[0], other["positions"].shape[0]
    assert n_other != n_example
    with pytest.raises(
        RuntimeError,
        match=rf"input_handles\[0\]: unmatched dim value at 0, expected: {n_example}, "
        rf"but got: {n_other}",
    ):
        runner(*[other[k].clone() for k in BATCH_KEYS])


def test_torch_compile_of_a_patched_mace_after_mace_compile_prepare_matches_eager():
    """docs/export.md's recipe: mace's own (``mace.tools.compile.prepare``: plain fx modules, the
    symmetric contractions traced), then patch_model (every kernel swapped, the traced
    contractions too), then ``torch.compile``: energy and forces equal eager (positions requiring
    grad before the call, ``training=True``: as for the stock model, torch.compile cannot trace
    mace's ``requires_grad_`` of its input)."""
    from mace.tools.compile import prepare

    from cfm_plugins.testing import mace_model

    config = dict(hidden="8x0e+8x1o", max_ell=2, correlation=2, num_interactions=1)
    stock = mace_model(**config)
    model = prepare(mace_model)(**config)
    assert patch_model(model).counts == {"symmetric_contraction": 1, "conv_tp": 1, "skip_tp": 1}
    data = batch(cluster=False)

    def run(m):
        d = {k: v.clone() for k, v in data.items()}
        d["positions"].requires_grad_(True)
        out = m(d, training=True, compute_force=True)
        return out["energy"].detach(), out["forces"].detach()

    e_ref, f_ref = run(stock)
    e, f = run(torch.compile(model))
    assert rel_err(e, e_ref) < 1e-10 and rel_err(f, f_ref) < 1e-10
