"""Balanced bin-packing batches (Algorithm 1 of the MACE paper) for multi-rank GNN training.

- :func:`pack` (``packing.py``, numpy only): costs -> :class:`Packing` (``bins.py``: CSR bins,
  steps of ``world_size`` bins with nearly equal cost); :func:`pack_even` and
  :func:`pack_even_dims` (``even_dims.py``): bins of nearly equal cost, and in atoms and edges too.
- :class:`BinPackBatchSampler` (``batch_sampler.py``, the only module importing torch): a
  ``DataLoader(batch_sampler=...)`` per rank, MPI-agreed, resumable; it picks the packer from its
  options. :class:`AutoCostBatchSampler` re-plans with ``cost=auto``.
- Costs: :func:`graph_costs`, :func:`calibrate_linear_cost`, :func:`fit_linear_cost`
  (``costs.py``); :func:`fit_step_times`, :class:`StepCost`, :class:`CostCalibration`
  (``autocost.py``, numpy only: a per-graph cost fitted on the run's own step times).
- :func:`balance_report`, :func:`plot_batches`, :func:`fixed_count_batches`,
  :func:`load_imbalance_factor` (``balance.py``): how good a packing is.

The two samplers are imported lazily: ``from cfm_plugins.sampler import pack`` imports no torch.
"""

# The packers the benchmark compares against and the paper's workload live beside the benchmark
# (benchmarks/baselines.py, benchmarks/workload.py), not in the package.
from .autocost import CostCalibration, StepCost, fit_step_times
from .balance import (
    BalanceReport,
    balance_report,
    draw_batches,
    fixed_count_batches,
    load_imbalance_factor,
    plot_batches,
)
from .bins import Packing
from .costs import LinearCostFit, calibrate_linear_cost, fit_counts, fit_linear_cost, graph_costs
from .even_dims import pack_even_dims
from .packing import lower_bound_bins, pack, pack_even

__all__ = [
    "pack",
    "pack_even",
    "pack_even_dims",
    "Packing",
    "lower_bound_bins",
    "graph_costs",
    "calibrate_linear_cost",
    "fit_linear_cost",
    "fit_counts",
    "LinearCostFit",
    "fit_step_times",
    "StepCost",
    "CostCalibration",
    "balance_report",
    "BalanceReport",
    "load_imbalance_factor",
    "plot_batches",
    "draw_batches",
    "fixed_count_batches",
    "BinPackBatchSampler",
    "AutoCostBatchSampler",
]


def __getattr__(name):
    if name in ("BinPackBatchSampler", "AutoCostBatchSampler"):
        from . import batch_sampler

        return getattr(batch_sampler, name)
    raise AttributeError(f"module 'cfm_plugins.sampler' has no attribute {name!r}")
