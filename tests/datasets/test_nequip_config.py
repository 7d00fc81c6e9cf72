"""The example nequip-train config (cfm_plugins.datasets.nequip_config), as users copy it: a run
killed between epochs can resume, since last.ckpt is written every epoch (issue 24: with
save_top_k: 0, Lightning 2.6 wrote it only when training ended)."""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

import torch  # noqa: E402
import yaml  # noqa: E402

from cfm_plugins.datasets.cuni import make_dataset  # noqa: E402
from cfm_plugins.datasets.nequip_config import nequip_config  # noqa: E402
from tests.helpers import BIN, ROOT, clean_env  # noqa: E402


def test_a_run_killed_after_an_epoch_leaves_last_ckpt_of_that_epoch(tmp_path):
    files = make_dataset(tmp_path / "data", n_train=4, n_valid=2, n_test=0, seed=3, max_atoms=16)
    cfg = nequip_config(
        files["train"], files["valid"], epochs=3, features=4, l_max=1, layers=1, batch_size=2
    )
    cfg["trainer"]["callbacks"].append(
        {"_target_": "tests.helpers.lightning_callbacks.KillAtEpoch", "epoch": 1}
    )
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = subprocess.run(
        [
            str(BIN / "nequip-train"),
            "-cp",
            str(tmp_path),
            "-cn",
            "cfg",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=570,
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == -9, out.stdout[-3000:]  # killed at the start of the second epoch
    last = tmp_path / "run" / "last.ckpt"
    assert last.is_file(), sorted(os.listdir(tmp_path / "run"))
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert (
        ckpt["epoch"] == 0 and ckpt["state_dict"]
    )  # the first epoch, resumable (ckpt_path=last.ckpt)
