"""What adapters share to time training steps and keep a sampler's resume state (``cost=auto``,
``step_log``).

- :class:`StepTimer` times one rank's *compute* of a step (the wall time of a whole synchronous
  step is the same on every rank, whatever the imbalance): forward plus backward up to the last
  gradient bucket handed to DDP's all-reduce, and the training thread's CPU time.
- :func:`hand_over` gives each timed step to the training loader's batch sampler (the
  ``record_step`` protocol of :func:`cfm_plugins.hookspec.cfm_needs_step_times`, and
  ``record_time``, from which binpack reports the measured balance at the end of the run).
- :class:`SamplerStateFile` keeps ``batch_sampler.resume_state()`` in a JSON file beside the
  trainer's checkpoints, for trainers whose checkpoints hold no sampler state.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("cfm_plugins")


class StepTimer:
    """Wall and thread CPU time of one step's compute on this rank: :meth:`start`, :meth:`stop`.

    A synchronous data-parallel step waits for its slowest rank inside backward (DDP's gradient
    all-reduce), so the wall time of a whole step is the same on every rank whatever the
    imbalance. The compute of one rank is its forward plus its backward up to the moment its last
    gradient bucket is handed to the all-reduce (:meth:`attach` registers a DDP communication hook
    that marks it); or the CPU time of the training thread, which on CPU runs the forward and
    backward itself and uses none while it waits for the other ranks (the gloo all-reduce runs on
    gloo's threads): the rank's work, whatever else shares its cores."""

    def __init__(self):
        self._t0 = self._c0 = None
        self._ready = None
        self.attached = False

    def start(self) -> None:
        self._t0, self._c0, self._ready = time.perf_counter(), time.thread_time(), None

    def gradients_ready(self) -> None:
        """A gradient bucket was handed to the all-reduce (the last call of a step is the one
        kept)."""
        self._ready = time.perf_counter()

    @property
    def gradients_ready_at(self) -> float | None:
        """``time.perf_counter()`` of the last gradient bucket handed over in this step, or None."""
        return (
            self._ready
            if self._ready is not None and self._t0 is not None and self._ready >= self._t0
            else None
        )

    def stop(self) -> tuple[float, float]:
        """``(wall_s, cpu_s)`` since :meth:`start`; the wall time ends at the last gradient bucket
        handed to DDP when one was seen (the waits after it are not this rank's work)."""
        now, cpu = time.perf_counter(), time.thread_time()
        if self._t0 is None:
            raise RuntimeError("StepTimer.stop() without start()")
        end = self.gradients_ready_at or now
        return end - self._t0, cpu - self._c0

    def attach(self, ddp_model) -> bool:
        """Mark the end of backward compute on ``ddp_model`` (a DistributedDataParallel) with a
        communication hook that then runs the stock all-reduce. False when it cannot (not DDP, or
        a hook is already registered: DDP takes one): the wall time then runs to :meth:`stop`."""
        if self.attached:
            return True
        if not hasattr(ddp_model, "register_comm_hook"):
            return False
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        def timed_allreduce(state, bucket):
            self.gradients_ready()
            return allreduce_hook(state, bucket)

        try:
            ddp_model.register_comm_hook(None, timed_allreduce)
        except RuntimeError as err:  # a communication hook is registered already
            log.info(
                "step timing: DDP already has a communication hook (%s); the compute wall time of "
                "a step includes its all-reduce wait",
                err,
            )
            return False
        self.attached = True
        return True


def batch_totals(batch) -> tuple[int, int, int]:
    """``(atoms, edges, graphs)`` of a PyG batch (mace's and HydraGNN's) or of a NequIP batch
    dict."""
    if isinstance(batch, dict):
        pos, edges, ptr = batch.get("pos"), batch.get("edge_index"), batch.get("ptr")
        graphs = int(ptr.shape[0] - 1) if ptr is not None else 1
        return int(pos.shape[0]), int(edges.shape[1]) if edges is not None else 0, graphs
    edges = getattr(batch, "edge_index", None)
    return (
        int(batch.num_nodes),
        int(edges.shape[1]) if edges is not None else 0,
        int(getattr(batch, "num_graphs", 1)),
    )


def hand_over(sampler, atoms: int, edges: int, graphs: int, wall_s=None, cpu_s=None) -> None:
    """Give one timed step to ``sampler``: its time for the measured balance (``record_time``,
    binpack's samplers), and the step to a sampler that wants step times (``record_step``)."""
    if sampler is None:
        return
    record_time = getattr(sampler, "record_time", None)
    if record_time is not None:
        record_time(wall_s=wall_s, cpu_s=cpu_s)
    if getattr(sampler, "needs_step_times", False):
        sampler.record_step(atoms=atoms, edges=edges, graphs=graphs, wall_s=wall_s, cpu_s=cpu_s)


def wants_step_times(config) -> bool:
    """Whether a feature asked for step times (:func:`~cfm_plugins.hookspec.cfm_needs_step_times`).

    A ``Config`` made without a plugin manager (a direct caller's, a test's) has no feature to
    ask."""
    pm = getattr(config, "pm", None)
    return pm is not None and any(pm.hook.cfm_needs_step_times(config=config))


class SamplerStateFile:
    """A training sampler's resume state in a JSON file beside the trainer's checkpoints (rank 0
    writes it when it changes; every rank reads it on resume, as every rank reads the trainer's
    checkpoint)."""

    def __init__(self, path, rank: int):
        self.path = str(path)
        self.rank = int(rank)
        self._written = None

    def save(self, sampler) -> None:
        """Rank 0 writes the sampler's state when it changed (after a fit: before the checkpoint
        a resume would start from)."""
        state = getattr(sampler, "resume_state", lambda: None)()
        if self.rank != 0 or state is None or state == self._written:
            return
        from cfm_plugins.sampler.autocost import write_state

        write_state(self.path, state)
        self._written = state

    def load(self, sampler, epoch: int | None = None, restart_at_zero: bool = False) -> bool:
        """Give the saved state to ``sampler`` (a resume at ``epoch``); False when there is none."""
        load = getattr(sampler, "load_resume_state", None)
        if load is None:
            return False
        from cfm_plugins.sampler.autocost import read_state

        state = read_state(self.path)
        if state is None:
            log.info("no saved sampler state at %s: the resumed run calibrates anew", self.path)
            return False
        self._written = state
        return load(state, epoch=epoch, restart_at_zero=restart_at_zero)
