"""Where cfm-plugins meets an unmodified ``nequip-train`` (nequip 0.19, Lightning + Hydra).

``nequip.scripts.train.main`` builds everything through the name ``instantiate`` it imported from
``hydra.utils`` into its own module, so replacing that name *in that module* changes only the
objects ``nequip-train`` builds, after it recorded its (stock) config in the checkpoint:

=========================  =====================================================================
object built               what the replacement does
=========================  =====================================================================
``NequIPDataModule``       binpack: every stock ``torch.utils.data.DataLoader`` of the train/val/
                           test/predict loaders becomes :func:`.loader.BinPackDataLoader`
``lightning.Trainer``      several ranks: ``strategy: ddp`` (unless set), ``devices``/``num_nodes``
                           from the MPI ranks, ``accelerator: cpu`` on CPU; binpack:
                           ``use_distributed_sampler: false`` (our sampler already shards);
                           fused: the callback :class:`.callbacks.FuseOnSetup`, which fuses the
                           LightningModule's ``TensorProductScatter`` in place at every setup
                           (fresh runs, ``ckpt_path`` restarts, val/test runs); the state_dict
                           is unchanged; step_log: the callback :class:`.steplog.StepLog`;
                           binpack: the callback :class:`.weighting.LossWeighting` (acts only
                           under ``loss_weighting=per_sample``)
the training module        binpack: what its loss allows (``TrainerSettings.loss_weightings``,
                           :func:`.weighting.loss_weightings`), read before the loaders are made
=========================  =====================================================================

``NequIPDataModule.get_statistics`` is wrapped so that NequIP's dataset statistics (energy
shifts, scales, average neighbours) see the whole training set on every rank, as stock.
Lightning reuses the process group cfm-run created (``torch.distributed.is_initialized()``).

:func:`install` puts these in place and returns an undo callable; nothing else is changed.
"""
from __future__ import annotations

import copy
import dataclasses
import logging

log = logging.getLogger("cfm_plugins.nequip")

LOADER_TARGET = "cfm_plugins_adapters.nequip.BinPackDataLoader"
_STOCK_LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
_TRAINERS = {"lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
             "lightning.pytorch.trainer.trainer.Trainer"}
_LOADER_KEYS = {"train_dataloader": "train", "val_dataloader": "val", "test_dataloader": "test",
                "predict_dataloader": "predict"}


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
            log.warning("binpack: the %s is a %s (not torch's DataLoader); left as it is", key, target)
        cfg[key] = loader
    return cfg


def trainer_config(cfg: dict, config, dist) -> dict:
    """A copy of the ``trainer`` config that runs on cfm-run's ranks."""
    cfg = copy.deepcopy(cfg)
    if config.is_enabled("binpack"):
        cfg["use_distributed_sampler"] = False
        cfg["callbacks"] = list(cfg.get("callbacks") or []) + [
            {"_target_": "cfm_plugins_adapters.nequip.weighting.LossWeighting"}]
    if config.is_enabled("fused"):
        cfg["callbacks"] = list(cfg.get("callbacks") or []) + [
            {"_target_": "cfm_plugins_adapters.nequip.callbacks.FuseOnSetup"}]
    if config.get("step_log"):
        cfg["callbacks"] = list(cfg.get("callbacks") or []) + [
            {"_target_": "cfm_plugins_adapters.nequip.steplog.StepLog", "path": config.get("step_log", type=str)}]
    if dist.world_size > 1:
        if cfg.get("strategy") in (None, "auto"):
            cfg["strategy"] = "ddp"
        nodes = max(1, dist.world_size // max(dist.local_size, 1))
        for key, value in (("devices", dist.local_size), ("num_nodes", nodes)):
            if cfg.get(key) not in (None, "auto", value):
                log.info("trainer.%s=%r replaced by %r: cfm-run runs %d ranks", key, cfg.get(key), value,
                         dist.world_size)
            cfg[key] = value
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
    """Replace ``instantiate`` in ``nequip.scripts.train`` and wrap the statistics pass."""
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
        if config.is_enabled("binpack") and hasattr(built, "loss") and hasattr(built, "training_step"):
            from cfm_plugins_adapters.nequip.weighting import loss_weightings

            # the training module exists before Lightning makes the loaders: binpack's choice sees its loss
            loss, weightings = loss_weightings(built)
            session.trainer = dataclasses.replace(session.trainer, loss=loss, loss_weightings=weightings)
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
