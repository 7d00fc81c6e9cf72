"""Where cfm-plugins meets an unmodified ``nequip-train`` (nequip 0.19, Lightning + Hydra).

``nequip.scripts.train.main`` builds everything through the name ``instantiate`` it imported from
``hydra.utils`` into its own module, so replacing that name *in that module* changes only the
objects ``nequip-train`` builds, after it recorded its (stock) config in the checkpoint: the
``NequIPDataModule`` (binpack loaders), the ``lightning.Trainer`` (ranks, strategy, the adapter's
callbacks) and the training module (what its loss allows). :func:`install` lists what each
replacement does, puts them in place and returns an undo callable; nothing else is changed.

``NequIPDataModule.get_statistics`` is wrapped so that NequIP's dataset statistics (energy
shifts, scales, average neighbours) see the whole training set on every rank, as stock.
Lightning reuses the process group cfm-run created (``torch.distributed.is_initialized()``).
"""

from __future__ import annotations

import copy
import dataclasses
import logging

from cfm_plugins.api import wants_step_times

log = logging.getLogger("cfm_plugins.nequip")

LOADER_TARGET = "cfm_plugins_adapters.nequip.BinPackDataLoader"
_STOCK_LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
_TRAINERS = {
    "lightning.Trainer",
    "lightning.pytorch.Trainer",
    "pytorch_lightning.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
}
_LOADER_KEYS = {
    "train_dataloader": "train",
    "val_dataloader": "val",
    "test_dataloader": "test",
    "predict_dataloader": "predict",
}


def _target(cfg):
    return cfg.get("_target_") if isinstance(cfg, dict) else None


def data_config(cfg: dict, session) -> dict:
    """A copy of the ``data`` config with binpack loaders; its ``seed`` seeds the packing too."""
    cfg = copy.deepcopy(cfg)
    if "seed" in cfg and session.trainer.seed is None:
        session.trainer = dataclasses.replace(session.trainer, seed=int(cfg["seed"]))
    for key, role in _LOADER_KEYS.items():
        loader = dict(cfg.get(key) or {})
        target = loader.get("_target_", "torch.utils.data.DataLoader")
        if target == LOADER_TARGET:
            loader.setdefault("cfm_role", role)
        elif target in _STOCK_LOADERS:
            loader["_target_"] = LOADER_TARGET
            loader["cfm_role"] = role
        else:
            log.warning(
                "binpack: the %s is a %s (not torch's DataLoader); left as it is", key, target
            )
        cfg[key] = loader
    return cfg


#: Lightning strategies that start their own worker processes; under mpirun the ranks already exist
_SPAWNING = ("spawn", "fork", "notebook")


def _spawning_strategy(strategy) -> str | None:
    """The name of a Lightning strategy that starts processes itself (``ddp_spawn``, ``ddp_fork``,
    ``ddp_notebook``, a ``DDPStrategy`` with ``start_method: spawn``), else None."""
    if isinstance(strategy, str):
        return strategy if any(k in strategy.lower() for k in _SPAWNING) else None
    if isinstance(strategy, dict):
        method = str(strategy.get("start_method") or "")
        target = str(strategy.get("_target_") or "")
        if method in ("spawn", "fork", "forkserver") or any(k in target.lower() for k in _SPAWNING):
            return f"{target or 'strategy'}(start_method={method or '?'})"
    return None


def _replace(cfg: dict, key: str, value, why: str) -> None:
    """Set ``cfg[key]``, logging the user's own value it replaces (never silently)."""
    if cfg.get(key) not in (None, "auto", value):
        log.info("trainer.%s=%r replaced by %r: %s", key, cfg.get(key), value, why)
    cfg[key] = value


