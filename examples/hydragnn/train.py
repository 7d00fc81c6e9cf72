"""Train a HydraGNN model on the EMT clusters-and-molecules set, as HydraGNN's own examples do.

Plain HydraGNN (no cfm-plugins involved), from this folder::

    mpirun -np 2 python train.py config.json

The same script with balanced batches (the ``cfm_plugins`` key of config.json, or ``--enable``)::

    mpirun -np 2 cfm-run -- python train.py config.json
    mpirun -np 2 cfm-run --enable hydragnn,binpack -- python train.py config.json

Nothing in the training knows about cfm-plugins: the plugins meet HydraGNN's own calls
(``setup_ddp``, ``create_dataloaders``, ``get_distributed_model``). The data set is made when
missing (:func:`load_or_make_dataset`); HydraGNN writes its logs and model under ``./logs/``.
"""

import argparse
import json
import os

import hydragnn
import hydragnn.utils.tracer as tr
import torch


def load_or_make_dataset(path, world_rank):
    """The list of PyG graphs at ``path`` (``Dataset.path.total``, relative to the working
    directory); rank 0 makes it first when it is missing, with ``cfm_plugins.datasets.clusters``
    (what ``make_dataset.py`` beside this file writes)."""
    if not os.path.exists(path):
        if world_rank == 0:
            from cfm_plugins.datasets.clusters import make_dataset

            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            torch.save(make_dataset(400, seed=0), path + ".tmp")
            os.replace(path + ".tmp", path)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
    return torch.load(path, weights_only=False)


def main(config_file, log_dir=None, seed=0):
    with open(config_file) as f:
        config = json.load(f)
    verbosity = config["Verbosity"]["level"]
    torch.manual_seed(seed)

    # Always initialize for multi-rank training.
    world_size, world_rank = hydragnn.utils.setup_ddp()

    arch = config["NeuralNetwork"]["Architecture"]
    log_name = log_dir or f"{config['Dataset']['name']}_{arch['model_type']}"
    hydragnn.utils.setup_log(log_name)

    # relative to the working directory, as in HydraGNN's examples
    dataset = load_or_make_dataset(config["Dataset"]["path"]["total"], world_rank)
    trainset, valset, testset = hydragnn.preprocess.split_dataset(
        dataset, config["NeuralNetwork"]["Training"]["perc_train"], False
    )
    if seed:
        # HydraGNN seeds its model and its DistributedSampler with 0: another order of the
        # training graphs is what makes another run's batches (and the spread of the losses)
        order = torch.randperm(len(trainset), generator=torch.Generator().manual_seed(seed))
        trainset = [trainset[int(i)] for i in order]
    train_loader, val_loader, test_loader = hydragnn.preprocess.create_dataloaders(
        trainset, valset, testset, config["NeuralNetwork"]["Training"]["batch_size"]
    )
    config = hydragnn.utils.update_config(config, train_loader, val_loader, test_loader)

    model = hydragnn.models.create_model_config(config=config["NeuralNetwork"], verbosity=verbosity)
    model = hydragnn.utils.get_distributed_model(model, verbosity)

    optimizer = hydragnn.utils.select_optimizer(
        model, config["NeuralNetwork"]["Training"]["Optimizer"]
    )
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="min", factor=0.5, patience=5, min_lr=0.00001
    )

    writer = hydragnn.utils.get_summary_writer(log_name)
    hydragnn.utils.save_config(config, log_name)
    # "Training": {"continue": 1, "startfrom": NAME} loads logs/NAME/NAME.pk, as
    # hydragnn.run_training does
    hydragnn.utils.load_existing_model_config(
        model, config["NeuralNetwork"]["Training"], optimizer=optimizer
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
    )

    hydragnn.utils.save_model(model, optimizer, log_name)
    hydragnn.utils.print_timers(verbosity)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="HydraGNN training on EMT clusters and molecules")
    parser.add_argument("config", help="HydraGNN JSON configuration")
    parser.add_argument(
        "--log", default=None, help="log name under ./logs/ (default: from the config)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the training-set order (0: the set's own order); "
        "HydraGNN itself seeds its model weights and its sampler with 0",
    )
    args = parser.parse_args()
    main(args.config, args.log, args.seed)
