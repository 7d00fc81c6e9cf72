"""The nequip adapter's Trainer seam (issue 24): a user's setting it replaces is logged, a
strategy that spawns its own processes is refused at start. The unit tests need no nequip; the
last runs a real nequip-train (in .venv-nequip)."""

from __future__ import annotations

import logging
import subprocess

import pytest
import yaml

from cfm_plugins.config import Config
from cfm_plugins.distributed import DistInfo
from cfm_plugins_adapters.nequip.seams import trainer_config
from tests.helpers import BIN, clean_env

TWO_RANKS = DistInfo(rank=0, world_size=2, local_rank=0, local_size=2)


def test_use_distributed_sampler_replaced_by_binpack_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="cfm_plugins.nequip")
    cfg = trainer_config(
        {"use_distributed_sampler": True, "devices": 1},
        Config(enabled=["nequip", "binpack"]),
        TWO_RANKS,
    )
    assert (
        cfg["use_distributed_sampler"] is False and cfg["devices"] == 2 and cfg["strategy"] == "ddp"
    )
    said = caplog.text
    assert (
        "trainer.use_distributed_sampler=True replaced by False: binpack's sampler shards" in said
    )
    assert "trainer.devices=1 replaced by 2: cfm-run runs 2 ranks" in said
    caplog.clear()
    trainer_config(
        {"use_distributed_sampler": False}, Config(enabled=["nequip", "binpack"]), TWO_RANKS
    )
    trainer_config({}, Config(enabled=["nequip", "binpack"]), TWO_RANKS)
    assert (
        "use_distributed_sampler" not in caplog.text
    )  # not the user's setting, or already false: nothing to say


@pytest.mark.parametrize(
    "strategy",
    [
        "ddp_spawn",
        "ddp_fork",
        "ddp_notebook",
        "ddp_spawn_find_unused_parameters_true",
        {"_target_": "lightning.pytorch.strategies.DDPStrategy", "start_method": "spawn"},
    ],
)
def test_spawning_strategies_are_refused(strategy):
    for dist, enabled in (
        (TWO_RANKS, ["nequip"]),
        (DistInfo(), ["nequip", "binpack"]),
        (DistInfo(), ["nequip", "fused"]),
    ):
        with pytest.raises(
            ValueError, match="starts its own processes, which cannot run under mpirun and cfm-run"
        ):
            trainer_config({"strategy": strategy}, Config(enabled=enabled), dist)
    # one rank and nothing of ours in the trainer: stock nequip-train, which may spawn
    assert (
        trainer_config({"strategy": strategy}, Config(enabled=["nequip"]), DistInfo())["strategy"]
        == strategy
    )
    for fine, becomes in (
        ("ddp", "ddp"),
        ("auto", "ddp"),
        ({"_target_": "DDPStrategy"}, {"_target_": "DDPStrategy"}),
    ):
        assert (
            trainer_config({"strategy": fine}, Config(enabled=["nequip"]), TWO_RANKS)["strategy"]
            == becomes
        )


def test_nequip_train_with_ddp_spawn_stops_at_start_saying_why(tmp_path):
    pytest.importorskip(
        "nequip",
        reason="nequip is not installed in this environment: the NequIP tests run in "
        ".venv-nequip (`make test-nequip`)",
    )
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import nequip_config

    files = make_dataset(tmp_path / "data", n_train=4, n_valid=2, n_test=0, seed=3, max_atoms=16)
    cfg = nequip_config(
        files["train"], files["valid"], epochs=1, features=4, l_max=1, layers=1, batch_size=2
    )
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = subprocess.run(
        [
            str(BIN / "cfm-run"),
            "--enable",
            "nequip,binpack",
            "--",
            "nequip-train",
            "-cp",
            str(tmp_path),
            "-cn",
            "cfg",
            "+trainer.strategy=ddp_spawn",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=570,
        env=clean_env(),
    )
    assert out.returncode != 0
    assert "trainer.strategy=ddp_spawn starts its own processes" in out.stdout, out.stdout[-3000:]
    assert "Building datamodule" in out.stdout and "cannot serialize" not in out.stdout
    assert not (tmp_path / "run" / "last.ckpt").exists()
