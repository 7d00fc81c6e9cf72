"""A nequip-train (NequIP 0.19) config for the example CuNi set (:mod:`cfm_plugins.datasets.cuni`).

The config reads the extended XYZ files with ``nequip.data.dataset.ASEDataset`` (``REF_energy``
and ``REF_forces`` mapped to NequIP's ``total_energy`` and ``forces``), trains a NequIP GNN
(float64) with an energy + forces loss, logs every step's loss to ``metrics.csv`` (Lightning's
CSVLogger) and writes ``last.ckpt`` at the end of every epoch, so a run killed midway resumes from
its last epoch (``ckpt_path=OUT/last.ckpt``). ``fused=True`` writes the config form of the fused
kernel (``nequip.model.modify`` with ``enable_CFMFused``); ``cfm_plugins=...`` adds a
``cfm_plugins:`` key that enables plugins when run under ``cfm-run`` (the flag ``cfm-run --enable``
does the same). Run it with ``nequip-train -cp DIR -cn NAME hydra.run.dir=OUT``. Needs only PyYAML;
the command line is ``examples/nequip_config.py``::

    python examples/nequip_config.py --train DIR/train.xyz --valid DIR/valid.xyz --out cfg.yaml \
        [--epochs 2] [--features 16] [--l-max 1] [--layers 2] [--batch-size 4] [--fused] [--cfm
        mace,...]
"""

from __future__ import annotations

from pathlib import Path

import yaml


def nequip_config(
    train: str,
    valid: str,
    epochs: int = 2,
    features: int = 16,
    l_max: int = 1,
    layers: int = 2,
    batch_size: int = 4,
    r_max: float = 4.0,
    seed: int = 1,
    lr: float = 0.005,
    fused: bool = False,
    cfm_plugins=None,
    test: str | None = None,
) -> dict:
    """The config as a dict (see the module docstring): ``train``/``valid``/``test`` are extended
    XYZ files of :func:`cfm_plugins.datasets.cuni.make_dataset`; ``cfm_plugins`` becomes the
    config's ``cfm_plugins:`` key."""
    transforms = [
        {
            "_target_": "nequip.data.transforms.ChemicalSpeciesToAtomTypeMapper",
            "model_type_names": ["Cu", "Ni"],
            "chemical_species_to_atom_type_map": {"Cu": "Cu", "Ni": "Ni"},
        },
        {"_target_": "nequip.data.transforms.NeighborListTransform", "r_max": r_max},
    ]

    def dataset(path):
        return {
            "_target_": "nequip.data.dataset.ASEDataset",
            "file_path": str(path),
            "ase_args": {"format": "extxyz"},
            "key_mapping": {"REF_energy": "total_energy", "REF_forces": "forces"},
            "transforms": transforms,
        }

    loader = {"_target_": "torch.utils.data.DataLoader", "batch_size": batch_size, "num_workers": 0}
    model = {
        "_target_": "nequip.model.NequIPGNNModel",
        "seed": seed,
        "model_dtype": "float64",
        "type_names": ["Cu", "Ni"],
        "r_max": r_max,
        "l_max": l_max,
        "parity": True,
        "num_layers": layers,
        "num_features": features,
        "radial_mlp_depth": 1,
        "radial_mlp_width": 32,
        "avg_num_neighbors": "${training_data_stats:num_neighbors_mean}",
        "per_type_energy_shifts": "${training_data_stats:per_atom_energy_mean}",
        "per_type_energy_scales": "${training_data_stats:forces_rms}",
    }
    if fused:
        model = {
            "_target_": "nequip.model.modify",
            "modifiers": [{"modifier": "enable_CFMFused"}],
            "model": model,
        }
    cfg = {
        "run": ["train"] + (["test"] if test else []),
        "data": {
            "_target_": "nequip.data.datamodule.NequIPDataModule",
            "seed": seed,
            "train_dataset": dataset(train),
            "val_dataset": dataset(valid),
            "train_dataloader": dict(loader, shuffle=True),
            "val_dataloader": dict(loader),
            "stats_manager": {
                "_target_": "nequip.data.CommonDataStatisticsManager",
                "type_names": ["Cu", "Ni"],
            },
        },
        "trainer": {
            "_target_": "lightning.Trainer",
            "max_epochs": epochs,
            "accelerator": "cpu",
            "devices": 1,
            "check_val_every_n_epoch": 1,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "num_sanity_val_steps": 0,
            "deterministic": False,
            "logger": {
                "_target_": "lightning.pytorch.loggers.CSVLogger",
                "save_dir": "${hydra:runtime.output_dir}",
                "name": "csv",
                "version": 0,
            },
            # save_top_k >= 1: Lightning 2.6 writes last.ckpt only along with a top-k checkpoint, so
            # save_top_k: 0 leaves nothing to resume from until training ends. Without a monitor,
            # top-1 is the newest epoch (epoch=E-step=S.ckpt, the previous one removed).
            "callbacks": [
                {
                    "_target_": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "dirpath": "${hydra:runtime.output_dir}",
                    "save_last": True,
                    "save_top_k": 1,
                    "every_n_epochs": 1,
                }
            ],
        },
        "training_module": {
            "_target_": "nequip.train.NequIPLightningModule",
            "loss": {
                "_target_": "nequip.train.EnergyForceLoss",
                "per_atom_energy": True,
                "coeffs": {"total_energy": 1.0, "forces": 1.0},
            },
            "val_metrics": {
                "_target_": "nequip.train.EnergyForceMetrics",
                "coeffs": {"total_energy_mae": 1.0, "forces_mae": 1.0},
            },
            "test_metrics": {
                "_target_": "nequip.train.EnergyForceMetrics",
                "coeffs": {"total_energy_mae": 1.0, "forces_mae": 1.0},
            },
            "optimizer": {"_target_": "torch.optim.Adam", "lr": lr},
            "model": model,
        },
    }
    if test:
        cfg["data"]["test_dataset"] = dataset(test)
        cfg["data"]["test_dataloader"] = dict(loader)
    if cfm_plugins:
        cfg["cfm_plugins"] = cfm_plugins
    return cfg


def write_config(path, **kwargs) -> Path:
    """Write :func:`nequip_config` ``(**kwargs)`` as YAML to ``path`` (folders made as needed);
    return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(nequip_config(**kwargs), sort_keys=False))
    return path
