"""BinPackBatchSampler in a real DataLoader: coverage, len, epochs, resume, drop_last, errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.workload import paper_mix
from cfm_plugins.sampler import BinPackBatchSampler
from tests.sampler.comms import LoopbackComm


class Graphs(Dataset):
    """Graphs as (index, positions[atoms, 3]) with a collate that concatenates them like PyG."""

    def __init__(self, atoms):
        self.atoms = np.asarray(atoms)

    def __len__(self):
        return len(self.atoms)

    def __getitem__(self, i):
        return i, torch.zeros(int(self.atoms[i]), 3)


def collate(items):
    idx = torch.tensor([i for i, _ in items])
    pos = torch.cat([p for _, p in items])
    return idx, pos


@pytest.fixture(scope="module")
def atoms():
    return paper_mix(3000, seed=3)


def epoch_batches(sampler, ds, num_workers=0):
    dl = DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers)
    return [(idx.tolist(), pos.shape[0]) for idx, pos in dl]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_every_sample_once_over_ranks(atoms, num_workers):
    ds, w = Graphs(atoms), 4
    per_rank = []
    for r in range(w):
        s = BinPackBatchSampler(atoms, 3072, rank=r, world_size=w, seed=5)
        b = epoch_batches(s, ds, num_workers)
        assert len(b) == len(s)  # len() is exact
        assert all(n_atoms <= 3072 for _, n_atoms in b)
        per_rank.append(b)
    assert len({len(b) for b in per_rank}) == 1  # same number of steps on every rank
    seen = sorted(i for b in per_rank for idx, _ in b for i in idx)
    assert seen == list(range(len(atoms)))
    # at each step the ranks carry nearly the same number of atoms
    step_atoms = np.array([[b[s][1] for b in per_rank] for s in range(len(per_rank[0]))])
    assert np.mean(step_atoms.max(1) / step_atoms.mean(1)) < 1.01


def test_set_epoch_changes_batches_keeps_len(atoms):
    s = BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=1)
    e0 = list(s)
    assert list(s) == e0  # same epoch -> same batches
    s.set_epoch(1)
    e1 = list(s)
    assert e1 != e0
    assert {frozenset(b) for b in e1} != {frozenset(b) for b in e0}
    assert len(e1) == len(s)
    t = BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=1)
    t.set_epoch(1)
    assert list(t) == e1  # deterministic from seed + epoch


def test_no_shuffle_is_the_same_every_epoch(atoms):
    s = BinPackBatchSampler(atoms, 3072, rank=1, world_size=2, shuffle=False)
    a = list(s)
    s.set_epoch(3)
    assert list(s) == a


def test_state_dict_resume_mid_epoch(atoms):
    w, r = 2, 1
    full = BinPackBatchSampler(atoms, 3072, rank=r, world_size=w, seed=9)
    full.set_epoch(2)
    want = list(full)
    s = BinPackBatchSampler(atoms, 3072, rank=r, world_size=w, seed=9)
    s.set_epoch(2)
    it = iter(s)
    got = [next(it) for _ in range(5)]
    state = s.state_dict()
    assert state["epoch"] == 2 and state["seed"] == 9 and state["batches_consumed"] == 5
    # a fresh sampler (a restarted job) continues with the next batch
    t = BinPackBatchSampler(atoms, 3072, rank=r, world_size=w, seed=0)
    t.load_state_dict(state)
    rest = list(t)
    assert got + rest == want
    assert len(t) == len(want)
    # the following epoch starts from its beginning again
    t.set_epoch(3)
    assert len(list(t)) == len(t)


def test_state_dict_in_dataloader_with_explicit_count(atoms):
    ds = Graphs(atoms)
    s = BinPackBatchSampler(atoms, 3072, rank=0, world_size=1, seed=4)
    want = [b for b, _ in epoch_batches(s, ds)]
    dl = DataLoader(ds, batch_sampler=s, collate_fn=collate, num_workers=0)
    got = []
    for k, (idx, _) in enumerate(dl):
        got.append(idx.tolist())
        if k == 6:
            break
    state = s.state_dict(batches_consumed=len(got))
    t = BinPackBatchSampler(atoms, 3072, rank=0, world_size=1, seed=4)
    t.load_state_dict(state)
    got += [b for b, _ in epoch_batches(t, ds)]
    assert got == want


def test_load_state_dict_errors(atoms):
    s = BinPackBatchSampler(atoms, 3072, rank=0, world_size=2)
    with pytest.raises(ValueError, match="world_size 4"):
        s.load_state_dict({"epoch": 0, "seed": 0, "batches_consumed": 1, "world_size": 4})
    with pytest.raises(ValueError, match="batches_consumed"):
        s.load_state_dict({"epoch": 0, "seed": 0, "batches_consumed": 10**6})


def test_drop_last_drops_underfilled_steps():
    c = np.r_[np.full(6, 100.0), [1.0, 1.0]]  # 8 bins: 6 full, 2 holding a single 1-atom graph
    keep = BinPackBatchSampler(c, 100, rank=0, world_size=2, shuffle=False)
    assert len(keep) == 4 and keep.dropped == (0, 0)
    drop = BinPackBatchSampler(c, 100, rank=0, world_size=2, shuffle=False, drop_last=True)
    assert len(drop) == 3 and drop.dropped == (1, 2)
    other = BinPackBatchSampler(c, 100, rank=1, world_size=2, shuffle=False, drop_last=True)
    seen = sorted(i for s in (drop, other) for b in s for i in b)
    assert seen == [0, 1, 2, 3, 4, 5]  # the two light graphs are what drop_last dropped


def test_oversize_policies_in_sampler():
    c = np.array([10.0, 20.0, 5000.0, 30.0, 40.0])
    with pytest.raises(ValueError, match="sample 2 has cost 5000"):
        BinPackBatchSampler(c, 100, rank=0, world_size=1)
    s = BinPackBatchSampler(c, 100, rank=0, world_size=1, oversize="solo")
    assert [2] in list(s)
    k = BinPackBatchSampler(c, 100, rank=0, world_size=1, oversize="skip")
    assert sorted(i for b in k for i in b) == [0, 1, 3, 4]


def test_constructor_errors():
    c = np.ones(10)
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        BinPackBatchSampler(c, 5, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        BinPackBatchSampler(c, 5, rank=0, world_size=0)
    with pytest.raises(ValueError, match="pass the mpi4py communicator"):
        BinPackBatchSampler(c[:5], 5, rank=0, world_size=2, local_indices=np.arange(5, 10))
    with pytest.raises(ValueError, match="cannot give each of 16 ranks"):
        BinPackBatchSampler(c, 5, rank=0, world_size=16)
    with pytest.raises(ValueError, match="empty"):
        BinPackBatchSampler([], 5, rank=0, world_size=1)
    # a permutation given as local_indices without comm is a global array in another order
    s = BinPackBatchSampler(
        np.arange(1.0, 11.0)[::-1], 20, rank=0, world_size=1, local_indices=np.arange(10)[::-1]
    )
    np.testing.assert_array_equal(s.costs, np.arange(1.0, 11.0))


@pytest.mark.parametrize("world_size", [2, 3, 5])
@pytest.mark.parametrize("n, capacity", [(5, 40), (7, 40), (40, 40), (9, 30), (13, 29)])
def test_eval_sampler_yields_every_structure_once_over_the_ranks(world_size, n, capacity):
    """evaluation=True: a set too small for the ranks and capacity is still evaluated, each once,
    with a non-empty batch on every rank at every step (mace runs one DDP forward per step)."""
    costs = np.random.default_rng(n).integers(1, 30, n).astype(float)
    if (
        n == 13
    ):  # near-capacity structures: one per bin, 13 bins do not split into steps of 2, 3, 5 ranks
        costs = np.full(n, 29.0)
        with pytest.raises(ValueError, match="non-empty batch"):
            BinPackBatchSampler(costs, capacity, rank=0, world_size=world_size, shuffle=False)
    ds = Graphs(costs)
    seen, lens = [], set()
    for rank in range(world_size):
        s = BinPackBatchSampler(
            costs, capacity, rank=rank, world_size=world_size, shuffle=False, evaluation=True
        )
        batches = epoch_batches(s, ds)
        lens.add(len(batches))
        assert len(batches) == len(s) and all(len(idx) > 0 for idx, _ in batches)
        seen += [i for idx, _ in batches for i in idx]
    assert len(lens) == 1  # the same number of steps on every rank
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("n, world_size", [(1, 2), (2, 3), (3, 5)])
def test_eval_set_smaller_than_the_ranks_is_evaluated_whole_on_every_rank(n, world_size):
    """Fewer structures than ranks: no rank may be empty, so each rank gets the whole set: every
    structure counted world_size times, which leaves means over the gathered results unchanged."""
    costs = np.arange(1.0, n + 1)
    with pytest.raises(
        ValueError, match=f"cannot give each of {world_size} ranks a non-empty batch"
    ):
        BinPackBatchSampler(costs, 40, rank=0, world_size=world_size)
    per_rank = [
        list(
            BinPackBatchSampler(
                costs, 40, rank=r, world_size=world_size, shuffle=False, evaluation=True
            )
        )
        for r in range(world_size)
    ]
    assert all(b == per_rank[0] for b in per_rank)
    assert sorted(i for b in per_rank[0] for i in b) == list(range(n))


# ------------------------------------------------------------------------------------- cost=auto
def auto_sampler(rank=0, world_size=1, **kwargs):
    """600 graphs of 3..300 atoms with 4, 12 or 24 edges per atom, calibrated on one epoch."""
    from cfm_plugins.sampler import AutoCostBatchSampler, CostCalibration

    rng = np.random.default_rng(11)
    atoms = rng.integers(3, 300, 600)
    edges = atoms * rng.choice([4, 12, 24], 600)
    cal = CostCalibration(warmup_steps=kwargs.pop("warmup_steps", 1), **kwargs)
    return (
        AutoCostBatchSampler(
            atoms,
            edges,
            atoms.astype(float),
            2000,
            rank=rank,
            world_size=world_size,
            seed=5,
            calibration=cal,
        ),
        atoms,
        edges,
    )


def time_epoch(sampler, atoms, edges, model=(2e-3, 1e-5, 2e-6)):
    """Iterate one epoch through a DataLoader and hand each batch's time to the sampler, as adapters
    do."""
    ds = Graphs(atoms)
    batches = []
    for idx, pos in DataLoader(ds, batch_sampler=sampler, collate_fn=collate):
        a, e = int(pos.shape[0]), int(edges[idx.numpy()].sum())
        sampler.record_step(
            atoms=a, edges=e, graphs=len(idx), cpu_s=model[0] + model[1] * a + model[2] * e
        )
        batches.append(sorted(idx.tolist()))
    return batches


def test_auto_cost_plans_the_first_epoch_with_the_initial_cost_then_with_the_fit(caplog):
    from cfm_plugins.sampler.autocost import fitted_costs
    from cfm_plugins.sampler.packing import CALIBRATION_LEVELS, pack_levels

    s, atoms, edges = auto_sampler()
    assert s.needs_step_times and s.cost_label == "initial"
    # calibration epoch: the atoms plan at several capacities
    assert s.plan().checksum() == pack_levels(atoms.astype(float), 2000, 1, seed=5).checksum()
    assert s.calibration.levels == CALIBRATION_LEVELS
    first = time_epoch(s, atoms, edges)
    with caplog.at_level("INFO", logger="cfm_plugins.sampler"):
        s.set_epoch(1)
    assert (
        "binpack cost=auto from epoch 1: step time = 2 ms + 10 us/atom + 2 us/edge" in caplog.text
    )
    assert s.cost_label == "auto-1" and len(s.calibrations) == 1 and not s.needs_step_times
    fit = s.calibrations[0].fit
    assert (fit.c0, fit.a, fit.b) == pytest.approx(
        (2e-3, 1e-5, 2e-6), rel=1e-6
    )  # exact times: exact fit
    costs = fitted_costs(fit, atoms, edges, atoms.astype(float))
    np.testing.assert_array_equal(s.costs, costs)
    refit = BinPackBatchSampler(costs, max(2000, costs.max()), rank=0, world_size=1, seed=5)
    refit.set_epoch(1)
    assert s.plan().checksum() == refit.plan().checksum()
    second = time_epoch(s, atoms, edges)
    assert sorted(i for b in second for i in b) == list(range(600)) and second != first


def test_auto_cost_calibrates_at_several_capacities_only_before_the_first_fit():
    """The epochs timed for the first fit are packed at the calibration levels (their step totals
    vary); the epochs after it, recalibration epochs included, plan with the fit at one capacity.
    Padded bins (``even``: a padded step takes one time whatever its counts), ``levels=(1.0,)``
    and a calibration given up keep the one-capacity plan of the initial cost."""
    s, atoms, edges = auto_sampler(recalibrate_every=1)
    plain = BinPackBatchSampler(atoms.astype(float), 2000, rank=0, world_size=1, seed=5)
    totals = s.plan().bin_costs(atoms)
    assert np.std(totals[totals > 1200]) / 2000 > 0.08 and len(s) > len(plain)
    time_epoch(s, atoms, edges)
    s.set_epoch(1)
    fitted = BinPackBatchSampler(s.costs, s.capacity, rank=0, world_size=1, seed=5)
    fitted.set_epoch(1)
    assert s.needs_step_times and s.plan().checksum() == fitted.plan().checksum()

    even, _, _ = auto_sampler()
    even.even = True
    assert (
        even.plan().checksum()
        == BinPackBatchSampler(atoms.astype(float), 2000, rank=0, world_size=1, seed=5, even=True)
        .plan()
        .checksum()
    )
    one, _, _ = auto_sampler(levels=(1.0,))
    assert one.plan().checksum() == plain.plan().checksum()
    gave_up, _, _ = auto_sampler()
    levels_plan = gave_up.plan().checksum()
    gave_up.calibration.give_up()
    assert gave_up.plan().checksum() == plain.plan().checksum() != levels_plan


def test_auto_cost_resume_plans_the_same_batches(tmp_path):
    from cfm_plugins.sampler.autocost import read_state, write_state

    s, atoms, edges = auto_sampler()
    time_epoch(s, atoms, edges)
    s.set_epoch(1)
    plans = {1: list(s)}
    s.set_epoch(2)
    plans[2] = list(s)
    write_state(tmp_path / "state.json", s.resume_state())  # through JSON, as the adapters keep it

    resumed, _, _ = auto_sampler()
    assert resumed.load_resume_state(read_state(tmp_path / "state.json"), epoch=1)
    for epoch in (1, 2):
        resumed.set_epoch(epoch)
        assert list(resumed) == plans[epoch], epoch
    assert not resumed.needs_step_times  # nothing to calibrate again
    fresh, _, _ = auto_sampler()  # resumed at epoch 0: the fit was made after it, calibrate anew
    assert (
        not fresh.load_resume_state(read_state(tmp_path / "state.json"), epoch=0)
        and fresh.needs_step_times
    )

    # mid-epoch: state_dict carries the fits too
    s.set_epoch(1)
    it = iter(s)
    done = [next(it) for _ in range(3)]
    state = s.state_dict()
    other, _, _ = auto_sampler()
    other.load_state_dict(state)
    assert done + list(other) == plans[1]

    # in the calibration epoch (no fit yet): the same plan of several capacities
    first, _, _ = auto_sampler()
    calibrating = list(first)
    it = iter(first)
    done = [next(it) for _ in range(5)]
    state = first.state_dict()
    assert state["cost_state"] is None
    again, _, _ = auto_sampler()
    again.load_state_dict(state)
    assert done + list(again) == calibrating and again.needs_step_times


def test_auto_cost_waits_for_timed_steps(caplog):
    """Passes over the loader without training (mace reads the training set for its statistics
    before it trains) time nothing: the plans keep the initial cost and the next timed epoch
    fits."""
    s, atoms, edges = auto_sampler()
    first = list(s)
    with caplog.at_level("INFO", logger="cfm_plugins.sampler"):
        s.set_epoch(1)
    assert "no timed training step in the epochs so far" in caplog.text
    assert s.cost_label == "initial" and s.needs_step_times and s.resume_state() is None
    assert len(first) == len(s)
    s.set_epoch(0)  # the trainer starts its own epochs
    time_epoch(s, atoms, edges)
    s.set_epoch(1)
    assert s.cost_label == "auto-1" and s.calibrations[0].from_epoch == 1


def test_auto_cost_too_few_steps_times_the_next_epoch_too(caplog):
    s, atoms, edges = auto_sampler(warmup_steps=0)
    ds = Graphs(atoms)
    for k, (idx, pos) in enumerate(DataLoader(ds, batch_sampler=s, collate_fn=collate)):
        if k < 2:  # an adapter that timed only 2 steps of the epoch
            s.record_step(
                atoms=int(pos.shape[0]),
                edges=int(edges[idx.numpy()].sum()),
                graphs=len(idx),
                cpu_s=0.01,
            )
    with caplog.at_level(logging.INFO, logger="cfm_plugins"):
        s.set_epoch(1)
        s.set_epoch(1)  # mace: its DistributedSampler's set_epoch, ours, then the iteration
        list(s)
    assert s.cost_label == "initial" and s.needs_step_times and len(s.calibration.records) == 2
    assert caplog.text.count("2 timed steps are too few to fit") == 1, caplog.text
    time_epoch(s, atoms, edges)
    s.set_epoch(2)
    assert s.cost_label == "auto-1" and s.calibrations[0].fit.steps >= 4


def test_auto_cost_recalibrates_every_k_epochs():
    s, atoms, edges = auto_sampler(recalibrate_every=2)
    for epoch in range(5):
        s.set_epoch(epoch)
        # the step cost changes after the first fit (a GPU warming up, a compiled model)
        time_epoch(s, atoms, edges, model=(2e-3, 1e-5, 2e-6) if epoch < 1 else (1e-3, 3e-5, 1e-6))
    assert [c.from_epoch for c in s.calibrations] == [1, 3]
    assert s.calibrations[1].fit.a == pytest.approx(3e-5, rel=1e-3) and s.needs_step_times


@pytest.mark.parametrize("n, world_size", [(1, 2), (2, 3), (3, 2)])
def test_training_sampler_repeats_so_every_rank_trains_at_every_step(n, world_size):
    """repeat=True (binpack's training loaders): a training set smaller than the ranks, or a last
    step short of bins, trains anyway with a few samples repeated, counted in ``repeated`` (issue
    24)."""
    costs = np.full(n, 9.0)
    per_rank = [
        BinPackBatchSampler(costs, 10, rank=r, world_size=world_size, seed=1, repeat=True)
        for r in range(world_size)
    ]
    assert len({len(s) for s in per_rank}) == 1 and all(
        s.repeated == per_rank[0].repeated for s in per_rank
    )
    batches = [list(s) for s in per_rank]
    assert all(len(b) == len(per_rank[0]) and all(len(x) > 0 for x in b) for b in batches)
    seen = sorted(i for b in batches for x in b for i in x)
    assert set(seen) == set(range(n)) and len(seen) == n + per_rank[0].repeated
    assert 0 < per_rank[0].repeated < world_size


def test_the_options_choose_the_packer():
    """Full bins (pack) by default, bins of even cost (pack_even) with ``even``, bins even in
    atoms and edges too (pack_even_dims) with ``even_dims`` set as well: the plan of epoch ``e``
    is that packer's plan from ``seed + e``."""
    from cfm_plugins.sampler import pack, pack_even, pack_even_dims

    rng = np.random.default_rng(2)
    atoms = rng.integers(1, 301, 120).astype(float)
    dims = np.column_stack([atoms, atoms * rng.integers(2, 81, 120)])
    cap = 8 * atoms.mean()
    s = BinPackBatchSampler(atoms, cap, rank=1, world_size=2, seed=4, repeat=True)
    s.set_epoch(1)
    full = pack(atoms, cap, 2, 5, repeat=True)
    assert s.plan().checksum() == full.checksum()
    s.even = True
    even = pack_even(atoms, cap, 2, 5, repeat=True)
    assert s.plan().checksum() == even.checksum() != full.checksum()
    s.even_dims = dims
    joint = pack_even_dims(atoms, dims, cap, 2, 5, repeat=True)
    assert s.plan().checksum() == joint.checksum() != even.checksum() and joint.limits is not None
    assert [sorted(b) for b in s] == [sorted(b.tolist()) for b in joint.rank_bins(1)]


def test_auto_cost_with_one_step_an_epoch_waits_out_the_warmup_then_fits(caplog):
    """One step per rank per epoch (6 structures on 2 ranks, as with NequIP's small example): every
    step of the first epoch is a warm-up step (the first 3 of a process). The sampler gave up after
    epoch 0 ("the ranks share no timed step"); it now says why it waits, times the next epochs and
    fits once it has the steps a fit needs."""
    from cfm_plugins.sampler import AutoCostBatchSampler, CostCalibration

    rng = np.random.default_rng(5)
    atoms = rng.integers(3, 40, 6)
    edges = atoms * rng.choice([4, 12, 24], 6)
    s = AutoCostBatchSampler(
        atoms,
        edges,
        atoms.astype(float),
        float(atoms.sum()),
        rank=0,
        world_size=2,  # without comm: this rank's records only, as on one rank
        calibration=CostCalibration(),
    )
    labels = []
    with caplog.at_level(logging.INFO, logger="cfm_plugins"):
        for epoch in range(9):
            s.set_epoch(epoch)
            labels.append(s.cost_label)
            assert len(s) == 1
            time_epoch(s, atoms, edges)
    assert "share no timed step" not in caplog.text and s.calibration.collecting is False
    assert caplog.text.count("timed so far on each rank is warm-up") == 1, caplog.text
    assert caplog.text.count("timed so far on each rank are warm-up") == 2, caplog.text
    assert "4 timed steps are too few to fit (5 needed, past the warm-up)" in caplog.text
    # epochs 3-7 give the 5 steps one rank's fit needs: the plans use it from epoch 8
    assert labels == ["initial"] * 8 + ["auto-1"], labels
    assert s.calibrations[0].fit.steps == 5


def test_batch_at_is_the_batch_the_pass_yields_at_that_step():
    """An adapter names the structures of the batch being trained with ``batch_at(first_step +
    k)``: on every rank, shuffled or not, from the start of an epoch or a resumed one."""
    rng = np.random.default_rng(3)
    costs = rng.integers(5, 60, size=80).astype(float)
    for shuffle in (True, False):
        samplers = [
            BinPackBatchSampler(costs, 150, rank=r, world_size=2, seed=4, shuffle=shuffle)
            for r in range(2)
        ]
        for s in samplers:
            for epoch in (0, 3):
                s.set_epoch(epoch)
                batches = list(s)
                assert s.first_step == 0
                assert [s.batch_at(k) for k in range(len(batches))] == batches
        s = samplers[1]
        state = s.state_dict(batches_consumed=2)
        s.load_state_dict(state)
        rest = list(s)
        assert s.first_step == 2 and [s.batch_at(2 + k) for k in range(len(rest))] == rest
        with pytest.raises(IndexError, match="is not in 0.."):
            s.batch_at(len(s))


# ------------------------------------------------------- no collective inside a loader's iteration
def probe(loader):
    """What a size probe does (HydraGNN's update_config): read one batch and stop."""
    return next(iter(loader))


@pytest.mark.parametrize("evaluation", [False, True])
def test_iterating_calls_no_collective_only_construction_and_set_epoch_do(atoms, evaluation):
    """Issue 83: a trainer may iterate a loader on some ranks only (HydraGNN's update_config stops
    at the first batch whose node count differs, so the ranks stop in different loaders), so a
    pass, partial or whole, ``len``, ``batch_at`` and a wrapper's ``select_epoch`` call no
    collective; the plan is checked across ranks at construction and at every ``set_epoch``."""
    comm = LoopbackComm(rank=1)
    s = BinPackBatchSampler(
        atoms,
        3072,
        rank=1,
        world_size=2,
        seed=3,
        comm=comm,
        evaluation=evaluation,
        shuffle=not evaluation,  # as binpack's evaluation loaders: one plan every epoch
    )
    assert comm.calls == 2  # the costs, then the plan and options
    ds = Graphs(atoms)
    dl = DataLoader(ds, batch_sampler=s, collate_fn=collate)
    with comm.forbid("iteration"):
        probe(dl)  # a size probe: one batch of the epoch, on this rank only
        first = [idx.tolist() for idx, _ in dl]
        probe(s)
        assert len(s) == len(first) and s.batch_at(0) == first[0]
        s.select_epoch(1)  # a wrapper's own epoch advance (one pass, one epoch)
        again = [idx.tolist() for idx, _ in dl]
    assert (again == first) == evaluation and comm.calls == 2
    s.set_epoch(2)  # the trainer's call on every rank: one check of the plan
    assert comm.calls == 3 and s.trainer_epochs == {2}
    with comm.forbid("iteration"):
        assert sorted(i for b in dl for i in b[0].tolist()) == sorted(
            i for b in s.plan().rank_bins(1, 2) for i in b.tolist()
        )


def test_ranks_with_different_plans_raise_at_set_epoch(atoms):
    """The plan check, out of the iteration, still catches ranks on different epochs or seeds: at
    the set_epoch where the plans part, naming the ranks and the options that differ."""

    class OtherRank(LoopbackComm):
        """Rank 1 answers the plan check with another plan (``other="plan"``), or another plan
        and another seed (``other="seed"``)."""

        other = None

        def allgather(self, obj):
            every = super().allgather(obj)
            if self.other and isinstance(obj, tuple) and isinstance(obj[1], tuple):
                options = dict(obj[1])
                options["seed"] += self.other == "seed"
                every[1] = ("0" * 32, tuple(options.items()))
            return every

    comm = OtherRank()
    s = BinPackBatchSampler(atoms[:300], 3072, rank=0, world_size=2, seed=3, comm=comm)
    s.set_epoch(0)
    comm.other = "plan"
    with pytest.raises(RuntimeError) as err:
        s.set_epoch(1)
    assert "disagree on the batch plan of epoch 1: ranks 1 differ from rank 0" in str(err.value)
    assert "options differ" not in str(err.value)
    comm.other = "seed"
    with pytest.raises(RuntimeError, match=r"options differ: seed: rank 0 3, rank 1 4\)"):
        s.set_epoch(2)


def auto_with_comm(comm, **kwargs):
    """auto_sampler's data and schedule, on rank 0 of ``comm``."""
    from cfm_plugins.sampler import AutoCostBatchSampler, CostCalibration

    rng = np.random.default_rng(11)
    atoms = rng.integers(3, 300, 600)
    edges = atoms * rng.choice([4, 12, 24], 600)
    cal = CostCalibration(warmup_steps=kwargs.pop("warmup_steps", 1), **kwargs)
    s = AutoCostBatchSampler(
        atoms,
        edges,
        atoms.astype(float),
        2000,
        rank=0,
        world_size=comm.size,
        seed=5,
        comm=comm,
        calibration=cal,
    )
    return s, atoms, edges


def timed_pass(sampler, comm, atoms, edges, steps=None, model=(2e-3, 1e-5, 2e-6)):
    """A training pass: the loader's iteration under ``comm.forbid``, each step handed over as an
    adapter does (``record_step`` may gather: every rank trains the same steps). ``steps``: time
    only the first ones."""
    it = iter(DataLoader(Graphs(atoms), batch_sampler=sampler, collate_fn=collate))
    k = 0
    while True:
        with comm.forbid("iteration"):
            batch = next(it, None)
        if batch is None:
            return k
        idx, pos = batch
        if steps is None or k < steps:
            a, e = int(pos.shape[0]), int(edges[idx.numpy()].sum())
            sampler.record_step(
                atoms=a, edges=e, graphs=len(idx), cpu_s=model[0] + model[1] * a + model[2] * e
            )
        k += 1


def test_cost_auto_gathers_in_set_epoch_never_while_iterating():
    """cost=auto: the records are gathered and the verdict shared at the trainer's set_epoch (every
    rank alike), not at a pass, also after a "too few steps" verdict and with passes of a probe
    between (a pass used to ask again for a fit and gather where other ranks did not)."""
    comm = LoopbackComm()
    s, atoms, edges = auto_with_comm(comm, warmup_steps=0)
    built = comm.calls
    with comm.forbid("a probe"):
        probe(s)
    timed_pass(s, comm, atoms, edges, steps=2)  # an adapter that timed 2 steps of epoch 0
    s.set_epoch(1)  # the records (2 gathers: records, verdict) and the plan check
    assert comm.calls == built + 3 and s.cost_label == "initial" and s.needs_step_times
    s.set_epoch(1)  # mace: its DistributedSampler's set_epoch, then ours: the verdict stands
    assert comm.calls == built + 4
    with comm.forbid("a probe"):
        probe(s)
        list(s)
    timed_pass(s, comm, atoms, edges)
    with comm.forbid("a probe"):
        probe(s)
    s.set_epoch(2)
    assert comm.calls == built + 7 and s.cost_label == "auto-1"
    assert s.calibrations[0].from_epoch == 2 and s.calibrations[0].fit.ranks == 2
    with comm.forbid("iteration"):
        assert sorted(i for b in s for i in b) == sorted(
            i for b in s.plan().rank_bins(0, 2) for i in b.tolist()
        )


def test_cost_auto_without_set_epoch_fits_at_the_last_timed_step_of_an_epoch(caplog):
    """A trainer that never calls set_epoch and only iterates (each pass a new epoch through a
    wrapper's select_epoch): the records are gathered at the last timed step of the epoch (every
    rank trains and hands over the same steps), the fit is taken at the next pass and plans from
    the next epoch on, as with set_epoch; no pass calls a collective."""
    from cfm_plugins.sampler.autocost import fitted_costs

    comm = LoopbackComm()
    s, atoms, edges = auto_with_comm(comm)
    built = comm.calls
    with comm.forbid("a probe"):
        probe(s)
    steps = len(s)
    seen = []
    real = comm.allgather

    def spy(obj):
        seen.append(s._timed_in[1])  # the step whose record_step gathers
        return real(obj)

    comm.allgather = spy
    assert timed_pass(s, comm, atoms, edges) == steps
    assert seen == [steps, steps] and comm.calls == built + 2  # records, then the verdict
    assert s.cost_label == "initial" and not s.calibrations  # the epoch's plan is left as it is
    with caplog.at_level(logging.INFO, logger="cfm_plugins.sampler"), comm.forbid("next pass"):
        s.select_epoch(1)
        assert s.cost_label == "auto-1" and s.calibrations[0].from_epoch == 1
        fit = s.calibrations[0].fit
        np.testing.assert_array_equal(s.costs, fitted_costs(fit, atoms, edges, atoms.astype(float)))
        list(s)
    assert (
        "binpack cost=auto from epoch 1: step time = 2 ms + 10 us/atom + 2 us/edge" in caplog.text
    )
    timed_pass(s, comm, atoms, edges)  # nothing is wanted any more: no gather
    assert comm.calls == built + 2 and not s.needs_step_times


def test_the_adapters_wrappers_iterate_without_collectives(atoms):
    """The mace adapter's EpochAdvancing (each pass a new epoch, or the epoch mace names) and the
    nequip adapter's LightningBatchSampler (Lightning's set_epoch on ``batch_sampler.sampler``):
    passes call no collective, however many a rank makes; the trainer's set_epoch checks the plan
    once and puts the rank on the epoch it trains. EpochAdvancing after ``load_state_dict`` keeps
    the restored position through mace's set_epoch of that epoch, which still reaches the check
    (every rank alike)."""
    from cfm_plugins_adapters.mace.loader import EpochAdvancing
    from cfm_plugins_adapters.nequip.loader import LightningBatchSampler

    ref = BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=3)
    ref.set_epoch(0)
    epoch0 = list(ref)
    for wrapper, set_epoch in (
        (EpochAdvancing, lambda w, e: w.set_epoch(e)),  # follow_mace_epochs, DistributedSampler
        (LightningBatchSampler, lambda w, e: w.sampler.set_epoch(e)),  # what Lightning calls
    ):
        comm = LoopbackComm()
        w = wrapper(BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=3, comm=comm))
        built = comm.calls
        with comm.forbid(f"a pass over {wrapper.__name__}"):
            probe(w)
            list(w)
            list(w)
        set_epoch(w, 0)
        assert comm.calls == built + 1, wrapper
        with comm.forbid(f"a pass over {wrapper.__name__}"):
            assert list(w) == epoch0, wrapper

    comm = LoopbackComm()
    inner = BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=3, comm=comm)
    inner.set_epoch(0)
    it = iter(inner)
    done = [next(it) for _ in range(3)]
    resumed = EpochAdvancing(
        BinPackBatchSampler(atoms, 3072, rank=0, world_size=2, seed=3, comm=comm)
    )
    resumed.load_state_dict(inner.state_dict())
    calls = comm.calls
    resumed.set_epoch(0)  # mace's call for the epoch it resumes
    assert comm.calls == calls + 1
    with comm.forbid("the resumed pass"):
        assert done + list(resumed) == epoch0
