"""mace: run the plugins inside an unmodified mace_run_train (loaders, model, ranks, saving).

``cfm-run -- mace_run_train ...`` enables this adapter by itself (it serves that command, see
:func:`cfm_adapter_serves`); ``cfm-run --enable binpack,fused -- mace_run_train ...`` adds the
features. The seams are listed in :mod:`cfm_plugins_adapters.mace.seams`; dataset sizes come from
:mod:`.sizes`. Models and checkpoints written under the plugin are stock mace files.
"""

from __future__ import annotations

import logging
import os

from cfm_plugins.api import hookimpl

log = logging.getLogger("cfm_plugins.mace")

_PROGRAM = "mace_run_train"
_MODULE = "mace.cli.run_train"


@hookimpl
def cfm_adapter_serves(argv):
    """``mace_run_train ...`` (any path to it) or ``python -m mace.cli.run_train ...``."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == _PROGRAM:
        return True
    return os.path.basename(argv[0]).startswith("python") and argv[1:3] == ["-m", _MODULE]


@hookimpl
def cfm_configure(config):
    from cfm_plugins.api import argv_value

    # the ranks are set up before mace parses its arguments: take its --device now
    found = argv_value(config.trainer_argv, "--device")
    if found is not None and found[1] in {"cpu", "cuda"} and "device" not in config.options:
        config.options["device"] = found[1]
        config.option_sources["device"] = "mace_run_train --device"


@hookimpl
def cfm_before_trainer(config, dist, argv):
    from cfm_plugins_adapters.mace import seams

    if not cfm_adapter_serves(argv):
        log.warning(
            "the mace plugin meets mace_run_train; %r is another command, so it does nothing",
            argv[:1],
        )
        return None
    return seams.install(config)  # cfm-run calls this undo after the trainer


@hookimpl
def cfm_graph_sizes(dataset, indices, need_edges):
    from cfm_plugins.api import GraphSizes
    from cfm_plugins_adapters.mace.sizes import is_mace_dataset, local_sizes

    if not is_mace_dataset(dataset):
        return None
    return GraphSizes(
        *local_sizes(dataset, indices, need_edges), indices
    )  # edges not read: -1, so None
