"""The demo's picture shows the batches of the run: stock mace's (its DistributedSampler, batch size
and seed) beside binpack's (the plugin's own plan, checked against the run's step log), both of
epoch 0 of mace's training set; drawn without training."""

from __future__ import annotations

import numpy as np
import pytest

from cfm_plugins.config import Config
from cfm_plugins.datasets.cuni import make_dataset
from cfm_plugins.distributed import DistInfo
from cfm_plugins.graph_sizes import GraphSizes
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from tests.helpers import load_example


@pytest.fixture(scope="module")
def demo():
    return load_example("demo.py")


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo_data")
    return make_dataset(folder, n_train=24, n_valid=4, n_test=2, seed=0, max_atoms=120)["train"]


def test_the_training_set_is_the_one_mace_loads(demo, train_file):
    """mace's own loader drops the IsolatedAtom entries (they give the E0s); the picture's
    structures are mace's, in mace's order."""
    from mace.data.utils import KeySpecification, load_from_xyz

    keys = KeySpecification(
        info_keys={"energy": "REF_energy", "stress": "REF_stress", "head": "head"},
        arrays_keys={"forces": "REF_forces"},
    )
    _, configs = load_from_xyz(train_file, keys, extract_atomic_energies=True)
    atoms = demo.training_atoms(train_file)
    assert atoms.tolist() == [len(c.atomic_numbers) for c in configs]
    assert len(atoms) == 24 and atoms.min() >= 4  # the isolated atoms (1 atom each) are out


def test_the_stock_batches_are_each_ranks_distributed_sampler_cut_into_batches(demo):
    stock = demo.stock_batches(30, 2)
    assert stock.world_size == 2 and stock.num_steps() == 4  # 15 per rank: 4, 4, 4, 3
    assert sorted(stock.indices.tolist()) == list(range(30))
    assert [len(b) for b in stock.rank_bins(0)] == [demo.BATCH_SIZE] * 3 + [3]
    assert stock.indices.tolist() != list(range(30))  # shuffled, as mace's sampler is
    assert stock.checksum() == demo.stock_batches(30, 2).checksum()
    assert stock.checksum() != demo.stock_batches(30, 2, epoch=1).checksum()
    odd = demo.stock_batches(31, 2)  # drop_last=True: the odd structure waits for a later epoch
    assert len(odd.indices) == 30 and len(set(odd.indices.tolist())) == 30


def test_the_binpack_batches_are_the_plugins_plan(demo, train_file):
    """What the binpack plugin builds for mace (its batch size, seed, CPU float64, each step's
    bins chosen by their edges) is the plan drawn."""
    atoms, edges = demo.training_atoms(train_file), demo.training_edges(train_file)
    assert edges.shape == atoms.shape and (edges > atoms).all()
    plan, capacity = demo.binpack_batches(atoms, 2, edges=edges)
    config = Config(enabled=["binpack"])
    sampler = create_manager(config).hook.cfm_batch_sampler(
        dataset=None,
        sizes=GraphSizes(atoms, edges),
        config=config,
        dist=DistInfo(rank=0, world_size=2),
        role="train",
        trainer=TrainerSettings(batch_size=demo.BATCH_SIZE, seed=demo.SEED, dtype="float64"),
    )
    sampler.set_epoch(0)
    assert sampler.capacity == capacity and sampler.plan().checksum() == plan.checksum()


def test_the_step_log_check_tells_the_trained_batches_from_others(demo):
    atoms = np.arange(1, 21) * 3
    plan, _ = demo.binpack_batches(atoms, 2)
    logged = [
        [{"epoch": 0, "atoms": int(atoms[b].sum())} for b in plan.rank_bins(r)]
        + [{"epoch": 1, "atoms": 1}]
        for r in range(2)
    ]
    assert demo.trained_as_planned(plan, atoms, logged)
    logged[1][0]["atoms"] += 1
    assert not demo.trained_as_planned(plan, atoms, logged)
    assert not demo.trained_as_planned(plan, atoms, logged[:1])


def test_the_picture_is_written(demo, train_file, tmp_path):
    atoms = demo.training_atoms(train_file)
    png, plan, capacity = demo.draw_picture(tmp_path, atoms, 2)
    assert png == str(tmp_path / "batches.png") and plan.bin_costs(atoms).max() <= capacity
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
