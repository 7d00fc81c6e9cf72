"""Maintainers' tools, run from the repository root as modules: ``python -m tools.<name>``.

What a user runs to see what cfm-plugins does for them is in ``benchmarks/``; these are the
checks, profilers, studies and simulators a maintainer uses while working on the kernels and the
sampler. They print, or write under ``out/tools/``; never into ``docs/``.

- ``triton_check``: ahead-of-time compile of every Triton kernel for sm_80, sm_90, gfx90a and
  gfx942, registers and spills (``make triton-check``; no GPU needed);
- ``triton_host``: the host time a Triton launch spends finding its kernel, with and without the
  kernel cache;
- ``gpu_profile``: where a MACE train step spends its GPU time and memory (torch.profiler);
  ``--by-module``: its time and launches per MACE submodule, every way side by side;
- ``memory_peak``: what is alive at a train step's memory peak, by the operator that made it;
- ``gpu_capture``: the captured static step (CUDA graphs) checked against the uncaptured one,
  free of syncs, and timed;
- ``autocost_sim``: ``cost=auto`` simulated on known step-time models;
- ``run_list``: runs a list of commands within a time limit, each one's output to a folder;
- ``gpu_checks``: the prepared GPU run of the whole-step work (two calls of the device machine:
  ``bash tools/gpu_checks/run.sh a``, then ``b``), with a smoke mode on the CPU.
"""
