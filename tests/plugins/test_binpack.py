"""The binpack plugin's sampler hook: training loaders repeat a few samples where a set cannot give
every rank a batch (as DistributedSampler pads) and say how many; evaluation loaders do not repeat;
the choice of loss weighting: what the option asks, what the adapter can apply."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.graph_sizes import GraphSizes
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings


def batch_sampler(role: str, n: int, rank: int = 0, world_size: int = 2):
    config = Config(enabled=["binpack"], options={"max_tokens": "10"})
    pm = create_manager(config)
    return pm.hook.cfm_batch_sampler(
        dataset=None,
        sizes=GraphSizes(np.full(n, 9)),
        config=config,
        dist=DistInfo(rank=rank, world_size=world_size),
        role=role,
        trainer=TrainerSettings(seed=0),
    )


def test_a_training_set_smaller_than_the_ranks_trains_with_a_repeat_and_says_so(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    samplers = [batch_sampler("train", 1, rank) for rank in (0, 1)]
    assert [list(s) for s in samplers] == [[[0]], [[0]]]  # both ranks train on the one structure
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        len(said) == 2
        and "binpack train: 1 sample(s) do not give each of 2 ranks a batch at every step: "
        "1 of them repeated"
        in said[0]
    ), said


def test_evaluation_and_large_enough_sets_are_not_repeated(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    assert batch_sampler("train", 4).repeated == 0
    valid = [batch_sampler("valid", 3, rank) for rank in (0, 1)]
    assert valid[0].repeated == 0 and sorted(i for s in valid for b in s for i in b) == [
        0,
        1,
        2,
    ]  # once each
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    with pytest.raises(
        ValueError, match="non-empty batch"
    ):  # the sampler without repeat (a library user's)
        from cfm_plugins.sampler import BinPackBatchSampler

        BinPackBatchSampler(np.full(1, 9.0), 10, rank=0, world_size=2)


LINEAR = TrainerSettings(
    batch_size=4, loss="mace_run_train --loss weighted", loss_weightings=("stock", "per_sample")
)
HUBER = TrainerSettings(
    batch_size=4, loss="mace_run_train --loss huber", loss_weightings=("stock",)
)


def sampler(options, trainer, role="train"):
    config = Config(enabled=["binpack"], options=dict(options))
    pm = create_manager(config)
    atoms = np.random.default_rng(0).integers(1, 200, 60)
    return pm.hook.cfm_batch_sampler(
        dataset=list(range(60)),
        sizes=GraphSizes(atoms),
        config=config,
        dist=DistInfo(rank=0, world_size=2),
        role=role,
        trainer=trainer,
    )


def test_per_sample_where_the_trainer_can_apply_it_training_only():
    assert sampler({"loss_weighting": "per_sample"}, LINEAR).loss_weighting == "per_sample"
    assert sampler({"loss_weighting": "per_sample"}, LINEAR, role="valid").loss_weighting == "stock"
    assert sampler({"loss_weighting": "per_sample"}, LINEAR, role="test").loss_weighting == "stock"
    assert sampler({"loss_weighting": "stock"}, LINEAR).loss_weighting == "stock"


def test_a_loss_that_cannot_be_reweighted_is_an_error_when_asked_for():
    with pytest.raises(
        ValueError,
        match=r"binpack loss_weighting=per_sample: mace_run_train --loss huber cannot be "
        r"reweighted per sample .*set loss_weighting=stock or change the loss",
    ):
        sampler({"loss_weighting": "per_sample"}, HUBER)


def test_the_default_is_per_sample_and_falls_back_to_stock_saying_so(caplog):
    from cfm_plugins.plugins import binpack

    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    config = Config(enabled=["binpack"])
    create_manager(config)
    assert config.get("loss_weighting") == "per_sample"
    assert sampler({}, LINEAR).loss_weighting == "per_sample"
    assert (
        sampler({}, LINEAR, role="valid").loss_weighting == "stock"
    )  # evaluation: never reweighted
    assert (
        binpack.training_loss_weighting(config, HUBER) == "stock"
    )  # not set explicitly: said, no error
    said = [r for r in caplog.records if "cannot be reweighted per sample" in r.getMessage()]
    assert said and "using loss_weighting=stock" in said[-1].getMessage()
    assert all(
        r.levelno < logging.WARNING for r in caplog.records
    )  # the default path: not a warning


def test_the_log_says_how_unequal_the_trainers_own_means_are(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    sampler({}, LINEAR)
    assert "binpack loss_weighting=" in caplog.text and "graphs up to" in caplog.text


def test_a_loss_that_cannot_be_reweighted_is_refused_once_the_loss_is_known_without_the_capacity():
    """`-o loss_weighting=per_sample` with `--loss=huber` was refused after the data was read
    (18 s, a traceback) with "(the capacity is --cfm-max-tokens)" appended: now as soon as the
    adapter hands the trainer's settings over (before any data), a usage error cfm-run says once
    (exit 2)."""
    from cfm_plugins.options import UsageError

    config = Config(
        enabled=["binpack"],
        options={"loss_weighting": "per_sample"},
        option_sources={"loss_weighting": "cfm-run -o"},
    )
    pm = create_manager(config)
    pm.hook.cfm_trainer_settings(config=config, trainer=LINEAR)
    with pytest.raises(UsageError) as err:
        pm.hook.cfm_trainer_settings(config=config, trainer=HUBER)
    assert "mace_run_train --loss huber cannot be reweighted per sample" in str(err.value)
    assert "(loss_weighting from cfm-run -o)" in str(err.value)
    assert "capacity" not in str(err.value)
    pm.hook.cfm_trainer_settings(config=config, trainer=TrainerSettings())  # loss not known yet


def test_the_capacity_hint_of_mace_is_added_only_to_messages_about_the_capacity():
    from cfm_plugins.options import UsageError
    from cfm_plugins_adapters.mace.loader import batch_sampler_for

    class Refusing:
        def __init__(self, exc):
            self.exc = exc

        def cfm_batch_sampler(self, **kwargs):
            raise self.exc

    dist = DistInfo(rank=0, world_size=2)
    for exc, hint in (
        (ValueError("sample 3 has cost 90 > capacity 50"), True),
        (UsageError("binpack loss_weighting=per_sample: ... huber cannot be reweighted"), False),
    ):
        with pytest.raises(ValueError) as err:
            batch_sampler_for(Refusing(exc), [0] * 5, None, None, dist, "train", LINEAR)
        assert type(err.value) is type(exc)
        assert ("(the capacity is binpack's max_tokens" in str(err.value)) == hint, str(err.value)
        assert "the training set (--train_file) with 5 structure(s)" in str(err.value)


def test_one_step_is_said_in_the_singular(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.binpack")
    config = Config(enabled=["binpack"], options={"max_tokens": "1000"})
    pm = create_manager(config)
    for _ in range(2):  # mace builds its training loader twice: said once
        pm.hook.cfm_batch_sampler(
            dataset=None,
            sizes=GraphSizes(np.full(4, 9)),
            config=config,
            dist=DistInfo(rank=0, world_size=2),
            role="train",
            trainer=TrainerSettings(seed=0),
        )
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("binpack train")]
    assert said == ["binpack train: 1 step on each of 2 ranks, capacity 1000 (atoms)"], said


def test_the_planned_balance_of_every_epoch_and_the_step_times_are_kept_for_the_end():
    s = sampler({"max_tokens": "400"}, LINEAR)
    assert np.isnan(s.planned_lif()[0]) and s.step_times().shape == (0, 2)
    want = []
    for epoch in range(3):
        s.set_epoch(epoch)
        for _ in s:
            s.record_time(wall_s=0.5, cpu_s=None)
        want.append(lif_of(s.plan().step_costs(s.costs, 2)))
    overall, by_epoch = s.planned_lif()
    np.testing.assert_allclose(by_epoch, want, rtol=1e-12)
    steps = [s.packing_of_epoch(e).step_costs(s.costs, 2) for e in range(3)]
    assert overall == pytest.approx(lif_of(np.concatenate(steps)), rel=1e-12)
    assert s.timed_epochs == {0, 1, 2}
    assert s.planned_lif({1}) == (pytest.approx(want[1], rel=1e-12), [want[1]])
    times = s.step_times()
    assert times.shape == (sum(len(x) for x in steps), 2)
    assert np.all(times[:, 0] == 0.5) and np.all(times[:, 1] == -1)  # the CPU clock not taken


def lif_of(step_costs) -> float:
    from cfm_plugins.sampler import load_imbalance_factor

    return load_imbalance_factor(step_costs)


def test_step_balance_is_a_declared_option_defaulting_to_edges():
    from cfm_plugins.plugins.binpack import cfm_declare_options

    option = {o.name: o for o in cfm_declare_options()}["step_balance"]
    assert option.default == "edges" and tuple(option.choices) == ("edges", "cost")
    with pytest.raises(Exception, match="step_balance"):
        create_manager(Config(enabled=["binpack"], options={"step_balance": "atoms"}))


@pytest.mark.parametrize(
    "options, wants",
    [
        ({}, "wanted"),  # cost=atoms, step_balance=edges: used where the sizes carry them
        ({"step_balance": "cost"}, False),
        ({"cost": "edges"}, True),
        ({"cost": "edges", "step_balance": "cost"}, True),
        ({"cost": "auto"}, True),
    ],
)
def test_the_edges_are_asked_for_where_the_cost_or_the_step_balance_uses_them(options, wants):
    config = Config(enabled=["binpack"], options=options)
    assert create_manager(config).hook.cfm_needs_edges(config=config) == [wants]


def sampler_with_edges(options, sizes):
    config = Config(enabled=["binpack"], options={"max_tokens": "400", **options})
    return create_manager(config).hook.cfm_batch_sampler(
        dataset=None,
        sizes=sizes,
        config=config,
        dist=DistInfo(rank=0, world_size=2),
        role="train",
        trainer=LINEAR,
    )


def test_under_cost_atoms_the_steps_are_chosen_by_the_edges_under_cost_edges_by_the_cost():
    rng = np.random.default_rng(4)
    atoms = rng.integers(1, 200, 300)
    edges = atoms * rng.integers(4, 60, 300)
    with_edges = GraphSizes(atoms, edges)
    s = sampler_with_edges({}, with_edges)
    np.testing.assert_array_equal(s.step_sizes, edges)
    from cfm_plugins.sampler import pack

    assert s.plan().checksum() == pack(atoms, 400, 2, 0, repeat=True, step_sizes=edges).checksum()
    assert sampler_with_edges({"step_balance": "cost"}, with_edges).step_sizes is None
    assert sampler_with_edges({"cost": "edges", "max_tokens": "9e9"}, with_edges).step_sizes is None
    assert sampler_with_edges({}, GraphSizes(atoms)).step_sizes is None  # no edges read: the cost
