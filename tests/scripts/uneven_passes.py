"""Under `mpirun -np 2 python -m tests.scripts.uneven_passes MODE` (from the repository root):
rank 0 reads a validation loader once more than rank 1 before training (a size probe, a rank-0
preview, a sanity check, as HydraGNN's update_config does), then both ranks train two epochs the
trainer's way, one collective per step as DDP makes. With a collective inside a loader's iteration
the ranks hang (or pair rank 0's plan check with another collective of rank 1's and fail).

MODE (argv[1]): ``mace``, ``hydragnn-atoms``, ``hydragnn-auto`` (cost=auto, every trained step
handed over as the adapter does) or ``nequip``: that adapter's loaders, their epochs set as the
trainer sets them (:func:`mace_loaders`, :func:`hydragnn_loaders`, :func:`nequip_loaders`).

Rank 0 prints ``OK {json}`` with what the test checks: per epoch, the training graphs of both
ranks and the validation graphs of both ranks (each pass), and the steps of each rank.
"""

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins.manager import Session, create_manager
from cfm_plugins.options import TrainerSettings

mode = sys.argv[1]
comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()


def session(enabled, options, batch_size):
    config = Config(enabled=enabled, options=options)
    create_manager(config)
    config.dist = DistInfo(rank=rank, world_size=world, comm=comm)
    return Session(config, TrainerSettings(batch_size=batch_size, seed=3))


def run_pass(loader, ids_of, record=None):
    """One pass as a trainer makes it: a synchronous step per batch (both ranks meet at each)."""
    ids, steps = [], 0
    for batch in loader:
        ids.extend(ids_of(batch))
        if record is not None:
            record(batch)
        comm.allreduce(1)  # DDP's gradient all-reduce: both ranks must be at this step
        steps += 1
    return ids, steps


def mace_loaders():
    """Mode ``mace``: the mace adapter's loaders (make_dataloader_factory over mace's DataLoader),
    real mace graphs; epochs through EpochAdvancing.set_epoch (follow_mace_epochs)."""
    import mace  # noqa: F401  (before e3nn)
    from mace import data as mace_data
    from mace.tools import AtomicNumberTable
    from mace.tools.torch_geometric.dataloader import DataLoader
    from torch.utils.data import ConcatDataset

    from cfm_plugins.datasets.cuni import make_structures
    from cfm_plugins_adapters.mace.loader import make_dataloader_factory

    frames = make_structures(30, seed=2, max_atoms=60)
    keys = mace_data.KeySpecification(
        info_keys={"energy": "REF_energy"}, arrays_keys={"forces": "REF_forces"}
    )
    table = AtomicNumberTable([28, 29])
    data = []
    for i, a in enumerate(frames):
        d = mace_data.AtomicData.from_config(
            mace_data.config_from_atoms(a, key_specification=keys), z_table=table, cutoff=4.0
        )
        d.sample_id = torch.tensor([i])  # collated per graph: which graphs a batch holds
        data.append(d)
    factory = make_dataloader_factory(DataLoader, session(["mace", "binpack"], {}, 4))
    gen = torch.Generator().manual_seed(3)
    # mace_run_train's calls for its training and validation loaders
    train = factory(
        dataset=ConcatDataset([data[:20]]),
        batch_size=4,
        shuffle=True,
        drop_last=True,
        generator=gen,
        num_workers=0,
    )
    valid = factory(
        dataset=data[20:],
        batch_size=4,
        shuffle=False,
        drop_last=False,
        generator=gen,
        num_workers=0,
    )

    def set_epoch(epoch):  # follow_mace_epochs' train_one_epoch (mace's own epochs)
        train.batch_sampler.set_epoch(epoch)

    return train, [valid], set_epoch, lambda b: b.sample_id.tolist(), (20, 10)


