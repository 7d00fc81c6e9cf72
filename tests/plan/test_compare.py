"""``cfm-plan --compare``: every sampler's row at every rank count, printed and in the JSON, with
the figures of the samplers' own plans (binpack's and the trainer's as the plan has them, the
peers' from their models)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cfm_plugins.plan.cli import main
from cfm_plugins.plan.compare import COLUMNS, SAMPLERS, compare_ranks, figures, table
from cfm_plugins.plan.peer_samplers import fairchem_max_atoms, hydragnn_cost_aware


@pytest.fixture(scope="module")
def xyz(tmp_path_factory):
    """30 CuNi cells and slabs of 4..96 atoms, as extended XYZ."""
    from ase.build import bulk, fcc111
    from ase.io import write

    rng = np.random.default_rng(1)
    frames = []
    for i in range(30):
        if i % 3:
            a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(
                (int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(1, 5)))
            )
        else:
            a = fcc111("Ni", size=(2, int(rng.integers(2, 4)), 3), vacuum=6.0)
        a.rattle(0.05, seed=i)
        frames.append(a)
    path = tmp_path_factory.mktemp("compare") / "train.xyz"
    write(path, frames)
    return path


def test_compare_prints_and_records_every_sampler_at_every_rank_count(xyz, tmp_path, capsys):
    argv = [xyz, "--ranks", "2,4,64", "--r-max", "4.0", "--batch-size", "4", "--device", "cpu"]
    argv += ["--step-time", "linear:0.01,1e-5,2e-7", "--seeds", "1", "--compare"]
    argv += ["--json", tmp_path / "plan.json"]
    assert main([str(a) for a in argv]) == 0
    out = capsys.readouterr().out
    plan = json.loads((tmp_path / "plan.json").read_text())
    comp = plan["compare"]
    cap = plan["binpack"]["capacity"]
    assert comp["budget_atoms"] == cap and comp["budget_rule"] == "binpack's capacity"
    rows = comp["rows"]
    assert [(r["ranks"], r["sampler"]) for r in rows] == [
        (w, label) for w in (2, 4, 64) for label in SAMPLERS.values()
    ]
    # the printed table: a header and one line per row, in order
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert [ln.split(" | ")[2] for ln in lines[1:]] == [r["sampler"] for r in rows]
    by = {(r["ranks"], r["key"]): r for r in rows}
    for res in plan["results"]:
        w = res["ranks"]
        b, st = by[(w, "binpack")], by[(w, "distributed")]
        # binpack's row is the plan's binpack; the DistributedSampler's is the trainer's own
        assert b["steps"] == res["binpack"]["steps"] and b["vs_binpack"] == 1.0
        assert b["lif_time"] == pytest.approx(res["binpack"]["lif_time"])
        assert b["epoch"] == pytest.approx(res["binpack"]["epoch_s"])
        assert st["steps"] == res["stock"]["steps"]
        if w < 64:
            assert st["epoch"] == pytest.approx(res["stock"]["epoch_s"])
        else:  # mace's drop_last leaves no batch for 64 ranks of 30 structures
            assert st["steps"] == 0 and "| DistributedSampler | 0 (no batch) |" in out
        assert b["dropped"] == 0 and b["largest"] <= cap
    for w in (2, 4):
        for key in ("hydragnn", "fairchem", "metatrain"):
            r = by[(w, key)]
            assert r["largest"] <= cap and r["epoch"] / by[(w, "binpack")]["epoch"] == (
                pytest.approx(r["vs_binpack"])
            )
            assert {"lif_atoms", "lif_edges", "lif_time", "plan_s", "peak_mb"} <= set(r)
    # 30 structures make fewer batches than 64 ranks: fairchem and metatrain refuse, and say so
    for key in ("fairchem", "metatrain"):
        assert "batches" in by[(64, key)]["refused"]
        assert "refused: " + by[(64, key)]["refused"] in out
    assert by[(64, "hydragnn")]["repeated"] > 0  # HydraGNN repeats whole batches instead
    assert by[(64, "binpack")]["steps"] == 1


def test_the_peers_rows_are_their_models_figures():
    atoms = np.random.default_rng(2).integers(4, 120, 400)
    edges = atoms * np.random.default_rng(3).integers(10, 40, 400)
    rows = compare_ranks(atoms, edges, 4, 600, seed=1, epoch=2, memory=False)
    got = {r["key"]: r for r in rows}
    for key, fn in (("hydragnn", hydragnn_cost_aware), ("fairchem", fairchem_max_atoms)):
        want = figures(fn(atoms, 600, 4, seed=1, epoch=2), atoms, edges, 4, 600)
        assert {k: got[key][k] for k in want} == want
        assert got[key]["peak_mb"] is None
    assert got["binpack"]["repeated"] == 0 and got["binpack"]["dropped"] == 0
    lines = table(rows, timed=False)
    assert lines[0].count("|") == len(COLUMNS) + 1 and "epoch (atoms)" in lines[0]
    assert all(ln.count("|") == len(COLUMNS) + 1 for ln in lines)


def test_binpacks_row_plans_its_steps_even_in_the_edges_and_step_balance_cost_does_not(
    xyz, tmp_path
):
    from cfm_plugins.plan.planning import PlanOptions, binpack_plan

    atoms = np.random.default_rng(2).integers(4, 120, 400)
    edges = atoms * np.random.default_rng(3).integers(10, 40, 400)
    rows = {r["key"]: r for r in compare_ranks(atoms, edges, 4, 600, seed=1, memory=False)}
    opts = PlanOptions(seed=1)
    want = figures(binpack_plan(atoms, 600, 4, opts, edges), atoms, edges, 4, 600)
    assert {k: rows["binpack"][k] for k in want} == want
    plain = figures(binpack_plan(atoms, 600, 4, opts), atoms, edges, 4, 600)
    assert want["lif_edges"] < plain["lif_edges"] and want["steps"] == plain["steps"]
    # cfm-plan's flag: --step-balance cost plans as the option does
    lifs = {}
    for balance in ("edges", "cost"):
        argv = [xyz, "--ranks", "4", "--r-max", "4.0", "--batch-size", "4", "--device", "cpu"]
        argv += ["--seeds", "1", "--compare", "--step-balance", balance]
        argv += ["--json", tmp_path / f"{balance}.json"]
        assert main([str(a) for a in argv]) == 0
        plan = json.loads((tmp_path / f"{balance}.json").read_text())
        lifs[balance] = {r["key"]: r["lif_edges"] for r in plan["compare"]["rows"]}["binpack"]
    assert lifs["edges"] <= lifs["cost"]
