"""A training step whose loss is not finite, in real nequip-train runs (in .venv-nequip): two atoms
on one site in structure 4 of the training file (finite labels, NaN predictions). nequip alone
trains on and writes NaN checkpoints, exit status 0."""

from __future__ import annotations

import re
import subprocess

import pytest

pytest.importorskip(
    "nequip",
    reason="nequip is not installed in this environment: the NequIP tests run in "
    ".venv-nequip (`make test-nequip`)",
)

import torch  # noqa: E402

from tests.helpers import BIN, clean_env, run_mpi  # noqa: E402

CFM_RUN = str(BIN / "cfm-run")
BAD = 4  # the structure of train.xyz (counted from 0) with two atoms on one site


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from ase.io import read, write

    from cfm_plugins.datasets.cuni import make_dataset
    from cfm_plugins.datasets.nequip_config import write_config

    tmp = tmp_path_factory.mktemp("nequip_nonfinite")
    files = make_dataset(tmp / "data", n_train=12, n_valid=2, n_test=1, seed=5, max_atoms=30)
    frames = read(files["train"], index=":")
    frames[BAD].positions[1] = frames[BAD].positions[0]
    write(files["train"], frames, format="extxyz")
    write_config(
        tmp / "cfg" / "g.yaml",
        train=files["train"],
        valid=files["valid"],
        epochs=2,
        features=8,
        l_max=1,
        layers=1,
        batch_size=3,
    )
    return tmp, files["train"]


def command(tmp, run, enable, *options):
    return [
        CFM_RUN,
        "--enable",
        enable,
        *options,
        "--",
        "nequip-train",
        "-cp",
        str(tmp / "cfg"),
        "-cn",
        "g",
        f"hydra.run.dir={tmp / run}",
    ]


def errors(text: str) -> list[str]:
    return re.findall(r"^cfm_plugins\.nonfinite\.NonFiniteLossError: (.*)$", text, re.M)


def test_nequip_binpack_stops_and_the_rank_whose_batch_gave_it_names_it(data):
    """2 ranks: nequip's loss is the mean over the ranks, so both stop at the same step; the rank
    whose batch holds structure 4 names it and its non-finite predictions, the other says its
    batch was finite. No checkpoint is written."""
    tmp, train = data
    out = run_mpi(command(tmp, "error", "nequip,binpack"), timeout=570)
    assert out.returncode != 0, out.stdout[-4000:]
    said = errors(out.stdout)
    assert len(said) == 2, out.stdout[-4000:]
    culprit = [m for m in said if "predictions are not finite" in m]
    other = [m for m in said if "gave finite values" in m]
    assert len(culprit) == 1 and len(other) == 1, said
    held = re.search(re.escape(f"{train}: structure") + r"s? ([0-9, ]+)", culprit[0])
    assert held and BAD in [int(i) for i in held.group(1).split(", ")], culprit
    assert "epoch 0" in culprit[0] and "forces_mse predictions" in culprit[0]
    assert not list((tmp / "error").glob("*.ckpt"))


def test_nequip_binpack_nonfinite_skip_completes_with_finite_weights(data):
    tmp, train = data
    out = run_mpi(command(tmp, "skip", "nequip,binpack", "-o", "nonfinite=skip"), timeout=570)
    assert out.returncode == 0, out.stdout[-4000:]
    summaries = [line for line in out.stdout.splitlines() if "training step(s) of" in line]
    assert len(summaries) == 2, out.stdout[-4000:]
    # both ranks skip every such step; each one is the batch of exactly one rank, which names the
    # structure (the plan decides which rank holds it in which epoch)
    skipped = [int(re.search(r"(\d+) training step\(s\)", s).group(1)) for s in summaries]
    own = [
        int(re.search(r"(\d+) for a non-finite loss of this rank's", s).group(1)) for s in summaries
    ]
    assert skipped[0] == skipped[1] > 0 and sum(own) == skipped[0], summaries
    for s, k in zip(summaries, own):
        assert (f"{train}: structure {BAD} " in s) == (k > 0), s
        assert ("for another rank's" in s) == (k < skipped[0]), s
    state = torch.load(tmp / "skip" / "last.ckpt", map_location="cpu", weights_only=False)
    weights = [
        v
        for v in state["state_dict"].values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    ]
    assert weights and all(bool(torch.isfinite(v).all()) for v in weights)


def test_nequip_without_binpack_stops_too_and_says_how_to_have_the_structures_named(data):
    tmp, _ = data
    out = subprocess.run(
        command(tmp, "stock", "nequip"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        timeout=570,
    )
    assert out.returncode != 0, out.stdout[-4000:]
    said = errors(out.stdout)
    assert said and "not known with the trainer's own batches" in said[0], out.stdout[-4000:]
    assert not list((tmp / "stock").glob("*.ckpt"))


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs CUDA: on a GPU the losses are read without waiting (pinned copies, events)",
)
def test_on_a_gpu_the_losses_are_read_later_and_all_of_them_before_a_checkpoint():
    from types import SimpleNamespace

    from cfm_plugins.nonfinite import LossGuard, NonFiniteLossError
    from cfm_plugins_adapters.nequip.guard import NonFiniteLoss

    callback = NonFiniteLoss()
    callback.guard = LossGuard("error", trainer="nequip-train")
    trainer = SimpleNamespace(current_epoch=2, train_dataloader=None)  # what the reading uses
    for step, value in enumerate((1.5, 0.25)):
        callback.step = step
        callback._watch(trainer, torch.tensor(value, device="cuda"), None)
    assert len(callback.pending) == 2  # queued, not read
    callback.on_save_checkpoint(trainer, None, {})
    assert not callback.pending
    callback.step = 7
    callback._watch(trainer, torch.tensor(float("nan"), device="cuda"), None)
    with pytest.raises(NonFiniteLossError, match=r"is nan at epoch 2, step 7"):
        callback.on_save_checkpoint(trainer, None, {})  # before the file is written