def hydragnn_loaders(cost):
    """Modes ``hydragnn-atoms`` and ``hydragnn-auto`` (``cost``: atoms or auto): the hydragnn
    adapter's loaders (balanced_loader over PyG's DataLoader), PyG graphs; epochs through
    loader.sampler.set_epoch on all three loaders (HydraGNN's loop)."""
    from torch_geometric.loader import DataLoader

    from cfm_plugins.datasets.clusters import make_dataset
    from cfm_plugins_adapters.hydragnn.loader import balanced_loader

    graphs = make_dataset(40, seed=0)  # examples/hydragnn's graphs: train batches of one size
    for i, g in enumerate(graphs):
        g.idx = torch.tensor([i])
    splits = graphs[:32], graphs[32:36], graphs[36:]  # HydraGNN's split_dataset(0.8)
    s = session(["hydragnn", "binpack"], {"cost": cost}, 8)
    loaders = [
        balanced_loader(DataLoader, d, r, s) for d, r in zip(splits, ("train", "valid", "test"))
    ]

    def set_epoch(epoch):  # HydraGNN's train_validate_test: every loader, every epoch
        for loader in loaders:
            loader.sampler.set_epoch(epoch)

    return loaders[0], loaders[1:], set_epoch, lambda b: b.idx.tolist(), (32, 4, 4)


def nequip_loaders():
    """Mode ``nequip``: the nequip adapter's LightningBatchSampler over binpack's samplers in a
    torch DataLoader; epochs as Lightning sets them (batch_sampler.sampler.set_epoch)."""
    from torch.utils.data import DataLoader

    from benchmarks.workload import paper_mix
    from cfm_plugins.sampler import BinPackBatchSampler
    from cfm_plugins_adapters.nequip.loader import LightningBatchSampler

    atoms = paper_mix(600, seed=4)
    n_train = 480
    loaders = []
    for role, idx in (("train", np.arange(n_train)), ("val", np.arange(n_train, len(atoms)))):
        shard = np.arange(rank, len(idx), world)  # each rank gives its shard's sizes
        sampler = BinPackBatchSampler(
            atoms[idx][shard],
            3072,
            rank=rank,
            world_size=world,
            seed=3,
            comm=comm,
            local_indices=shard,
            shuffle=role == "train",
            evaluation=role != "train",
            repeat=role == "train",
        )  # as binpack builds them
        loaders.append(
            DataLoader(
                [int(i) for i in idx],
                batch_sampler=LightningBatchSampler(sampler),
                collate_fn=lambda items: items,
            )
        )

    def set_epoch(epoch):  # Lightning: batch_sampler.sampler of every loader of the loop
        for loader in loaders:
            loader.batch_sampler.sampler.set_epoch(epoch)

    return loaders[0], loaders[1:], set_epoch, list, (n_train, len(atoms) - n_train)


if mode == "mace":
    train, evals, set_epoch, ids_of, sizes = mace_loaders()
elif mode.startswith("hydragnn-"):
    train, evals, set_epoch, ids_of, sizes = hydragnn_loaders(mode.split("-", 1)[1])
elif mode == "nequip":
    train, evals, set_epoch, ids_of, sizes = nequip_loaders()
else:
    raise SystemExit(f"unknown mode {mode!r}")

record = None
sampler = getattr(train.batch_sampler, "batch_sampler", train.batch_sampler)
if getattr(sampler, "needs_step_times", False):  # cost=auto: hand every step over, as adapters do

    def record(batch):
        if sampler.needs_step_times:
            n = int(batch.num_nodes)
            sampler.record_step(
                n, int(batch.edge_index.shape[1]), int(batch.num_graphs), None, 1e-3 * n
            )


# before training: rank 0 reads a batch of the training loader and all of the validation loader,
# rank 1 neither (HydraGNN's update_config stops at different loaders on different ranks)
if rank == 0:
    next(iter(train))
    for _ in evals[0]:  # no step collective here: rank 1 is not reading
        pass

epochs = []
for epoch in (0, 1):
    set_epoch(epoch)
    trained, steps = run_pass(train, ids_of, record)
    evaluated = [run_pass(loader, ids_of) for loader in evals]
    epochs.append(
        {
            "train": trained,
            "steps": steps,
            "eval": [ids for ids, _ in evaluated],
            "eval_steps": [n for _, n in evaluated],
        }
    )

every = comm.gather(epochs, root=0)
if rank == 0:
    out = []
    for e in range(2):
        out.append(
            {
                "train": sorted(i for r in every for i in r[e]["train"]),
                "steps": [r[e]["steps"] for r in every],
                "eval": [
                    sorted(i for r in every for i in r[e]["eval"][k]) for k in range(len(evals))
                ],
                "eval_steps": [[r[e]["eval_steps"][k] for r in every] for k in range(len(evals))],
            }
        )
    print("OK " + json.dumps({"sizes": sizes, "epochs": out}), flush=True)
