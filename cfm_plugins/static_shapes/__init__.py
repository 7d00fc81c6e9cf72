"""Static shapes: padded fixed-size batches and one compiled model forward per budget.

- :mod:`.budget` (numpy only): :class:`Budget` (atoms, edges, graphs of a padded batch),
  :func:`budget_from_plan` (from a bin-packing plan), :class:`BudgetTracker` (raised, logged, by a
  batch that does not fit), :func:`padding_overhead`.
- :mod:`.forward` (torch): :class:`StaticForward`, the model's forward for padded batches (cuts the
  outputs back to the real graphs, atoms and edges; compiled with ``torch.compile`` per the
  ``compile`` option), :func:`install` / :func:`remove`, :func:`compile_counts`.

The ``static`` feature plugin (:mod:`cfm_plugins.plugins.static`) reaches them through the
``cfm_batch_budget`` and ``cfm_static_forward`` hooks; an adapter pads its trainer's batches
(``cfm_plugins_adapters.mace.padding`` for mace). ``CFMCalculator(static_shapes=True, compile=...)``
uses them directly for MD. The names of :mod:`.forward` are imported lazily, so that declaring the
plugin's options (``cfm-run --list``) does not import torch.
"""

from .budget import Budget, BudgetTracker, budget_from_plan, budget_of_plans, padding_overhead

#: the ``compile`` option's values; ``reduce-overhead`` (CUDA graphs) needs a CUDA device
COMPILE_MODES = ("off", "default", "max-autotune", "reduce-overhead")
#: torch.compile backends: inductor generates kernels; aot_eager runs the same captured graphs
# (forward and : backward) op by op, without code generation (minutes on a small CPU): for tests and
# debugging
COMPILE_BACKENDS = ("inductor", "aot_eager")

_FORWARD_NAMES = ("REAL_SIZES", "StaticForward", "compile_counts", "install", "installed", "remove")
__all__ = [
    "Budget",
    "BudgetTracker",
    "budget_from_plan",
    "budget_of_plans",
    "padding_overhead",
    "COMPILE_MODES",
    "COMPILE_BACKENDS",
    *_FORWARD_NAMES,
]


def __getattr__(name):
    if name in _FORWARD_NAMES:
        from . import forward

        return getattr(forward, name)
    raise AttributeError(f"module 'cfm_plugins.static_shapes' has no attribute {name!r}")
