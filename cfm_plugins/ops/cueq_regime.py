"""Where cuEquivariance's kernels were measured faster than ours, and the one warning that says so.

Measured on GPUs (docs/benchmarks.md, docs/gpu.md), the MACE-MP-medium-like train step (energy,
forces, backward) with our Triton kernels against mace's ``enable_cueq`` in the same run:

- float32: ours faster at every size timed (0.75-0.92x cuEquivariance's at 4000 atoms);
- float64: ours faster up to about 2000 atoms a batch (an H200: 0.89x at 2048), level near 3000
  (1.01x at 2916) and slower above (1.12-1.25x at 4000 on an H200, 1.04x on an H100);
- inference (energy and forces, no training): ours faster in both dtypes at 4000 atoms (0.77x).

Binpack's float64 batches on a GPU hold 400..2000 atoms by default, where ours wins. A float64 batch
of more than :data:`FLOAT64_TRAIN_NODES` atoms trained through our kernels on an NVIDIA GPU where
cuEquivariance is installed is where ours loses: :func:`note_batch` says so once per process, with
what to do. Nothing is switched behind the user's back: the two replace the same modules with
different layouts, chosen when the model is built.
"""

from __future__ import annotations

import importlib.util
import logging

import torch

log = logging.getLogger("cfm_plugins.ops")

#: atoms in a float64 training batch above which cuEquivariance's train step was measured level
#: with ours or faster (an H200: 0.89x at 2048 atoms, 1.01x at 2916, 1.23x at 4000)
FLOAT64_TRAIN_NODES = 2900

_SAID = [False]  # whether this process has said it
_CUEQ: list = []  # whether cuequivariance_torch is installed, looked up once


def cueq_installed() -> bool:
    """Whether ``cuequivariance_torch`` is installed (found, not imported; looked up once)."""
    if not _CUEQ:
        _CUEQ.append(importlib.util.find_spec("cuequivariance_torch") is not None)
    return _CUEQ[0]


def slower_than_cueq(device: torch.device, dtype: torch.dtype, nodes: int, training: bool) -> bool:
    """Whether a batch of ``nodes`` atoms in ``dtype`` on ``device`` is where our kernels were
    measured slower than cuEquivariance's (training, float64, above :data:`FLOAT64_TRAIN_NODES`
    atoms, on an NVIDIA GPU where cuEquivariance is installed). ``training``: the model's weights
    are trainable and gradients are on (mace's trainer never switches ``.train()``/``.eval()``;
    the calculators freeze the weights)."""
    return (
        training
        and dtype == torch.float64
        and nodes > FLOAT64_TRAIN_NODES
        and device.type == "cuda"
        and torch.version.hip is None
        and cueq_installed()
    )


def message(nodes: int) -> str:
    """The warning, for a batch of ``nodes`` atoms."""
    return (
        f"cfm_plugins: a float64 training batch of {nodes} atoms on the GPU: above about "
        f"{FLOAT64_TRAIN_NODES} atoms a batch, mace's cuEquivariance kernels were measured faster "
        "than the fused ones in the float64 train step (an H200: 1.01x at 2916 atoms, 1.23x at "
        "4000; ours faster at 2048 and below, 0.89x; both far ahead of stock e3nn). For the "
        "fastest float64 training keep batches at or below 2000 atoms (binpack's default on GPUs, "
        "or -o max_tokens=2000 with cost=atoms), or train with mace's --enable_cueq instead of "
        "the fused kernels. Float32, and inference in either dtype, are faster with ours at every "
        "size measured. Said once."
    )


def note_batch(device: torch.device, dtype: torch.dtype, nodes: int, training: bool) -> bool:
    """Warn once per process when this batch is where ours loses (:func:`slower_than_cueq`);
    whether it is. Called by the fused symmetric contraction of an eager step (never while
    tracing), once per layer and batch."""
    if not slower_than_cueq(device, dtype, nodes, training):
        return False
    if not _SAID[0]:
        _SAID[0] = True
        log.warning(message(nodes))
    return True
