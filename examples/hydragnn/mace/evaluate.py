"""Energies and forces of a trained MACE-stack checkpoint, loaded in plain HydraGNN.

From the folder ``train.py`` ran in::

    python evaluate.py clusters_emt_forces_MACE --out ef.npz            # HydraGNN alone
    python evaluate.py clusters_emt_forces_MACE --out ef.npz --fused    # and with the fused kernels

The checkpoint loads as HydraGNN loads it (:func:`load_checkpoint`), before anything of
cfm-plugins is imported (it checks): a checkpoint written under ``cfm-run --enable ...,fused`` is a
stock HydraGNN checkpoint. Energies (per graph, node energies summed) and forces (-dE/dpos) are
computed for the graphs of ``Dataset.path.total`` in the model's precision. ``--fused`` then
swaps the fused kernels in as ``cfm-run --enable ...,fused`` does (``patch_model`` with the
hydragnn adapter's interaction-block form), computes them again and prints the largest
differences. Writes ``energy``/``forces`` (and ``energy_fused``/``forces_fused``) to ``--out``.
"""

import argparse
import json
import os
import sys

import hydragnn
import numpy as np
import torch
import torch.distributed as dist


def energy_forces(model, batch, create_graph=False):
    """Total energies per graph and forces (-dE/dpos) of a PyG batch in the model's dtype, as
    HydraGNN's interatomic-potential loss computes them (node energies summed per graph);
    ``create_graph`` keeps the graph of the forces (to train on them)."""
    dtype = next(model.parameters()).dtype
    batch = batch.clone()
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and torch.is_floating_point(value):
            batch[key] = value.to(dtype)
    batch.pos.requires_grad_(True)
    node_energy = model(batch)[0].view(-1)
    energy = torch.zeros(batch.num_graphs, dtype=dtype).index_add(0, batch.batch, node_energy)
    forces = -torch.autograd.grad(energy.sum(), batch.pos, create_graph=create_graph)[0]
    return energy, forces


def energies_and_forces(model, graphs, batch_size=8):
    """Per-graph energies and per-atom forces of ``graphs`` (in order) as float64 numpy arrays."""
    from torch_geometric.loader import DataLoader

    energies, forces = [], []
    for data in DataLoader(graphs, batch_size=batch_size, shuffle=False):
        energy, force = energy_forces(model, data)
        energies.append(energy.detach().double().numpy())
        forces.append(force.detach().double().numpy())
    return np.concatenate(energies), np.concatenate(forces)


def load_checkpoint(log_name, path="./logs/"):
    """HydraGNN's model of ``log_name``, built from its saved config and loaded as HydraGNN loads
    it: the config HydraGNN saved beside the checkpoint (``logs/<log>/config.json``,
    ``create_model_config``), wrapped as in training and loaded with HydraGNN's own
    ``load_existing_model``."""
    with open(os.path.join(path, log_name, "config.json")) as fh:
        config = json.load(fh)
    if (
        not dist.is_initialized()
    ):  # HydraGNN's wrapper and loader expect a (here one-rank) process group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = hydragnn.models.create_model_config(config=config["NeuralNetwork"], verbosity=0)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = hydragnn.utils.distributed.distributed_model_wrapper(model, optimizer, 0)
    hydragnn.utils.model.load_existing_model(model, log_name, path, optimizer=optimizer)
    return model.module.eval(), config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "log", help="HydraGNN log name (the folder under ./logs/ with the checkpoint)"
    )
    parser.add_argument("--out", default="energies_forces.npz")
    parser.add_argument(
        "--fused", action="store_true", help="also with the fused kernels, and compare"
    )
    args = parser.parse_args(argv)

    model, config = load_checkpoint(args.log)
    graphs = torch.load(config["Dataset"]["path"]["total"], weights_only=False)
    energy, forces = energies_and_forces(model, graphs)
    loaded = sorted(
        m for m in sys.modules if m.split(".")[0] in ("cfm_plugins", "cfm_plugins_adapters")
    )
    if loaded:
        raise SystemExit(f"cfm-plugins modules were imported before the stock evaluation: {loaded}")
    print(f"{args.log}: loaded in HydraGNN alone; {len(graphs)} graphs, {forces.shape[0]} atoms")
    result = {"energy": energy, "forces": forces}
    if args.fused:
        from cfm_plugins.ops.patching import patch_model
        from cfm_plugins_adapters.hydragnn.interaction import register_form

        register_form()  # as under cfm-run with fused: HydraGNN's interaction blocks whole
        print("fused:", patch_model(model).describe())
        result["energy_fused"], result["forces_fused"] = energies_and_forces(model, graphs)
        for name in ("energy", "forces"):
            ref, new = result[name], result[name + "_fused"]
            print(
                f"{name}: largest difference {np.abs(new - ref).max():.3e}, relative to the "
                f"largest value {np.abs(new - ref).max() / np.abs(ref).max():.3e}"
            )
    np.savez(args.out, **result)


if __name__ == "__main__":
    main()
