"""hydragnn: balanced batches inside HydraGNN's own distributed training (HydraGNN 3.0).

Enable with ``cfm-run --enable hydragnn,binpack -- python train.py config.json`` (a training
script written as HydraGNN's examples are), or with a ``"cfm_plugins"`` key in that JSON config.
The seams (HydraGNN's ``setup_ddp``, ``create_dataloaders``, ``get_distributed_model``) are
listed in :mod:`cfm_plugins_adapters.hydragnn.seams`; step timings and the load imbalance factor
in :mod:`.steplog`. Nothing of HydraGNN is copied or forked.
"""

from __future__ import annotations

import json
import logging
import os

from cfm_plugins.api import hookimpl

log = logging.getLogger("cfm_plugins.hydragnn")


def _json_configs(argv) -> list[str]:
    return [a for a in argv[1:] if a.endswith(".json") and os.path.isfile(a)]


def _is_hydragnn_config(path: str) -> bool:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "NeuralNetwork" in data


def _script_imports_hydragnn(argv) -> bool:
    scripts = [a for a in argv[:3] if a.endswith(".py") and os.path.isfile(a)]
    for script in scripts:
        try:
            with open(script) as fh:
                text = fh.read(200_000)
        except OSError:
            continue
        if "import hydragnn" in text or "from hydragnn" in text:
            return True
    return False


def serves(argv) -> bool:
    """A HydraGNN training command: a JSON argument with HydraGNN's ``NeuralNetwork`` section, or
    a Python script that imports hydragnn (``python train.py config.json``)."""
    if not argv:
        return False
    return any(_is_hydragnn_config(p) for p in _json_configs(argv)) or _script_imports_hydragnn(
        argv
    )


@hookimpl
def cfm_adapter_serves(argv):
    return serves(list(argv))


@hookimpl
def cfm_before_trainer(config, dist, argv):
    if not serves(argv):
        log.warning(
            "the hydragnn plugin meets HydraGNN training scripts; %r does not look like one (no "
            "JSON config with a NeuralNetwork section, no `import hydragnn`), so it does nothing",
            argv[:2],
        )
        return None
    from cfm_plugins.api import TrainerSettings, UsageError, mpi_world_mismatch

    mismatch = mpi_world_mismatch(dist)  # HydraGNN reduces with mpi4py's COMM_WORLD itself
    if mismatch:
        raise UsageError(f"HydraGNN uses MPI itself (mpi4py's COMM_WORLD): {mismatch}")
    from cfm_plugins.api import Session
    from cfm_plugins_adapters.hydragnn import seams
    from cfm_plugins_adapters.hydragnn.weighting import loss_from_config, loss_weightings

    # the loss from the JSON config; the seams fill in HydraGNN's batch size when its loaders are
    # made
    loss = loss_from_config(argv)
    trainer = TrainerSettings(
        loss=f"HydraGNN loss_function_type {loss}", loss_weightings=loss_weightings(loss)
    )
    # the features check what they can serve before HydraGNN reads any data (binpack: its loss
    # weighting against this loss; a usage error is said once, exit 2)
    config.pm.hook.cfm_trainer_settings(config=config, trainer=trainer)
    return seams.install(Session(config, trainer))  # cfm-run calls this undo after the trainer


@hookimpl
def cfm_graph_sizes(dataset, indices, need_edges):
    from cfm_plugins.api import GraphSizes
    from cfm_plugins_adapters.hydragnn.sizes import is_pyg_dataset, local_sizes

    if not is_pyg_dataset(dataset):
        return None
    return GraphSizes(
        *local_sizes(dataset, indices, need_edges), indices
    )  # edges not read: -1, so None
