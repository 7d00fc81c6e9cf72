"""Timing of mace's training steps: the step log (option ``step_log=PATH``) and ``cost=auto``.

``mace.tools.train.take_step`` is wrapped (:meth:`StepRecorder.wrap_take_step`). For every
optimizer step each rank measures the compute of the step
(:class:`cfm_plugins.step_timer.StepTimer`: wall time from the start of the step to its last
gradient bucket handed to DDP's all-reduce, and the training thread's CPU time of the step; the
waits for other ranks are in neither) and
hands it with the batch's atoms, edges and graphs to the training sampler when that wants step
times (``cost=auto``).

With ``step_log`` each rank also writes ``PATH.rank<r>.jsonl``: the loss, the batch's graphs,
atoms and edges, the wall time of the whole step, the compute times above (``compute_s``,
``compute_cpu_s``) and the time of the model's forward pass (energies and forces, measured on
the inner module). :func:`cfm_plugins.steplog.load_imbalance` turns the files into the load
imbalance factor of the HydraGNN paper (LIF = sum of per-step max / sum of per-step mean).
"""

from __future__ import annotations

import time

from cfm_plugins.api import StepLogWriter, StepTimer, batch_totals, hand_over


class StepRecorder:
    def __init__(self, session, path: str | None = None):
        self.session = session
        self.writer = StepLogWriter(path, session.dist.rank) if path else None
        self.timer = StepTimer()
        self._fwd_start = None
        self._fwd_time = 0.0
        self._hook_ids = None

    def attach(self, model) -> None:
        """Time the forward passes of ``model`` (the module inside DDP) for the step log."""
        if self.writer is None:
            return

        def pre(_module, _inputs):
            self._fwd_start = time.perf_counter()

        def post(_module, _inputs, _output):
            if self._fwd_start is not None:
                self._fwd_time += time.perf_counter() - self._fwd_start
                self._fwd_start = None

        self._hook_ids = (
            model.register_forward_pre_hook(pre).id,
            model.register_forward_hook(post).id,
        )

    def attach_ddp(self, ddp_model) -> None:
        """Mark the end of each step's backward compute (DDP's last gradient bucket)."""
        self.timer.attach(ddp_model)

    def detach_copy(self, model_copy) -> None:
        """Remove the timing hooks from a deep copy of the model (they cannot be pickled)."""
        if self._hook_ids:
            model_copy._forward_pre_hooks.pop(self._hook_ids[0], None)
            model_copy._forward_hooks.pop(self._hook_ids[1], None)

    def wrap_take_step(self, stock_take_step):
        def take_step(*args, **kwargs):
            batch = kwargs.get("batch")
            self._fwd_time = 0.0
            start = time.perf_counter()
            self.timer.start()
            loss, metrics = stock_take_step(*args, **kwargs)
            compute_s, compute_cpu_s = self.timer.stop()
            sampler = self.session.train_sampler
            atoms = edges = graphs = None
            if batch is not None:
                atoms, edges, graphs = batch_totals(batch)
                hand_over(sampler, atoms, edges, graphs, wall_s=compute_s, cpu_s=compute_cpu_s)
            if self.writer is not None:
                self.writer.write(
                    {
                        "loss": float(metrics["loss"]),
                        "wall_s": time.perf_counter() - start,
                        "forward_s": self._fwd_time,
                        "compute_s": compute_s,
                        "compute_cpu_s": compute_cpu_s,
                        "graphs": graphs,
                        "atoms": atoms,
                        "edges": edges,
                    },
                    sampler,
                )
            return loss, metrics

        return take_step
