"""CFMCalculator against mace's own MACECalculator, on a real (small, randomized) MACE model
file."""

from __future__ import annotations

import subprocess
import sys
import warnings

import mace  # noqa: F401  (before e3nn)
import numpy as np
import pytest
import torch
from mace.calculators import MACECalculator

from cfm_plugins.calculators import CFMCalculator
from cfm_plugins.ops.kernel_table import kernel_names
from tests.helpers import ROOT, clean_env
from tests.helpers.mace_models import build_model, structures

#: the fused kernels of this checkout
AVAILABLE = kernel_names(auto=True)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def evaluate(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    return atoms.get_potential_energy(), atoms.get_forces(), atoms.get_stress()


def assert_same(a, b, atol, rtol=0.0):
    (ea, fa, sa), (eb, fb, sb) = a, b
    assert abs(ea - eb) <= atol + rtol * abs(eb), (ea, eb)
    np.testing.assert_allclose(fa, fb, atol=atol, rtol=rtol)
    np.testing.assert_allclose(sa, sb, atol=atol, rtol=rtol)


def test_float64_matches_mace_calculator(fused64, stock64):
    for atoms in structures():
        ref = evaluate(stock64, atoms)
        assert np.abs(ref[1]).max() > 1e-3  # the model is not trivially flat
        assert_same(evaluate(fused64, atoms), ref, atol=1e-8)


def test_results_keys_and_node_energies_as_mace(fused64, stock64):
    atoms = structures()[0]
    a, b = atoms.copy(), atoms.copy()
    a.calc, b.calc = fused64, stock64
    a.get_potential_energy(), b.get_potential_energy()
    assert set(fused64.results) == set(stock64.results)
    for key in ("energies", "node_energy", "free_energy"):
        np.testing.assert_allclose(fused64.results[key], stock64.results[key], atol=1e-8)


def test_patching_really_happened(fused64):
    (report,) = fused64.patch_reports
    assert set(report.counts) == set(AVAILABLE)
    assert all(n > 0 for n in report.counts.values()), report
    module_names = {type(m).__module__ for m in fused64.models[0].modules()}
    assert any(n.startswith("cfm_plugins.ops") for n in module_names), module_names


def test_fused_false_is_stock(model_files, stock64):
    calc = CFMCalculator(str(model_files["m64"]), fused=False)
    assert calc.kernels == () and calc.patch_reports[0].total == 0
    assert not any(type(m).__module__.startswith("cfm_plugins") for m in calc.models[0].modules())
    atoms = structures()[1]
    assert_same(evaluate(calc, atoms), evaluate(stock64, atoms), atol=1e-12)


def test_float32_close(model_files):
    fused = CFMCalculator(str(model_files["m32"]), default_dtype="float32", kernels=AVAILABLE)
    stock = MACECalculator(model_paths=str(model_files["m32"]), default_dtype="float32")
    assert next(fused.models[0].parameters()).dtype == torch.float32
    for atoms in structures()[:4]:
        e, f, s = evaluate(fused, atoms)
        e0, f0, s0 = evaluate(stock, atoms)
        assert abs(e - e0) <= 1e-4 * abs(e0)
        scale_f, scale_s = np.abs(f0).max(), np.abs(s0).max()
        assert np.abs(f - f0).max() <= 1e-4 * scale_f
        assert np.abs(s - s0).max() <= 1e-4 * max(scale_s, 1e-6)


def test_batch_equals_single_evaluations(fused64):
    frames = structures()
    singles = []
    for atoms in frames:
        a = atoms.copy()
        a.calc = fused64
        a.get_potential_energy()
        singles.append(dict(fused64.results))
    for max_atoms in (None, 60):  # one model call; several calls
        batch = fused64.get_properties_batch(frames, max_atoms=max_atoms)
        assert len(batch) == len(frames)
        for res, ref, atoms in zip(batch, singles, frames):
            assert res["forces"].shape == (len(atoms), 3)
            for key in ("energy", "free_energy", "forces", "stress", "energies", "node_energy"):
                np.testing.assert_allclose(res[key], ref[key], atol=1e-9, rtol=1e-12, err_msg=key)
    attached = [a.copy() for a in frames[:2]]
    fused64.get_properties_batch(attached, attach=True)
    assert attached[1].get_potential_energy() == pytest.approx(singles[1]["energy"], abs=1e-9)


def test_committee_glob_and_units(model_files):
    pattern = str(model_files["m64"].parent / "m64*.model")  # m64 and m64b
    fused = CFMCalculator(pattern, kernels=AVAILABLE, energy_units_to_eV=2.0)
    stock = MACECalculator(model_paths=pattern, default_dtype="float64", energy_units_to_eV=2.0)
    assert fused.num_models == 2 and len(fused.patch_reports) == 2
    atoms = structures()[0]
    assert_same(evaluate(fused, atoms), evaluate(stock, atoms), atol=1e-8)
    assert fused.results["energy_var"] == pytest.approx(stock.results["energy_var"], abs=1e-8)
    assert fused.results["energy_var"] > 0
    (b,) = fused.get_properties_batch([atoms])
    assert b["energy"] == pytest.approx(fused.results["energy"], abs=1e-9)


def test_dtype_mismatch_converts_and_says_so(model_files, fused64):
    with pytest.warns(UserWarning, match="float32; converting it to default_dtype=float64"):
        calc = CFMCalculator(str(model_files["m32"]), default_dtype="float64", kernels=AVAILABLE)
    assert next(calc.models[0].parameters()).dtype == torch.float64
    with warnings.catch_warnings(
        record=True
    ) as seen:  # no dtype warning when the model already matches
        warnings.simplefilter("always")
        CFMCalculator(str(model_files["m64"]), default_dtype="float64", kernels=())
    assert not [w for w in seen if "converting" in str(w.message)]
    keep = CFMCalculator(str(model_files["m32"]), default_dtype="", kernels=())
    assert keep.default_dtype == "float32"


def test_bad_model_files_are_clear_errors(tmp_path, model_files):
    with pytest.raises(FileNotFoundError, match="no MACE model file at .*missing.model"):
        CFMCalculator(str(tmp_path / "missing.model"))
    with pytest.raises(FileNotFoundError, match="no MACE model file"):
        CFMCalculator(str(tmp_path / "nothing_*.model"))
    with pytest.raises(ValueError, match="empty list"):
        CFMCalculator([])

    state = tmp_path / "state.pt"
    torch.save(build_model(0).state_dict(), state)
    with pytest.raises(
        TypeError,
        match=r"is not a MACE model: found a OrderedDict with keys .*state_dict"
        r".*expected a whole MACE model",
    ):
        CFMCalculator(str(state))
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": {}, "optimizer": {}, "epoch": 3}, ckpt)
    with pytest.raises(
        TypeError, match="found a dict with keys \\['model', 'optimizer', 'epoch'\\]"
    ):
        CFMCalculator(str(ckpt))
    other = tmp_path / "linear.model"
    torch.save(torch.nn.Linear(3, 2), other)
    with pytest.raises(
        TypeError,
        match="torch.nn.Module of class torch.nn.modules.linear.Linear without the MACE attributes",
    ):
        CFMCalculator(str(other))
    junk = tmp_path / "junk.model"
    junk.write_text("not a torch file\n")
    with pytest.raises(ValueError, match="could not be read by torch.load"):
        CFMCalculator(str(junk))
    with pytest.raises(TypeError, match=r"models\[0\] is not a MACE model"):
        CFMCalculator(models=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="exactly one of model_paths"):
        CFMCalculator()
    with pytest.raises(ValueError, match="unknown fused kernel"):
        CFMCalculator(str(model_files["m64"]), kernels=("symetric_contraction",))
    with pytest.raises(ValueError, match="default_dtype"):
        CFMCalculator(str(model_files["m64"]), default_dtype="float16")
    with pytest.raises(ValueError, match="fused=False"):
        CFMCalculator(str(model_files["m64"]), enable_cueq=True)
    with pytest.raises(NotImplementedError, match="compile_mode"):
        CFMCalculator(str(model_files["m64"]), compile_mode="default")


def test_structures_the_model_cannot_evaluate_are_clear_errors(fused64):
    """An element outside the model's (Fe in a CuNi model: mace's own error is "26 is not in list"),
    a NaN position (mace evaluates it to a NaN energy), a zero periodic cell (mace makes it a 1 A
    cube), no atoms: each names the atoms and the fix, through ``get_potential_energy`` and
    ``get_properties_batch``; the structure after still runs."""
    good = max(structures(), key=len)
    iron = good.copy()
    iron.symbols[[3, 8]] = "Fe"
    iron.calc = fused64
    with pytest.raises(
        ValueError, match=r"not trained on: Fe \(atoms 3, 8\)\. The model knows Ni, Cu"
    ):
        iron.get_potential_energy()
    diverged = good.copy()
    diverged.positions[5, 1] = np.nan
    diverged.calc = fused64
    with pytest.raises(
        ValueError, match=r"positions that are not finite: atoms 5 \(atom 5 at \[.*nan"
    ):
        diverged.get_forces()
    with pytest.raises(ValueError, match="structure 1 of the list .*not finite: atoms 5"):
        fused64.get_properties_batch([good, diverged])
    zero_cell = good.copy()
    zero_cell.set_cell(np.zeros((3, 3)))
    zero_cell.pbc = True
    zero_cell.calc = fused64
    with pytest.raises(ValueError, match="periodic along .* but its cell is zero"):
        zero_cell.get_potential_energy()
    empty = good[:0]
    empty.calc = fused64
    with pytest.raises(ValueError, match="has no atoms"):
        empty.get_potential_energy()
    good = good.copy()
    good.calc = fused64
    assert np.isfinite(good.get_potential_energy())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda_is_a_clear_error(model_files):
    with pytest.raises(RuntimeError, match="device='cuda' was requested but CUDA is not available"):
        CFMCalculator(str(model_files["m64"]), device="cuda")


@needs_cuda
def test_cuda_matches_cpu(model_files, stock64):
    for dtype, atol in (("float64", 1e-8), ("float32", None)):
        calc = CFMCalculator(
            str(model_files["m64"]), device="cuda", default_dtype=dtype, kernels=AVAILABLE
        )
        assert next(calc.models[0].parameters()).is_cuda
        for atoms in structures()[:4]:
            got, ref = evaluate(calc, atoms), evaluate(stock64, atoms)
            if atol is not None:
                assert_same(got, ref, atol=atol)
            else:
                assert_same(got, ref, atol=1e-4 * np.abs(ref[1]).max(), rtol=1e-4)
        batch = calc.get_properties_batch(structures())
        assert batch[0]["energy"] == pytest.approx(evaluate(stock64, structures()[0])[0], rel=1e-4)


def test_package_import_does_not_import_mace():
    code = (
        "import sys, cfm_plugins, cfm_plugins.calculators as c; "
        "assert 'mace' not in sys.modules and 'e3nn' not in sys.modules, 'imported'; "
        "assert 'CFMCalculator' in c.__all__; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=ROOT,
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout


def test_weights_only_loads_state_dicts_and_checkpoints(tmp_path, model_files, stock64):
    """weights_only=True reads a state_dict / mace checkpoint without unpickling code; same
    results."""
    trusted = torch.load(model_files["m64"], weights_only=False)
    state, ckpt = tmp_path / "m64_weights.pt", tmp_path / "m64_epoch-3.pt"
    torch.save(trusted.state_dict(), state)
    torch.save(
        {"model": trusted.state_dict(), "optimizer": {"state": {}}, "lr_scheduler": {}}, ckpt
    )
    architecture = build_model(5)  # same configuration, other weights
    atoms = structures()[0]
    ref = evaluate(stock64, atoms)
    for path in (state, ckpt):
        calc = CFMCalculator(
            str(path), weights_only=True, architecture=architecture, kernels=AVAILABLE
        )
        assert_same(evaluate(calc, atoms), ref, atol=1e-8)
    # the architecture was copied, not loaded into
    assert not torch.equal(next(architecture.parameters()), next(trusted.parameters()))
    calc = CFMCalculator(
        str(state), weights_only=True, architecture=lambda: build_model(6), fused=False
    )
    assert_same(evaluate(calc, atoms), ref, atol=1e-12)


def test_weights_only_errors_say_what_to_do(tmp_path, model_files):
    with pytest.raises(
        ValueError,
        match=r"cannot be loaded with weights_only=True: it pickles Python objects.*"
        r"If you trust the file.*state_dict\(\)",
    ):
        CFMCalculator(str(model_files["m64"]), weights_only=True, architecture=build_model(0))
    state = tmp_path / "weights.pt"
    torch.save(build_model(0).state_dict(), state)
    with pytest.raises(ValueError, match="holds weights only .* pass architecture="):
        CFMCalculator(str(state), weights_only=True)
    small = tmp_path / "linear.pt"
    torch.save(torch.nn.Linear(3, 2).state_dict(), small)
    with pytest.raises(ValueError, match="do not fit the given architecture"):
        CFMCalculator(str(small), weights_only=True, architecture=build_model(0))
    with pytest.raises(TypeError, match="not model weights"):
        torch.save({"epoch": 3}, tmp_path / "meta.pt")
        CFMCalculator(str(tmp_path / "meta.pt"), weights_only=True, architecture=build_model(0))
    with pytest.raises(ValueError, match="only with weights_only=True"):
        CFMCalculator(str(model_files["m64"]), architecture=build_model(0))


def test_default_kernels_are_auto_the_skip_connection_included(model_files, stock64):
    """``kernels="auto"`` (the default) swaps every kernel the model has, the skip connections
    too, with their untimed GPU kernel off (``auto``); naming ``skip_tp`` turns it on."""
    from cfm_plugins.ops.skip_tp import FusedSkipTP

    calc = CFMCalculator(str(model_files["m64"]), device="cpu", default_dtype="float64")
    assert calc.kernels == AVAILABLE and "skip_tp" in AVAILABLE
    assert calc.patch_reports[0].counts == {
        "symmetric_contraction": 2,
        "conv_tp": 2,
        "skip_tp": 2,
    }
    skips = [m for m in calc.models[0].modules() if isinstance(m, FusedSkipTP)]
    assert len(skips) == 2 and not any(m.gpu_kernels for m in skips)
    for atoms in structures()[:2]:
        assert_same(evaluate(calc, atoms), evaluate(stock64, atoms), atol=1e-9)
    named = CFMCalculator(str(model_files["m64"]), default_dtype="float64", kernels=("skip_tp",))
    skips = [m for m in named.models[0].modules() if isinstance(m, FusedSkipTP)]
    assert len(skips) == 2 and all(m.gpu_kernels for m in skips)
