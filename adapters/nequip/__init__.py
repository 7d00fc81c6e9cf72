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

from cfm_plugins.api import hookimpl

log = logging.getLogger("cfm_plugins.nequip")

#: the session of the nequip-train run under way: Hydra builds BinPackDataLoader and the callbacks
#: from the config, with no argument of ours, so this is where they reach the hooks and options
_STATE: dict = {}
PROGRAMS = ("nequip-train",)


def running_session(who: str):
    """The session of the run under way, or a RuntimeError saying how ``who`` must be run."""
    session = _STATE.get("session")
    if session is None or not session.config.is_enabled("nequip"):
        raise RuntimeError(
            f"{who} runs under `cfm-run --enable nequip,... -- nequip-train ...` (it needs the "
            "ranks and options cfm-run sets up)"
        )
    return session


def __getattr__(name):
    if name == "BinPackDataLoader":  # the dataloader `_target_`; imported lazily (torch)
        from cfm_plugins_adapters.nequip.loader import BinPackDataLoader

        return BinPackDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def serves(argv) -> bool:
    """Whether ``argv`` runs nequip-train (the console script, or ``python -m
    nequip.scripts.train``)."""
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
        raise ValueError(
            "the nequip plugin needs nequip in this environment: pip install 'cfm-plugins[nequip]' "
            "(NequIP needs e3nn 0.6, mace-torch pins 0.4.4: use a separate environment, e.g. "
            "`make venv-nequip`)"
        )


@hookimpl
def cfm_before_trainer(config, dist, argv):
    from cfm_plugins.api import Session, TrainerSettings
    from cfm_plugins_adapters.nequip import seams

    if not serves(argv):
        log.warning(
            "the nequip plugin meets nequip-train; %r is another command, so it does nothing",
            argv[:1],
        )
        return None
    if config.is_enabled("fused"):
        from cfm_plugins_adapters.nequip.modifier import register_form

        # the kernel table then fuses TensorProductScatter whole (product + scatter)
        register_form()
    # batch size and seed: from nequip's config, as its loaders are made
    _STATE["session"] = session = Session(config, TrainerSettings(device=config.get("device")))
    undo_seams = seams.install(session)

    def undo():  # cfm-run calls it after the trainer
        _STATE.pop("session", None)
        undo_seams()

    return undo


@hookimpl
def cfm_graph_sizes(dataset, indices, need_edges):
    from cfm_plugins.api import GraphSizes
    from cfm_plugins_adapters.nequip.loader import is_nequip_dataset, local_sizes

    if not is_nequip_dataset(dataset):
        return None
    return GraphSizes(
        *local_sizes(dataset, indices, need_edges), indices
    )  # edges not read: -1, so None
