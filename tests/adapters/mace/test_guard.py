"""A training step whose loss is not finite, in real mace_run_train runs: two atoms on one site in
structure 5 of the training file (its labels are finite, so nothing catches it at start; the
model's values for it are NaN). mace alone trains on to a NaN model and exits 0."""

from __future__ import annotations

import re

import numpy as np
import torch
from ase.io import read, write

from tests.helpers import run_mpi
from tests.helpers.mace_runs import CFM_RUN, make_tiny_set, run_tiny, tiny_args

BAD = 5  # the structure of train.xyz (counted from 0) with two atoms on one site


def make_set(folder, n_train):
    make_tiny_set(folder, n_train=n_train, n_valid=2)
    frames = read(folder / "train.xyz", index=":")
    frames[BAD].positions[1] = frames[BAD].positions[0]
    write(folder / "train.xyz", frames)


def named(text: str, folder) -> list[list[int]]:
    """The structures of train.xyz each message names as a batch's."""
    pattern = re.escape(f"{folder / 'train.xyz'}: structure") + r"s? ([0-9, ]+)"
    return [[int(i) for i in m.split(", ")] for m in re.findall(pattern, text)]


def test_binpack_stops_at_the_first_non_finite_loss_naming_the_structures_of_its_batch(tmp_path):
    make_set(tmp_path, n_train=8)
    out = run_tiny(tmp_path, "mace,binpack", epochs=2)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "NonFiniteLossError: the training loss of mace_run_train is nan at epoch 0" in out.stdout
    batches = named(out.stdout.split("NonFiniteLossError:", 1)[1], tmp_path)
    assert batches and BAD in batches[0], out.stdout[-3000:]
    assert "before any checkpoint was written" in out.stdout
    # stopped inside epoch 0: no validation of it, no checkpoint, no model
    assert "Epoch 0:" not in out.stdout
    assert not (tmp_path / "checkpoints").exists() or not list((tmp_path / "checkpoints").iterdir())
    assert not list(tmp_path.glob("*.model"))


def test_the_trainers_own_batches_stop_too_and_say_how_to_have_them_named(tmp_path):
    make_set(tmp_path, n_train=8)
    out = run_tiny(tmp_path, "mace", epochs=2)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "the training loss of mace_run_train is nan at epoch 0, step" in out.stdout
    assert "not known with the trainer's own batches" in out.stdout, out.stdout[-3000:]
    assert not list(tmp_path.glob("*.model"))


def test_mpirun_nonfinite_skip_trains_without_those_steps_and_names_them(tmp_path):
    """2 ranks, nonfinite=skip: the steps holding structure 5 are skipped on both ranks (no
    optimizer step), named at the end; the run completes with a finite model."""
    make_set(tmp_path, n_train=24)
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack",
            "-o",
            "nonfinite=skip",
            "--",
            "mace_run_train",
            *tiny_args(tmp_path, "x", 2),
        ],
        timeout=570,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    summaries = [line for line in out.stdout.splitlines() if "training step(s) of" in line]
    assert len(summaries) == 2, out.stdout[-4000:]  # one per rank
    for rank in (0, 1):
        assert any(f"skipped on rank {rank} (no optimizer step)" in s for s in summaries)
    own = [b for s in summaries for b in named(s, tmp_path)]
    assert own and all(BAD in b for b in own), summaries  # only the batches holding it
    skipped = sum(int(re.search(r"(\d+) training step", s).group(1)) for s in summaries)
    assert skipped == 2 * 2  # once per epoch, on both ranks
    for label in ("Epoch 0", "Epoch 1"):
        loss = re.search(rf"{label}: head: Default, loss=\s*([0-9.eE+-]+|nan)", out.stdout)
        assert loss and np.isfinite(float(loss.group(1))), out.stdout[-3000:]
    model = torch.load(tmp_path / "x.model", weights_only=False)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
