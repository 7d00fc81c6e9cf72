"""nequip: run the plugins inside an unmodified nequip-train (loaders, Trainer, model, ranks).

Enable with ``mpirun -np 2 cfm-run --enable nequip,binpack,fused -- nequip-train -cn CONFIG``.
The seams are listed in :mod:`cfm_plugins_adapters.nequip.seams`; the fused kernel is also the
NequIP model modifier ``enable_CFMFused`` (:mod:`.modifier`, registered by :mod:`.extension`
through nequip's own ``nequip.extension`` entry point), and the binpack loader is usable as a
dataloader ``_target_`` (:func:`BinPackDataLoader`). Checkpoints written under the plugin are
stock nequip checkpoints.
"""
from __future__ import annotations

import logging
import os

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.nequip")

_STATE: dict = {}
PROGRAMS = ("nequip-train",)


def __getattr__(name):
    if name == "BinPackDataLoader":  # the dataloader `_target_`; imported lazily (torch)
        from cfm_plugins_adapters.nequip.loader import BinPackDataLoader

        return BinPackDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def serves(argv) -> bool:
    """Whether ``argv`` runs nequip-train (the console script, or ``python -m nequip.scripts.train``)."""
    if not argv:
        return False
    if os.path.basename(str(argv[0])) in PROGRAMS:
        return True
    return list(argv[:1]) == ["nequip.scripts.train"] or "nequip.scripts.train" in list(argv[1:3])


@hookimpl
def cfm_adapter_serves(argv):
    return serves(argv)


@hookimpl
def cfm_configure(config):
    import importlib.util

    if importlib.util.find_spec("nequip") is None:
        raise ValueError("the nequip plugin needs nequip in this environment: pip install 'cfm-plugins[nequip]' "
                         "(NequIP needs e3nn 0.6, mace-torch pins 0.4.4: use a separate environment, e.g. "
                         "`make venv-nequip`)")


@hookimpl
def cfm_before_trainer(config, dist, argv):
    from cfm_plugins.manager import Session
    from cfm_plugins.options import TrainerSettings
    from cfm_plugins_adapters.nequip import seams

    if not serves(argv):
        log.warning("the nequip plugin meets nequip-train; %r is another command, so it does nothing", argv[:1])
        return
    # batch size and seed: from nequip's config, as its loaders are made
    session = Session(config, TrainerSettings(device=config.get("device")))
    _STATE["session"] = session  # for BinPackDataLoader, which Hydra builds without our arguments
    _STATE["undo"] = seams.install(session)


@hookimpl
def cfm_after_trainer(config, dist, exit_code):
    _STATE.pop("session", None)
    undo = _STATE.pop("undo", None)
    if undo is not None:
        undo()


@hookimpl
def cfm_graph_sizes(dataset, indices, need_edges):
    from cfm_plugins.sizes import GraphSizes
    from cfm_plugins_adapters.nequip.loader import is_nequip_dataset, local_sizes

    if not is_nequip_dataset(dataset):
        return None
    atoms, edges = local_sizes(dataset, indices, need_edges)
    return GraphSizes(atoms, None if (edges < 0).any() else edges, indices)
