"""Predicted step and epoch times: a step-time model and the gradient all-reduce.

The step time of a rank is a :class:`~cfm_plugins.sampler.StepCost`,
``c0 + a*atoms + b*edges + g*graphs`` seconds for the batch it trains: either the fit that
binpack's ``cost=auto`` saves beside a run's checkpoints (mace:
``<checkpoints_dir>/<name>_run-<seed>.cfm-binpack.json``; HydraGNN:
``logs/<name>/<name>.cfm-binpack.json``; its last fit, made on that run's own steps, so on that
user's hardware and model; :func:`read_fit`), or coefficients given on the command line
(:func:`parse_linear`). A synchronous step lasts as long as its slowest rank, plus the all-reduce
of the gradients (:func:`allreduce_seconds`, an upper bound, over a :class:`Fabric`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from cfm_plugins.sampler.autocost import StepCost


@dataclass(frozen=True)
class Fabric:
    """A network: bandwidth per rank (bytes/s, one direction) and latency per message (s)."""

    name: str
    bandwidth: float
    latency: float
    source: str


#: named interconnects: nominal link rates of the vendors' specifications (a measured all-reduce
#: reaches about 70-90 % of them: measure yours with nccl-tests and give --bandwidth) and the order
#: of magnitude of their per-message latency. The all-reduce of an equivariant model's gradients
#: (a few million parameters) is bound by the bandwidth: the latency hardly shows.
FABRICS = {
    "nvlink3": Fabric(
        "nvlink3",
        300e9,
        3e-6,
        "NVIDIA A100 datasheet: third-generation NVLink, 600 GB/s per GPU (both directions)",
    ),
    "nvlink4": Fabric(
        "nvlink4",
        450e9,
        3e-6,
        "NVIDIA H100 datasheet: fourth-generation NVLink, 900 GB/s per GPU (both directions)",
    ),
    "slingshot11": Fabric(
        "slingshot11",
        25e9,
        2e-6,
        "HPE Slingshot-11, 200 Gb/s per NIC, one NIC per GPU on Perlmutter's and Frontier's GPU "
        "nodes (De Sensi et al., 'An in-depth analysis of the Slingshot interconnect', SC20)",
    ),
    "ib-hdr": Fabric(
        "ib-hdr",
        25e9,
        2e-6,
        "NVIDIA (Mellanox) HDR InfiniBand, 200 Gb/s per port (ConnectX-6 product brief)",
    ),
    "ib-ndr": Fabric(
        "ib-ndr",
        50e9,
        2e-6,
        "NVIDIA NDR InfiniBand, 400 Gb/s per port (ConnectX-7 / Quantum-2 product briefs)",
    ),
    "ethernet-100g": Fabric(
        "ethernet-100g",
        12.5e9,
        10e-6,
        "100 Gb Ethernet (IEEE 802.3), RoCE: a latency of several microseconds",
    ),
}
DEFAULT_FABRIC = "ib-hdr"


def allreduce_seconds(nbytes: float, ranks: int, fabric: Fabric) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``ranks``.

    The bandwidth-optimal term of a ring all-reduce (Thakur, Rabenseifner and Gropp,
    "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005),
    ``2 (W-1)/W * P / bandwidth`` for ``P`` bytes over ``W`` ranks, plus a latency term
    logarithmic in ``W`` (NCCL's double binary trees, "Massively scale your deep learning training
    with NCCL 2.4", NVIDIA technical blog, 2019), ``2 * ceil(log2 W) * latency``. It is added to
    every step in full: DDP overlaps part of it with the backward pass, so this is an upper bound.
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return (
        2.0 * (ranks - 1) / ranks * nbytes / fabric.bandwidth
        + 2.0 * math.ceil(math.log2(ranks)) * fabric.latency
    )


def gradient_bytes(params: int, dtype: str) -> int:
    """Bytes of the gradients of ``params`` parameters in ``dtype``."""
    return int(params) * (8 if dtype == "float64" else 4)


def fmt_time(s: float) -> str:
    """Seconds for people: ms, s, min or h."""
    if s >= 3600:
        return f"{s / 3600:.2f} h"
    if s >= 120:
        return f"{s / 60:.2f} min"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms"


def parse_linear(text: str) -> StepCost:
    """``C0,A[,B[,G]]`` seconds (per step, per atom, per edge, per graph) as a StepCost.

    Raises:
        ValueError: not 2 to 4 numbers >= 0 (the message says the form).
    """
    parts = [p for p in text.split(",") if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if not 2 <= len(vals) <= 4 or any(not math.isfinite(v) or v < 0 for v in vals):
        raise ValueError(
            f"{text!r}: give C0,A[,B[,G]]: seconds per step, per atom, per edge, per graph "
            "(numbers >= 0), e.g. 0.03,2.2e-5"
        )
    c0, a, b, g = (vals + [0.0, 0.0])[:4]
    if a == b == g == 0:
        raise ValueError(f"{text!r}: the step time grows with nothing (A, B and G are 0)")
    terms = tuple(n for n, v in (("atoms", a), ("edges", b), ("graphs", g)) if v > 0)
    return StepCost(c0=c0, a=a, b=b, g=g, terms=terms, clock="wall")


def read_fit(path: str) -> StepCost:
    """The step-time fit saved in ``path``: binpack's ``cost=auto`` state (its last fit), a
    calibration (``{"fit": ...}``) or a fit itself.

    Raises:
        ValueError: not such a file (the message names it and says what it holds).
    """
    from cfm_plugins.sampler.autocost import read_state

    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    try:
        state = read_state(path)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON file ({exc})") from None
    fit = None
    if isinstance(state, dict):
        if state.get("calibrations"):
            fit = state["calibrations"][-1].get("fit")
        elif isinstance(state.get("fit"), dict):
            fit = state["fit"]
        elif {"c0", "a", "b", "g"} <= set(state):
            fit = state
    if fit is None:
        raise ValueError(
            f"{path}: holds no step-time fit (expected binpack's cost=auto state, "
            "'<name>.cfm-binpack.json' beside a run's checkpoints, with at least one calibration)"
        )
    try:
        return StepCost.from_dict(fit)
    except TypeError as exc:
        raise ValueError(f"{path}: the fit in it is not a StepCost ({exc})") from None
