"""binpack's loss weighting in a nequip-train run restarted from its checkpoint (``++ckpt_path``):
nequip builds the training module from the checkpoint, not through the config, and the restarted
run must weigh its loss as the first run did. Real 2-rank runs (in .venv-nequip)."""

from __future__ import annotations

import csv

import numpy as np
import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

from tests.helpers import BIN, run_mpi  # noqa: E402

CFM_RUN = str(BIN / "cfm-run")
STOCK_FALLBACK = "cannot be reweighted per sample"
SCALED = "binpack loss_weighting=per_sample: nequip's loss terms scaled per step"


def step_losses(run) -> list[tuple[int, float]]:
    with open(run / "csv" / "version_0" / "metrics.csv") as fh:
        return [
            (int(r["epoch"]), float(r["train_loss_step/weighted_sum"]))
            for r in csv.DictReader(fh)
            if r.get("train_loss_step/weighted_sum")
        ]


def test_a_resumed_run_weighs_its_loss_per_sample_as_the_first_run_did(tmp_path):
    """Three runs on 2 ranks: 2 epochs straight; 1 epoch, then restarted from its last.ckpt for
    the second. The restarted run says it scales nequip's loss terms (not "using
    loss_weighting=stock"), and its second epoch's step losses are the straight run's: under stock
    weighting the first step's update differs, and every later loss with it."""
    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config

    files = make_dataset(tmp_path / "data", n_train=16, n_valid=2, n_test=1, seed=5, max_atoms=30)
    for name, epochs in (("two", 2), ("one", 1)):
        write_config(
            tmp_path / "cfg" / f"{name}.yaml",
            train=files["train"],
            valid=files["valid"],
            epochs=epochs,
            features=8,
            l_max=1,
            layers=1,
            batch_size=3,
        )

    def train(name, cfg, *extra):
        out = run_mpi(
            [
                CFM_RUN,
                "--enable",
                "nequip,binpack",
                "--",
                "nequip-train",
                "-cp",
                str(tmp_path / "cfg"),
                "-cn",
                cfg,
                f"hydra.run.dir={tmp_path / name}",
                *extra,
            ],
            timeout=570,
        )
        assert out.returncode == 0, out.stdout[-4000:]
        return out.stdout

    straight = train("straight", "two")
    first = train("first", "one")
    resumed = train(
        "resumed", "one", f"++ckpt_path={tmp_path / 'first' / 'last.ckpt'}", "trainer.max_epochs=2"
    )
    for log in (straight, first):
        assert SCALED in log and STOCK_FALLBACK not in log, log[-3000:]
    assert "Continuing training with checkpoint file" in resumed
    assert STOCK_FALLBACK not in resumed, resumed[-3000:]
    assert SCALED in resumed, resumed[-3000:]

    want = [v for e, v in step_losses(tmp_path / "straight") if e == 1]
    got = [v for e, v in step_losses(tmp_path / "resumed") if e == 1]
    assert len(want) >= 2 and len(got) == len(want), (want, got)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=0)
