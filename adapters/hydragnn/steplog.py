"""Per-step timings of HydraGNN training from HydraGNN's own trace regions (option
``step_log=PATH``, and ``cost=auto``).

HydraGNN's ``train`` loop marks every step with its tracer (``hydragnn.utils.tracer`` in 3.0,
``hydragnn.utils.profiling_and_tracing.tracer`` in its source): ``"forward"`` around data
transfer, model and loss, ``"backward"`` around ``loss.backward()`` and ``"opt_step"`` around the
optimizer step, enabled only while it trains. :class:`StepTracer` is one more tracer in that list:
it records those regions per step, hands each step's compute time (``compute_s``: from the start
of ``forward`` to the last gradient bucket handed to DDP's all-reduce, without the wait for other
ranks) with the batch's atoms, edges and graphs to the training sampler when that wants step times
(``cost=auto``), and with ``step_log`` writes one JSON line per step to ``PATH.rank<r>.jsonl``.
Each region is also timed in CPU time of the training thread (``*_cpu_s``). The load imbalance
factor of a log: :func:`cfm_plugins.steplog.load_imbalance`.
"""

from __future__ import annotations

import time

from cfm_plugins.api import StepLogWriter, StepTimer, batch_totals, hand_over


class StepTracer:
    """A HydraGNN tracer (start/stop/enable/disable/reset) that times each training step.

    ``path``: the step log (None: no file); ``session``: where the training sampler is
    (``session.train_sampler``, given the step times when it wants them).

    The ``backward`` region of a rank includes DDP's gradient all-reduce, where a rank that
    finished early waits for the slowest: those times are equal on all ranks whatever the
    imbalance. The HydraGNN paper measures load imbalance without synchronisation waits, so the
    tracer also times the backward *compute*: from the start of ``backward`` to the moment the
    last gradient bucket is handed to the all-reduce (a DDP communication hook, :meth:`attach`).
    The compute time of a step (``compute_s``) runs from the start of ``forward`` to that moment
    (:class:`cfm_plugins.step_timer.StepTimer`).

    Each region is also timed in CPU time of the training thread (``*_cpu_s``, and
    ``compute_cpu_s`` from the start of ``forward`` to the end of ``backward``; CPU autograd runs
    on the calling thread and a rank blocked in a collective uses none): the work of a rank,
    unaffected by other processes sharing its cores. On a dedicated node the two agree; on a
    shared machine the wall-clock figures carry the other processes' noise and the CPU figures do
    not. :func:`cfm_plugins.steplog.load_imbalance`: LIF = sum over steps of (max over ranks) /
    sum over steps of (mean over ranks), the per-step form of the paper's T_max / T_avg
    (synchronous training waits at every step).
    """

    REGIONS = ("forward", "backward", "opt_step", "dataload")

    def __init__(self, path: str | None, rank: int, session=None):
        self.writer = StepLogWriter(path, rank) if path else None
        self.session = session
        self.enabled = False
        self.timer = StepTimer()
        self._open: dict[str, tuple[float, float]] = {}
        self._step: dict = {}
        self._batch = (None, None, None)
        self._ids = None
        self.steps = 0

    # -- HydraGNN's tracer interface ---------------------------------------------------------------
    def start(self, name):
        if self.enabled and name in self.REGIONS:
            self._open[name] = (time.perf_counter(), time.thread_time())
            if name == "forward":
                self.timer.start()

    def stop(self, name):
        opened = self._open.pop(name, None) if self.enabled else None
        if opened is None:
            return
        now, cpu = time.perf_counter(), time.thread_time()
        t0 = opened[0]
        self._step[name + "_s"] = now - t0
        self._step[name + "_cpu_s"] = cpu - opened[1]
        if name == "backward":
            self._step["compute_s"], self._step["compute_cpu_s"] = self.timer.stop()
            ready = self.timer.gradients_ready_at or now
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
        self.timer.attach(ddp_model)

        def read_batch(_module, inputs):
            data = inputs[0] if inputs else None
            if data is not None and hasattr(data, "num_graphs"):
                self._batch = batch_totals(data)
                ids = getattr(data, "idx", None)  # graphs that carry their index (PyG's QM9 does)
                self._ids = ids.view(-1).tolist() if hasattr(ids, "view") else None

        ddp_model.module.register_forward_pre_hook(read_batch)

    def _write(self):
        rec = {"step": self.steps, **self._step}
        rec["atoms"], rec["edges"], rec["graphs"] = self._batch
        sampler = self.session.train_sampler if self.session is not None else None
        if rec["atoms"] is not None and "compute_s" in rec:
            hand_over(
                sampler,
                rec["atoms"],
                rec["edges"],
                rec["graphs"],
                wall_s=rec["compute_s"],
                cpu_s=rec["compute_cpu_s"],
            )
        if self._ids is not None:
            rec["ids"] = self._ids
        if self.writer is not None:
            self.writer.write(rec, sampler)
        self.steps += 1
        self._step = {}
