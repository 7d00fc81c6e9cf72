"""Per-step measurements of a mace training run (option ``step_log=PATH``).

For every optimizer step each rank records the loss, the batch's graphs and atoms, the wall time
of the whole step and the compute time of the model's forward pass (energies and forces,
measured on the inner module, so the time DDP spends waiting for other ranks is left out).
Each rank writes ``PATH.rank<r>.jsonl``; :func:`cfm_plugins.steplog.load_imbalance` turns the files into the load
imbalance factor of the HydraGNN paper (LIF = sum of per-step max / sum of per-step mean).
"""
from __future__ import annotations

import json
import time
from pathlib import Path


class StepLog:
    def __init__(self, path: str, rank: int):
        self.path = Path(f"{path}.rank{rank}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self._fwd_start = None
        self._fwd_time = 0.0

    def attach(self, model) -> None:
        """Time the forward passes of ``model`` (the module inside DDP)."""
        def pre(_module, _inputs):
            self._fwd_start = time.perf_counter()

        def post(_module, _inputs, _output):
            if self._fwd_start is not None:
                self._fwd_time += time.perf_counter() - self._fwd_start
                self._fwd_start = None

        self._hook_ids = (model.register_forward_pre_hook(pre).id, model.register_forward_hook(post).id)

    def detach_copy(self, model_copy) -> None:
        """Remove the timing hooks from a deep copy of the model (they cannot be pickled)."""
        if getattr(self, "_hook_ids", None):
            model_copy._forward_pre_hooks.pop(self._hook_ids[0], None)
            model_copy._forward_hooks.pop(self._hook_ids[1], None)

    def wrap_take_step(self, stock_take_step):
        def take_step(*args, **kwargs):
            batch = kwargs.get("batch")
            self._fwd_time = 0.0
            start = time.perf_counter()
            loss, metrics = stock_take_step(*args, **kwargs)
            record = {
                "loss": float(metrics["loss"]),
                "wall_s": time.perf_counter() - start,
                "forward_s": self._fwd_time,
                "graphs": int(batch.num_graphs) if batch is not None else None,
                "atoms": int(batch.num_nodes) if batch is not None else None,
            }
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")
            return loss, metrics

        return take_step
