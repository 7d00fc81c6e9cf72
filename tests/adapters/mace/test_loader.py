"""The mace adapter's loader seam: which loader is which, its errors, and the epoch it packs."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from torch.utils.data import ConcatDataset

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.graph_sizes import GraphSizes
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from cfm_plugins.sampler import BinPackBatchSampler
from cfm_plugins_adapters.mace.loader import (
    EpochAdvancing,
    batch_sampler_for,
    drop_last_note,
    guess_role,
    loader_role,
    mace_role,
)


def _roles_in_run_train(datasets, **local):
    """The roles :func:`mace_role` gives ``datasets`` from inside a function of a module named
    ``mace.cli.run_train`` whose local variables are ``local`` (as mace's ``run()`` has them)."""
    namespace = {"__name__": "mace.cli.run_train"}
    exec(
        "def run(probe, train_set=None, train_sets=None, valid_sets=None, test_sets=None):\n"
        "    return probe()\n",
        namespace,
    )

    def probe():
        frame = sys._getframe(1)
        return [mace_role(d, frame) for d in datasets]

    return namespace["run"](probe, **local)


def test_roles_come_from_the_datasets_mace_run_train_holds_whatever_their_type():
    """A validation set of HDF5 shards is a ConcatDataset, as the training set is: the role is that
    of the variable of mace's run() holding the very dataset (issue 83), for every head."""
    train_a, train_b, shards, listed, test = [1], [2], ConcatDataset([[3], [4]]), [5], [6]
    train_set = ConcatDataset([train_a, train_b])
    local = dict(
        train_set=train_set,
        train_sets={"Default": train_a, "pt_head": train_b},
        valid_sets={"Default": shards, "pt_head": listed},
        test_sets={"part0_test": test},
    )
    everything = [train_set, train_a, train_b, shards, listed, test, ConcatDataset([[7]])]
    assert _roles_in_run_train(everything, **local) == [
        "train",
        "train",
        "train",
        "valid",
        "valid",
        "test",
        None,  # a dataset mace does not hold
    ]
    # outside mace_run_train: no role from the frames
    assert mace_role(shards, sys._getframe()) is None


def test_a_loader_built_outside_mace_run_train_is_guessed_with_a_warning(caplog):
    config = Config(enabled=["binpack"])
    with caplog.at_level(logging.WARNING, logger="cfm_plugins.mace"):
        role = loader_role([1, 2], False, None, {"generator": object()}, sys._getframe(), config)
        again = loader_role([1, 2], False, None, {"generator": object()}, sys._getframe(), config)
    assert role == again == "valid"
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "taken for a valid loader from its arguments" in said[0], said


def test_guess_role_tells_mace_run_train_loaders_apart():
    """The calls of mace 0.3.16's run_train (cli/run_train.py) for its train, valid and test
    loaders."""
    data = [1, 2, 3]
    gen = {"generator": object(), "pin_memory": False, "num_workers": 0}
    assert guess_role(ConcatDataset([data]), False, object(), gen) == "train"  # --distributed
    assert guess_role(ConcatDataset([data]), True, None, gen) == "train"
    assert guess_role(data, True, None, gen) == "train"  # the per-head training loader
    assert guess_role(data, False, object(), gen) == "valid"
    assert guess_role(data, False, None, gen) == "valid"
    assert (
        guess_role(data, True, None, {"num_workers": 0, "pin_memory": False}) == "test"
    )  # one rank
    assert (
        guess_role(data, False, None, {"num_workers": 0, "pin_memory": False}) == "test"
    )  # --distributed


@pytest.mark.parametrize(
    "role, where", [("train", "--train_file"), ("valid", "--valid_file"), ("test", "--test_file")]
)
def test_a_set_smaller_than_the_ranks(role, where):
    """Every loader gets a plan: training repeats the structure (as DistributedSampler pads,
    issue 24), evaluation has every rank evaluate it; an error still names the loader and its
    file."""
    config = Config(enabled=["binpack"], options={"max_tokens": 100})
    pm = create_manager(config)
    sizes = GraphSizes(np.array([12]), np.array([60]))
    dist = DistInfo(rank=1, world_size=2)
    for rank in (0, 1):  # no rank may be empty under DDP
        sampler = batch_sampler_for(
            pm.hook,
            [object()],
            sizes,
            config,
            DistInfo(rank=rank, world_size=2),
            role,
            TrainerSettings(),
        )
        assert list(sampler) == [[0]]
    with pytest.raises(
        ValueError,
        match=rf"mace_run_train's {role} loader, .*\({where}.*\) with 1 structure\(s\) "
        r"on 2 rank\(s\): sample 0 has cost 12 > capacity 10",
    ):
        small = Config(enabled=["binpack"], options={"max_tokens": 10})
        batch_sampler_for(
            create_manager(small).hook, [object()], sizes, small, dist, role, TrainerSettings()
        )


def test_epoch_advancing_follows_the_epoch_mace_names():
    """What follow_mace_epochs does for a resumed run: the plan of the epoch mace restarts at."""
    costs = np.random.default_rng(0).integers(1, 40, 300).astype(float)
    plan = {}
    ref = BinPackBatchSampler(costs, 200, rank=0, world_size=1, seed=4)
    for e in range(4):
        ref.set_epoch(e)
        plan[e] = list(ref)
    assert plan[0] != plan[2]
    resumed = EpochAdvancing(BinPackBatchSampler(costs, 200, rank=0, world_size=1, seed=4))
    list(resumed)  # e.g. a statistics pass over the loader before training
    resumed.set_epoch(2)  # mace restarts at the epoch of its latest checkpoint
    assert list(resumed) == plan[2]
    # a saved mid-epoch position (bare-sampler state) continues at the same epoch and batch
    again = EpochAdvancing(BinPackBatchSampler(costs, 200, rank=0, world_size=1, seed=4))
    again.load_state_dict({"epoch": 2, "seed": 4, "batches_consumed": 3, "world_size": 1})
    again.set_epoch(2)  # mace's own set_epoch for that epoch keeps the position
    assert list(again) == plan[2][3:]
    assert list(again) == plan[3]  # the next pass is epoch 3, from its start


def test_mace_metrics_are_unchanged_when_every_structure_is_counted_equally_often():
    """Why a set smaller than the ranks may be evaluated whole on every rank: mace's MACELoss (what
    evaluate() gathers over the ranks) gives the same loss, MAE and RMSE when each structure is
    counted W times; only the 95th percentiles (interpolated) may move."""
    import mace  # noqa: F401  (before e3nn)
    import torch
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from mace import data, modules, tools
    from mace.data.utils import KeySpecification
    from mace.tools import torch_geometric
    from mace.tools.train import MACELoss

    frames = []
    for i in range(3):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((1, 1, 1 + i))
        a.rattle(0.05, seed=i)
        a.calc = EMT()
        a.info["REF_energy"], a.arrays["REF_forces"] = a.get_potential_energy(), a.get_forces()
        a.calc = None
        frames.append(a)
    keys = KeySpecification(
        info_keys={"energy": "REF_energy"}, arrays_keys={"forces": "REF_forces"}
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        graphs = [
            data.AtomicData.from_config(c, z_table=tools.AtomicNumberTable([29]), cutoff=4.0)
            for c in data.config_from_atoms_list(frames, key_specification=keys)
        ]
        batch = torch_geometric.Batch.from_data_list(graphs)
        gen = torch.Generator().manual_seed(0)
        output = {
            "energy": batch.energy + torch.randn(batch.energy.shape, generator=gen),
            "forces": batch.forces + torch.randn(batch.forces.shape, generator=gen),
        }
        loss_fn = modules.WeightedEnergyForcesLoss(energy_weight=1.0, forces_weight=10.0)

        def metrics(times):
            m = MACELoss(loss_fn=loss_fn)
            for _ in range(times):
                m.update(batch, output)
            return m.compute()[1]

        once, thrice = metrics(1), metrics(3)
    finally:
        torch.set_default_dtype(previous)
    for key in (
        "loss",
        "mae_e",
        "rmse_e",
        "rmse_e_per_atom",
        "mae_f",
        "rmse_f",
        "rel_mae_f",
        "rel_rmse_f",
    ):
        assert thrice[key] == pytest.approx(once[key], rel=1e-12), key


@pytest.mark.parametrize(
    "where", ["cfm-run -o", "--cfm-max-tokens in the trainer command", "the environment (X)"]
)
def test_an_oversized_structure_names_where_max_tokens_was_set(where):
    """The hint after the sampler's message names the source of max_tokens the user used."""
    config = Config(
        enabled=["binpack"], options={"max_tokens": 10}, option_sources={"max_tokens": where}
    )
    sizes = GraphSizes(np.array([12, 4]), np.array([60, 10]))
    with pytest.raises(ValueError) as err:
        batch_sampler_for(
            create_manager(config).hook,
            [object(), object()],
            sizes,
            config,
            DistInfo(rank=0, world_size=1),
            "train",
            TrainerSettings(),
        )
    assert str(err.value).endswith(f"(the capacity is binpack's max_tokens=10, from {where})")
    if not where.startswith("--cfm"):
        assert "--cfm-max-tokens" not in str(err.value)


def test_drop_last_note_says_which_samples_oversize_skip_left_out():
    sizes = GraphSizes(np.array([12, 4, 3]), np.array([60, 10, 8]))
    notes = {}
    for oversize in ("skip", "solo"):
        config = Config(enabled=["binpack"], options={"max_tokens": 10, "oversize": oversize})
        sampler = batch_sampler_for(
            create_manager(config).hook,
            [object()] * 3,
            sizes,
            config,
            DistInfo(rank=0, world_size=1),
            "valid",
            TrainerSettings(),
        )
        notes[oversize] = drop_last_note(sampler, config)
    assert notes["solo"].endswith("every sample is used")
    assert notes["skip"].endswith(
        "every sample is used but the 1 costlier than the capacity, which oversize=skip leaves out"
    )
