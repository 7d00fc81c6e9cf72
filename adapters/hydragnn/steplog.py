"""Per-step timings of HydraGNN training from HydraGNN's own trace regions (option ``step_log=PATH``).

HydraGNN's ``train`` loop marks every step with its tracer (``hydragnn.utils.tracer`` in 3.0,
``hydragnn.utils.profiling_and_tracing.tracer`` in its source):
``tr.start("forward")`` / ``tr.stop("forward")`` around data transfer, model and loss,
``"backward"`` around ``loss.backward()`` and ``"opt_step"`` around the optimizer step, and
enables the tracer only while it trains. :class:`StepTracer` is one more tracer in HydraGNN's
tracer list: it records those regions per step and writes one JSON line per step to
``PATH.rank<r>.jsonl``.

The ``backward`` region of a rank includes DDP's gradient all-reduce, where a rank that finished
early waits for the slowest: those times are equal on all ranks whatever the imbalance. The
HydraGNN paper measures load imbalance without synchronisation waits, so the tracer also times
the backward *compute*: from the start of ``backward`` to the moment the last gradient bucket is
handed to the all-reduce (a DDP communication hook, :meth:`StepTracer.attach`). The compute time
of a step is ``forward + backward_compute``.

Each region is also timed in CPU time of the training thread (``*_cpu_s``; CPU autograd runs on
the calling thread and a rank blocked in a collective uses none): the work of a rank, unaffected by
other processes sharing its cores. On a dedicated node the two agree; on a shared machine the
wall-clock figures carry the other processes' noise and the CPU figures do not.

:func:`cfm_plugins.steplog.load_imbalance`: LIF = sum over steps of (max over ranks) / sum over steps of (mean over
ranks), the per-step form of the paper's T_max / T_avg (synchronous training waits at every step).
"""
from __future__ import annotations

import json
import time
from pathlib import Path


class StepTracer:
    """A HydraGNN tracer (start/stop/enable/disable/reset) that logs each training step."""

    REGIONS = ("forward", "backward", "opt_step", "dataload")

    def __init__(self, path: str, rank: int):
        self.path = Path(f"{path}.rank{rank}.jsonl")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.enabled = False
        self._open: dict[str, tuple[float, float]] = {}
        self._step: dict = {}
        self._last_bucket = None
        self._batch = (None, None, None)
        self._ids = None
        self.steps = 0

    # -- HydraGNN's tracer interface ---------------------------------------------------------------
    def start(self, name):
        if self.enabled and name in self.REGIONS:
            self._open[name] = (time.perf_counter(), time.thread_time())
            if name == "backward":
                self._last_bucket = None

    def stop(self, name):
        opened = self._open.pop(name, None) if self.enabled else None
        if opened is None:
            return
        now, cpu = time.perf_counter(), time.thread_time()
        t0 = opened[0]
        self._step[name + "_s"] = now - t0
        self._step[name + "_cpu_s"] = cpu - opened[1]
        if name == "backward":
            ready = self._last_bucket if self._last_bucket is not None and self._last_bucket >= t0 else now
            self._step["backward_compute_s"] = ready - t0
        elif name == "opt_step":
            self._write()

    def enable(self):
        self.enabled = True

    def disable(self):
        self.enabled = False
        self._open.clear()

    def reset(self):  # HydraGNN resets its tracers after the first epoch; our records stay
        pass

    # -- what the tracer regions cannot see --------------------------------------------------------
    def attach(self, ddp_model) -> None:
        """Mark when the last gradient bucket is ready (comm hook) and read each batch's size
        (graphs, atoms, edges; and the graphs' ``idx`` when they carry one, as PyG's QM9 does)."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed_allreduce(state, bucket):
            self._last_bucket = time.perf_counter()
            return allreduce_hook(state, bucket)

        ddp_model.register_comm_hook(None, timed_allreduce)

        def read_batch(_module, inputs):
            data = inputs[0] if inputs else None
            if data is not None and hasattr(data, "num_graphs"):
                edges = data.edge_index.shape[1] if getattr(data, "edge_index", None) is not None else None
                self._batch = (int(data.num_graphs), int(data.num_nodes), edges and int(edges))
                ids = getattr(data, "idx", None)  # graphs that carry their index (PyG's QM9 does)
                self._ids = ids.view(-1).tolist() if hasattr(ids, "view") else None

        ddp_model.module.register_forward_pre_hook(read_batch)

    def _write(self):
        rec = {"step": self.steps, **self._step}
        rec["graphs"], rec["atoms"], rec["edges"] = self._batch
        if self._ids is not None:
            rec["ids"] = self._ids
        rec["compute_s"] = rec.get("forward_s", 0.0) + rec.get("backward_compute_s", 0.0)
        rec["compute_cpu_s"] = rec.get("forward_cpu_s", 0.0) + rec.get("backward_cpu_s", 0.0)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        self.steps += 1
        self._step = {}
