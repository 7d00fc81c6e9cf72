"""binpack: balanced bin-packing batches (Algorithm 1 of the MACE paper) on every rank.

Options (``--cfm-<name>``, ``CFM_<NAME>``, ``-o name=value`` or the ``cfm_plugins:`` config key):

- ``max_tokens``: the bin capacity in cost units (atoms by default). Default: the trainer's batch
  size times the mean graph cost (so an epoch has about as many steps as with the trainer's own
  batches), at least the largest graph; on GPUs clamped to the paper's section 5.5 range
  (800..4000 atoms in float32, 400..2000 in float64: enough to saturate an A100, below its
  memory ceiling).
- ``cost``: ``atoms`` (default), ``edges`` or ``linear`` (``cost_a*atoms + cost_b*edges``).
- ``oversize``: ``error`` (default), ``solo`` (alone in its own batch) or ``skip``.
- ``seed``: packing seed (default: the trainer's seed, else 0); re-packed each epoch from seed+epoch.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from cfm_plugins.hookspec import hookimpl

log = logging.getLogger("cfm_plugins.binpack")

GPU_TOKEN_RANGE = {"float32": (800, 4000), "float64": (400, 2000)}


def default_capacity(mean_cost: float, max_cost: float, batch_size: int, device: str = "cpu",
                     dtype: str = "float64") -> int:
    """The default bin capacity described in this module's docstring."""
    cap = math.ceil(mean_cost * max(int(batch_size), 1))
    if device == "cuda":
        lo, hi = GPU_TOKEN_RANGE.get(dtype, GPU_TOKEN_RANGE["float32"])
        cap = min(max(cap, lo), hi)
    return max(cap, math.ceil(max_cost))


def cost_kind(config) -> str:
    return config.get("cost", "atoms", str)


def costs_from_sizes(sizes, config) -> np.ndarray:
    from cfm_plugins.sampler import graph_costs

    return graph_costs(sizes.atoms, sizes.edges, kind=cost_kind(config),
                       a=config.get("cost_a", 1.0, float), b=config.get("cost_b", 0.0, float))


def global_stats(costs: np.ndarray, dist) -> tuple[float, float]:
    """(mean, max) cost over every rank's shard."""
    if dist.world_size == 1 or dist.comm is None:
        return float(np.mean(costs)), float(np.max(costs))
    n, total, peak = dist.comm.allreduce(len(costs)), dist.comm.allreduce(float(np.sum(costs))), \
        dist.comm.allreduce(float(np.max(costs)) if len(costs) else 0.0, op=_mpi_max())
    return total / max(n, 1), peak


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


@hookimpl
def cfm_configure(config):
    kind = config.get("cost", "atoms", str)
    if kind not in {"atoms", "edges", "linear"}:
        raise ValueError(f"binpack option cost={kind!r}: expected atoms, edges or linear")
    if config.get("max_tokens") is not None and config.get("max_tokens", type=float) <= 0:
        raise ValueError(f"binpack option max_tokens={config.get('max_tokens')!r} must be positive")


@hookimpl
def cfm_batch_sampler(dataset, sizes, config, dist, role):
    from cfm_plugins.sampler import BinPackBatchSampler

    costs = costs_from_sizes(sizes, config)
    capacity = config.get("max_tokens", None, float)
    if capacity is None:
        mean, peak = global_stats(costs, dist)
        capacity = default_capacity(mean, peak, config.get("batch_size", 8, int), dist.device,
                                    config.get("dtype", "float64", str))
    sampler = BinPackBatchSampler(
        costs, capacity, rank=dist.rank, world_size=dist.world_size,
        seed=config.get("seed", 0, int), comm=dist.comm if dist.world_size > 1 else None,
        local_indices=sizes.indices, oversize=config.get("oversize", "error", str),
        shuffle=(role == "train"), evaluation=(role != "train"),
    )
    log.info("binpack %s: %d steps on each of %d ranks, capacity %g (%s)",
             role, len(sampler), dist.world_size, capacity, cost_kind(config))
    return sampler
