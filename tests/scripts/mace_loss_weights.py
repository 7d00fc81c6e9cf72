"""Under `mpirun -np 2 python -m tests.scripts.mace_loss_weights` (from the repository root): the
weight every graph and atom gets over one epoch in mace's own loss, measured by gradients, under
binpack's ``loss_weighting=stock`` and ``per_sample``.

Each rank reads only its shard of the sizes; the binpack sampler (for each weighting) agrees
on one plan over MPI; the mace adapter's training loader scales each real mace batch; mace's
``WeightedEnergyForcesStressLoss`` reduces over both ranks (gloo process group) and DDP averages
the gradients. The "model" is a probe: its prediction is the reference plus one parameter per graph
(energy: ``+ n_atoms * t_g``; stress: ``+ s_g``) and per atom (forces: ``+ u_a``), all 1, so the
gradient of the loss at each probe is ``2 x`` the weight that graph's (atom's) error has in the
step. Summed over the epoch's steps (gradients accumulate), rank 0 prints them as
``WEIGHTS {json}`` (one line per weighting): per graph (energy, stress), per atom (forces, summed
over x, y, z), the number of steps, graphs and atoms, and each graph's atom count.
"""

import json
import os
import socket

import mace  # noqa: F401  (before e3nn)
import numpy as np
import torch
import torch.distributed as dist
from mace import data as mace_data
from mace.modules.loss import WeightedEnergyForcesStressLoss
from mace.tools import AtomicNumberTable
from mace.tools.torch_geometric.dataloader import DataLoader
from mpi4py import MPI

from cfm_plugins.datasets.cuni import make_structures
from cfm_plugins.distributed import DistInfo, shutdown
from cfm_plugins.sampler import BinPackBatchSampler
from cfm_plugins_adapters.mace.loader import loss_scaled_loader_class

comm = MPI.COMM_WORLD
rank, world = comm.Get_rank(), comm.Get_size()
torch.set_default_dtype(torch.float64)

# the process group mace's reduce_loss and DDP use (rank 0 picks a free port)
if rank == 0:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
else:
    port = None
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(comm.bcast(port, root=0)))
dist.init_process_group("gloo", rank=rank, world_size=world)

# 48 CuNi structures of 4..192 atoms (bulk, slabs, clusters) with EMT labels, stress on bulk
frames = make_structures(48, seed=1, max_atoms=200)
keys = mace_data.KeySpecification(
    info_keys={"energy": "REF_energy", "stress": "REF_stress"}, arrays_keys={"forces": "REF_forces"}
)
z_table = AtomicNumberTable([28, 29])
dataset = [
    mace_data.AtomicData.from_config(
        mace_data.config_from_atoms(a, key_specification=keys), z_table=z_table, cutoff=4.0
    )
    for a in frames
]
for i, d in enumerate(dataset):
    d.sample_id = torch.tensor(
        [i]
    )  # collated like mace's own per-graph fields: which graphs a batch holds
atoms = np.array([len(a) for a in frames])
n, n_atoms = len(frames), int(atoms.sum())
first_atom = np.concatenate([[0], np.cumsum(atoms)[:-1]])

shard = np.arange(rank, n, world)  # each rank gives only its shard of the sizes


class Probe(torch.nn.Module):
    """Predictions = references + probe parameters (all 1); every parameter enters every forward,
    so DDP reduces all of them at every step."""

    def __init__(self):
        super().__init__()
        self.t = torch.nn.Parameter(torch.ones(n))  # per graph: energy error n_atoms * t
        self.s = torch.nn.Parameter(torch.ones(n))  # per graph: stress error s (every component)
        self.u = torch.nn.Parameter(torch.ones(n_atoms, 3))  # per atom: forces error u

    def forward(self, batch, graphs, atom_index):
        nat = (batch.ptr[1:] - batch.ptr[:-1]).to(torch.float64)
        touch = 0.0 * (self.t.sum() + self.s.sum() + self.u.sum())
        return {
            "energy": batch.energy + nat * self.t[graphs] + touch,
            "forces": batch.forces + self.u[atom_index],
            "stress": batch.stress + self.s[graphs].view(-1, 1, 1),
        }


loss_fn = WeightedEnergyForcesStressLoss(energy_weight=1.0, forces_weight=1.0, stress_weight=1.0)
for weighting in ("stock", "per_sample"):
    sampler = BinPackBatchSampler(
        atoms[shard],
        capacity=200,
        rank=rank,
        world_size=world,
        seed=11,
        comm=comm,
        local_indices=shard,
        atoms=atoms[shard],
        loss_weighting=weighting,
    )
    sampler.set_epoch(1)
    loader = loss_scaled_loader_class(DataLoader)(
        dataset=dataset, batch_sampler=sampler, cfm_sampler=sampler
    )
    probe = torch.nn.parallel.DistributedDataParallel(Probe())
    steps = 0
    for batch in loader:
        graphs = batch.sample_id
        atom_index = torch.cat(
            [torch.arange(first_atom[g], first_atom[g] + atoms[g]) for g in graphs.tolist()]
        )
        loss = loss_fn(pred=probe(batch, graphs, atom_index), ref=batch)
        loss.backward()  # DDP averages over the ranks; gradients accumulate over the epoch
        steps += 1
    grads = probe.module
    if rank == 0:
        print(
            "WEIGHTS "
            + json.dumps(
                {
                    "energy": (grads.t.grad / 2).tolist(),
                    "stress": (grads.s.grad / 2).tolist(),
                    "forces": (grads.u.grad.sum(dim=1) / 2).tolist(),
                    "steps": steps,
                    "graphs": n,
                    "atoms": n_atoms,
                    "atoms_per_graph": atoms.tolist(),
                    "has_stress": [float(d.stress_weight) for d in dataset],
                    "weighting": weighting,
                }
            ),
            flush=True,
        )
# end with no collective in flight and no object holding the process group, so its worker threads
# are joined here and not during interpreter finalization (where a thread that needs the GIL aborts)
del probe, loader, sampler
shutdown(DistInfo(rank=rank, world_size=world, backend="gloo"))
