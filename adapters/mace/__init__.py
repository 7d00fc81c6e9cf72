"""mace: run the plugins inside an unmodified mace_run_train (loaders, model, ranks, saving).

Enable with ``cfm-run --enable mace,binpack,fused -- mace_run_train ...``. The seams are listed in
:mod:`cfm_plugins_adapters.mace.seams`; dataset sizes come from :mod:`.sizes`. Models and
checkpoints written under the plugin are stock mace files.
"""
from __future__ import annotations

import logging

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.mace")

_STATE: dict = {}


def _argv_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


@hookimpl
def cfm_configure(config):
    # the ranks are set up before mace parses its arguments: take its --device now
    device = _argv_value(config.trainer_argv, "--device")
    if device in {"cpu", "cuda"}:
        config.options.setdefault("device", device)


@hookimpl
def cfm_before_trainer(config, dist, argv):
    from cfm_plugins.manager import get_active
    from cfm_plugins_adapters.mace import seams

    if not argv or "mace_run_train" not in argv[0]:
        log.warning("the mace plugin meets mace_run_train; %r is another command, so it does nothing", argv[:1])
        return
    _STATE["options"] = {}
    _STATE["undo"] = seams.install(get_active(), _STATE["options"])


@hookimpl
def cfm_after_trainer(config, dist, exit_code):
    undo = _STATE.pop("undo", None)
    if undo is not None:
        undo()


@hookimpl
def cfm_graph_sizes(dataset, indices, need_edges):
    from cfm_plugins.sizes import GraphSizes
    from cfm_plugins_adapters.mace.sizes import is_mace_dataset, local_sizes

    if not is_mace_dataset(dataset):
        return None
    atoms, edges = local_sizes(dataset, indices, need_edges)
    return GraphSizes(atoms, None if (edges < 0).any() else edges, indices)
