"""benchmarks/gpu_md.py: the MD benchmark's ways and a tiny smoke run on the CPU."""

from __future__ import annotations

from benchmarks import gpu_mace
from tests.helpers import run_module
from tests.helpers.records import check_record, rows_of


def test_md_smoke_run_on_cpu_times_each_way_and_compares_forces(tmp_path):
    res = run_module(
        "benchmarks.gpu_md",
        *"--device cpu --atoms 32 --dtypes float64 --hidden 8x0e+8x1o --steps 2".split(),
        *"--repeats 1 --ways stock fused[cuda] --out".split(),
        str(tmp_path),
        timeout=570,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    rows = {
        line.split("|")[3].strip(): [c.strip() for c in line.split("|")]
        for line in res.stdout.splitlines()
        if line.startswith("| float64 |")
    }
    assert set(rows) == {"stock", "fused[cuda]"}, (
        res.stdout
    )  # on CPU tensors the C++ CPU kernels run
    assert (
        float(rows["fused[cuda]"][4]) > 0 and float(rows["fused[cuda]"][7]) < 1e-8
    )  # timed; forces equal stock's
    assert (
        rows["fused[cuda]"][5].endswith("x") and rows["fused[cuda]"][6] == "-"
    )  # vs stock; cueq did not run
    for (
        row
    ) in rows.values():  # the model's input, made on the host: part of the step, not all of it
        assert 0 < float(row[8]) < float(row[4])
        assert float(row[9]) > 0  # the first evaluation, timed on its own
    rec = check_record(tmp_path, "gpu_md", "benchmarks.gpu_md")
    md = {r[2]: r for r in rows_of(rec, "md")}
    assert set(md) == set(rows) and md["fused[cuda]"][3] == float(rows["fused[cuda]"][4])


def test_md_rejects_an_unknown_way_before_building_anything():
    res = run_module(
        "benchmarks.gpu_md",
        *"--device cpu --ways stock fused[triton]+captured".split(),
        timeout=120,
    )
    assert res.returncode == 2 and "invalid choice: 'fused[triton]+captured'" in res.stdout, (
        res.stdout[-2000:]
    )


def test_md_ways_without_skin_convert_every_step_and_the_skin_rows_keep_the_list(tmp_path):
    """gpu_md's plain fused rows pass skin=None (on CUDA the default would keep the list), and each
    is followed by its ``skin S`` row with that skin."""
    import torch

    from benchmarks import gpu_md

    path = tmp_path / "m.model"
    torch.save(gpu_mace.build_model(torch.float64, "8x0e+8x1o").cpu(), path)
    ways = gpu_md.calculators(str(path), "float64", "cpu", ["stock", "fused[cuda]"], skin=0.5)
    assert [w for w, _ in ways] == ["stock", "fused[cuda]", "fused[cuda] skin 0.5"]
    plain, kept = ways[1][1](), ways[2][1]()
    assert plain.md_graphs is None and kept.md_graphs.neighbours.skin == 0.5
    only = gpu_md.calculators(
        str(path), "float64", "cpu", ["stock", "fused[cuda]"], skin=0.5, skin_only=True
    )
    assert [w for w, _ in only] == ["stock", "fused[cuda] skin 0.5"]
