"""Train HydraGNN's MACE stack as an interatomic potential (energies and forces) on EMT data.

From this folder, plain HydraGNN::

    mpirun -np 2 python train.py config.json

and the same script with balanced batches and the fused kernels::

    mpirun -np 2 cfm-run --enable hydragnn,binpack,fused -- python train.py config.json

Needs HydraGNN from source (its ``MACEStack``; HydraGNN 3.0 on PyPI has none): docs/hydragnn.md
says how to install it, and ``make venv-hydragnn-src`` makes ``.venv-hydragnn/`` with it. Nothing
here knows about cfm-plugins: the plugins meet HydraGNN's own calls (:func:`main`). The data set is
made when missing (:func:`load_or_make_dataset`); HydraGNN writes its logs and its checkpoint
under ``./logs/<log name>/``.
"""

import argparse
import json
import os
import random

import hydragnn

# not imported by `import hydragnn` (utils is a namespace package)
import hydragnn.utils.input_config_parsing
import hydragnn.utils.profiling_and_tracing.tracer as tr
import torch
import torch.distributed as dist
from hydragnn.preprocess.load_data import split_dataset


def load_or_make_dataset(dataset_config, world_rank):
    """The list of PyG graphs at ``Dataset.path.total`` (relative to the working directory); rank 0
    makes it first when it is missing, with :func:`cfm_plugins.datasets.clusters.make_dataset` and
    ``forces=True`` (molecules and metal clusters with EMT total energies and forces;
    ``Dataset.num_structures``, ``Dataset.max_atoms``)."""
    path = dataset_config["path"]["total"]
    if world_rank == 0 and not os.path.exists(path):
        from cfm_plugins.datasets.clusters import make_dataset

        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        graphs = make_dataset(
            dataset_config.get("num_structures", 200),
            seed=0,
            max_atoms=dataset_config.get("max_atoms", 100),
            forces=True,
        )
        torch.save(graphs, path + ".tmp")
        os.replace(path + ".tmp", path)
    if dist.is_initialized():
        # every rank, whether or not it saw the file: rank 0 may have written it already
        dist.barrier()
    return torch.load(path, weights_only=False)


def main(config_file, log_name=None, seed=0):
    """Train as HydraGNN's own examples do (``examples/LennardJones/LennardJones.py`` of its
    repository): ``setup_ddp``, ``create_dataloaders``, ``update_config``,
    ``create_model_config``, ``distributed_model_wrapper``,
    ``train_validate_test(..., compute_grad_energy=True)``, ``save_model``."""
    with open(config_file) as f:
        config = json.load(f)
    verbosity = config["Verbosity"]["level"]
    training = config["NeuralNetwork"]["Training"]

    # Always initialize for multi-rank training.
    world_size, world_rank = hydragnn.utils.distributed.setup_ddp()

    log_name = log_name or config["Dataset"]["name"] + "_MACE"
    hydragnn.utils.print.setup_log(log_name)
    writer = hydragnn.utils.model.get_summary_writer(log_name)

    dataset = load_or_make_dataset(config["Dataset"], world_rank)
    random.seed(seed)  # split_dataset shuffles with Python's random: the same split on every rank
    trainset, valset, testset = split_dataset(dataset, training["perc_train"], False)

    # Training.Batching (HydraGNN's node-budget batches), when the config has it, as
    # hydragnn.preprocess.load_data.dataset_loading_and_splitting passes it
    train_loader, val_loader, test_loader = hydragnn.preprocess.create_dataloaders(
        trainset, valset, testset, training["batch_size"], batching=training.get("Batching")
    )
    config = hydragnn.utils.input_config_parsing.update_config(
        config, train_loader, val_loader, test_loader
    )
    hydragnn.utils.input_config_parsing.save_config(config, log_name)

    model = hydragnn.models.create_model_config(config=config["NeuralNetwork"], verbosity=verbosity)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training["Optimizer"]["learning_rate"])
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="min", factor=0.5, patience=5, min_lr=0.00001
    )
    model, optimizer = hydragnn.utils.distributed.distributed_model_wrapper(
        model, optimizer, verbosity
    )

    tr.initialize()
    tr.disable()
    hydragnn.train.train_validate_test(
        model,
        optimizer,
        train_loader,
        val_loader,
        test_loader,
        writer,
        scheduler,
        config["NeuralNetwork"],
        log_name,
        verbosity,
        create_plots=False,
        compute_grad_energy=config["NeuralNetwork"]["Architecture"]["enable_interatomic_potential"],
        precision=training["precision"],
    )

    hydragnn.utils.model.save_model(model, optimizer, log_name)
    hydragnn.utils.profiling_and_tracing.print_timers(verbosity)
    if writer is not None:
        writer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="HydraGNN's MACE stack trained on EMT energies and forces"
    )
    parser.add_argument("config", help="HydraGNN JSON configuration")
    parser.add_argument(
        "--log", default=None, help="log name under ./logs/ (default: Dataset.name + _MACE)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the train/validation/test split"
    )
    args = parser.parse_args()
    main(args.config, args.log, args.seed)
