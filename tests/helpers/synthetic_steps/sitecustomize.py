"""Synthetic step times for the tests of ``cost=auto`` inside real trainers: a process started
with this folder on ``PYTHONPATH`` (:func:`tests.helpers.synthetic_step_env`) hands every timed
step to its sampler with the time :func:`step_seconds` gives its batch, in place of the time it
measured, so that what the fit finds does not depend on the machine's speed or load."""

import cfm_plugins.step_timer as _step_timer

_measured_hand_over = _step_timer.hand_over


def step_seconds(atoms: int, edges: int, graphs: int) -> float:
    """The synthetic time of a step: a constant, a time per atom and per edge, none per graph."""
    return 2e-3 + 4e-5 * atoms + 2e-6 * edges


def hand_over(sampler, atoms, edges, graphs, wall_s=None, cpu_s=None):
    t = step_seconds(atoms, edges, graphs)
    _measured_hand_over(sampler, atoms, edges, graphs, wall_s=t, cpu_s=t)


_step_timer.hand_over = hand_over
