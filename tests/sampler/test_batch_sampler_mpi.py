"""BinPackBatchSampler across real `mpirun -np 2` ranks (tests/scripts/sampler_shards.py): sharded
costs, one agreed plan."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_module

# run as a module from the repository root (run_module's working directory), which puts the root on
# the script's path: it imports benchmarks.workload
SCRIPT = "tests.scripts.sampler_shards"
pytestmark = pytest.mark.mpi


def _run(mode):
    proc = run_module(SCRIPT, mode, np=2, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def test_shards_agree_and_cover_every_sample():
    out = _run("agree")
    line = next(ln for ln in out.splitlines() if ln.startswith("OK "))
    info = json.loads(line[3:])
    assert len(info["steps"]) == 1 and info["steps"][0] > 0  # same number of steps on both ranks
    from benchmarks.workload import paper_mix

    assert info["samples"] == len(paper_mix(20_000, seed=7))
    assert info["imbalance"] < 1.01
    assert "RAISED" not in out


def test_diverging_rank_raises_checksum_error_on_every_rank():
    out = _run("diverge")
    raised = [ln for ln in out.splitlines() if ln.startswith("RAISED")]
    assert len(raised) == 2, out[-4000:]  # both ranks raised, nobody hung
    for ln in raised:
        assert (
            "RuntimeError" in ln
            and "disagree on the batch plan" in ln
            and "ranks 1 differ from rank 0" in ln
        )


def test_shards_of_step_sizes_are_gathered_and_make_the_steps_even_in_them():
    """Each rank gives its shard of the edges as step_sizes: one plan (checksum), every sample
    once, and the steps' edges more even than those of the plan without them."""
    plain = json.loads(next(ln for ln in _run("agree").splitlines() if ln.startswith("OK "))[3:])
    info = json.loads(next(ln for ln in _run("edges").splitlines() if ln.startswith("OK "))[3:])
    assert info["steps"] == plain["steps"] and info["samples"] == plain["samples"]
    assert info["edge_imbalance"] < plain["edge_imbalance"], (info, plain)


def test_ranks_with_different_step_sizes_raise_on_every_rank():
    out = _run("edges_diverge")
    raised = [ln for ln in out.splitlines() if ln.startswith("RAISED")]
    assert len(raised) == 2, out[-4000:]
    for ln in raised:
        assert "disagree on the batch plan" in ln and "options differ: step_sizes" in ln, ln


def test_overlapping_shards_raise_on_every_rank():
    out = _run("overlap")
    raised = [ln for ln in out.splitlines() if ln.startswith("RAISED")]
    assert len(raised) == 2, out[-4000:]
    for ln in raised:
        assert "ValueError" in ln and "shards overlap" in ln and "sample 0 on ranks 0, 1" in ln


def test_cost_auto_every_rank_plans_with_rank_0s_fit():
    """cost=auto on 2 real ranks: the records of epoch 0 are gathered once, rank 0's fit is used
    everywhere (each rank's records carry noise of its own), the plans after it agree (checksum),
    every sample is seen once per epoch, and the fit finds the step-time model used."""
    proc = run_module("tests.scripts.autocost_ranks", np=2, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("OK "))
    info = json.loads(line[3:])
    assert info["labels"] == ["auto-1", "auto-1"] and info["from_epoch"] == 1
    fit = info["fit"]
    # the calibration's steps are packed at 70, 85 and 100 % of the capacity: the atom term is told
    # from the per-step constant (30 steps with 2 % noise per record: within 10 %)
    assert fit["b"] == pytest.approx(2e-6, rel=0.05) and fit["a"] == pytest.approx(1e-5, rel=0.1), (
        fit
    )
    assert fit["ranks"] == 2 and fit["steps"] >= 15
    assert info["lif_predicted"] < info["lif_measured"]
    true = {int(k): v for k, v in info["true_lif"].items()}  # under the model the ranks timed with
    assert true[0] > 1.03 and true[1] < 1.01 and true[2] < 1.01, true
    assert "binpack cost=auto from epoch 1: step time = " in proc.stdout  # the one log line, rank 0


@pytest.mark.parametrize("mode", ["mace", "hydragnn-atoms", "hydragnn-auto", "nequip"])
def test_a_rank_that_reads_a_loader_once_more_does_not_block(mode):
    """Issue 83 on 2 real ranks (tests/scripts/uneven_passes.py): rank 0 reads a batch of the
    training loader and the whole validation loader before training, rank 1 neither (HydraGNN's
    update_config, a rank-0 preview); then both train two epochs, a collective per step. The
    adapters' loaders (mace's, HydraGNN's, and NequIP's Lightning wrapper) call no collective while
    they are iterated, so nothing blocks; every epoch trains every graph on both ranks in the same
    number of steps and evaluates every graph once."""
    if mode == "mace":
        pytest.importorskip("mace", reason="mace-torch is not installed (`make venv`)")
    if mode.startswith("hydragnn"):
        pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
        pytest.importorskip("hydragnn", reason="HydraGNN is not installed (`make venv`)")
    proc = run_module("tests.scripts.uneven_passes", mode, np=2, timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("OK "))
    info = json.loads(line[3:])
    sizes = info["sizes"]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    for epoch in info["epochs"]:
        assert sorted(set(epoch["train"])) == list(range(sizes[0])), epoch["train"]
        steps = epoch["steps"]
        assert steps[0] == steps[1] > 0  # every rank trains at every step
        for k, ids in enumerate(epoch["eval"]):
            assert ids == list(range(starts[k + 1], starts[k + 1] + sizes[k + 1]))  # each once
            assert epoch["eval_steps"][k][0] == epoch["eval_steps"][k][1] > 0