def trainer_config(cfg: dict, config, dist) -> dict:
    """A copy of the ``trainer`` config that runs on cfm-run's ranks.

    A strategy that spawns its own processes is refused (``ValueError``) where anything of ours
    must reach those processes: under several ranks mpirun has started them and cfm-run joined them
    in a process group (a spawned child cannot take the MPI communicator along: "cannot serialize
    'mpi4py.MPI.Intracomm'"), and binpack's loaders and fused's callback need cfm-run's session,
    which a spawned child does not have. A single rank with neither runs stock and may spawn.
    """
    cfg = copy.deepcopy(cfg)
    # a non-finite training loss stops the run before a checkpoint is written with it
    callbacks = [{"_target_": "cfm_plugins_adapters.nequip.guard.NonFiniteLoss"}]
    spawning = _spawning_strategy(cfg.get("strategy"))
    ours = [name for name in ("binpack", "fused") if config.is_enabled(name)]
    if spawning and (dist.world_size > 1 or ours):
        why = (
            f"cfm-run runs {dist.world_size} ranks already"
            if dist.world_size > 1
            else f"{' and '.join(ours)} act(s) in cfm-run's process only"
        )
        raise ValueError(
            f"trainer.strategy={spawning} starts its own processes, which cannot run under mpirun "
            f"and cfm-run ({why}); use strategy: ddp (the default cfm-run sets on several ranks) "
            "and launch the ranks with mpirun -np N"
        )
    if config.is_enabled("binpack"):
        _replace(
            cfg,
            "use_distributed_sampler",
            False,
            "binpack's sampler shards the batches over the ranks itself",
        )
        callbacks.append({"_target_": "cfm_plugins_adapters.nequip.callbacks.BinPackState"})
        callbacks.append({"_target_": "cfm_plugins_adapters.nequip.weighting.LossWeighting"})
    if config.is_enabled("fused"):
        callbacks.append({"_target_": "cfm_plugins_adapters.nequip.callbacks.FuseOnSetup"})
    if config.get("step_log") or wants_step_times(config):
        callbacks.append(
            {
                "_target_": "cfm_plugins_adapters.nequip.steplog.StepLog",
                "path": config.get("step_log", type=str) if config.get("step_log") else None,
            }
        )
    if callbacks:
        cfg["callbacks"] = list(cfg.get("callbacks") or []) + callbacks
    if dist.world_size > 1:
        if cfg.get("strategy") in (None, "auto"):
            cfg["strategy"] = "ddp"
        nodes = max(1, dist.world_size // max(dist.local_size, 1))
        for key, value in (("devices", dist.local_size), ("num_nodes", nodes)):
            _replace(cfg, key, value, f"cfm-run runs {dist.world_size} ranks")
        if dist.device == "cpu":
            cfg["accelerator"] = "cpu"
    return cfg


def _is_datamodule(target) -> bool:
    if not target:
        return False
    from hydra.utils import get_class
    from nequip.data.datamodule import NequIPDataModule

    try:
        cls = get_class(target)
    except Exception:  # noqa: BLE001 - not a class: not a data module
        return False
    return isinstance(cls, type) and issubclass(cls, NequIPDataModule)


def install(session) -> callable:
    """Replace ``instantiate`` in ``nequip.scripts.train`` and wrap the statistics pass.

    What the replacement does, per object built:

    - ``NequIPDataModule``: binpack: every stock ``torch.utils.data.DataLoader`` of the train/val/
      test/predict loaders becomes :func:`.loader.BinPackDataLoader`;
    - ``lightning.Trainer``: several ranks: ``strategy: ddp`` (unless set), ``devices``/
      ``num_nodes`` from the MPI ranks, ``accelerator: cpu`` on CPU; a strategy that spawns
      processes (``ddp_spawn``) is refused. binpack: ``use_distributed_sampler: false`` (our
      sampler already shards; a user's ``true`` is logged as replaced), and the callbacks
      :class:`.callbacks.BinPackState` (the sampler's resume state in Lightning's checkpoints)
      and :class:`.weighting.LossWeighting` (acts only under ``loss_weighting=per_sample``).
      fused: the callback :class:`.callbacks.FuseOnSetup`, which fuses the LightningModule's
      ``TensorProductScatter`` in place at every setup (fresh runs, ``ckpt_path`` restarts,
      val/test runs; the state_dict is unchanged). step_log (or a feature that needs step times,
      binpack's ``cost=auto``): the callback :class:`.steplog.StepLog`. Always: the callback
      :class:`.guard.NonFiniteLoss` (a non-finite training loss stops the run before a
      checkpoint is written, or binpack's ``nonfinite=skip``);
    - the training module: binpack: what its loss allows (``TrainerSettings.loss_weightings``,
      :func:`.weighting.loss_weightings`), read before the loaders are made; a module restored
      from a checkpoint (``ckpt_path``) is read at the Trainer's setup (``LossWeighting.setup``),
      before its loaders too.

    Returns a callable that undoes it all."""
    import nequip.scripts.train as nt
    from nequip.data.datamodule import NequIPDataModule

    from cfm_plugins_adapters.nequip.loader import statistics_pass

    config, dist = session.config, session.dist
    stock_instantiate = nt.instantiate
    stock_stats = NequIPDataModule.get_statistics

    def instantiate(cfg, *args, **kwargs):
        target = _target(cfg)
        if target in _TRAINERS:
            cfg = trainer_config(cfg, config, dist)
        elif config.is_enabled("binpack") and _is_datamodule(target):
            cfg = data_config(cfg, session)
        built = stock_instantiate(cfg, *args, **kwargs)
        if (
            config.is_enabled("binpack")
            and hasattr(built, "loss")
            and hasattr(built, "training_step")
        ):
            from cfm_plugins_adapters.nequip.weighting import loss_weightings

            # the training module exists before Lightning makes the loaders: binpack's choice sees
            # its loss
            loss, weightings = loss_weightings(built)
            session.trainer = dataclasses.replace(
                session.trainer, loss=loss, loss_weightings=weightings
            )
        return built

    def get_statistics(self, *args, **kwargs):
        with statistics_pass():
            return stock_stats(self, *args, **kwargs)

    nt.instantiate = instantiate
    NequIPDataModule.get_statistics = get_statistics

    def undo():
        nt.instantiate = stock_instantiate
        NequIPDataModule.get_statistics = stock_stats

    return undo
