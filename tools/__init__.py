"""Maintainers' tools, run from the repository root as modules: ``python -m tools.<name>``.

What a user runs to see what cfm-plugins does for them is in ``benchmarks/``; these are the
checks, profilers, studies and simulators a maintainer uses on the kernels and the sampler (each
one's docstring says how to run it). They print, or write under ``out/tools/``, never ``docs/``:

- ``triton_check`` (``make triton-check``, no GPU needed): registers and spills of every Triton
  kernel compiled for sm_80, sm_90, gfx90a and gfx942; ``triton_host``: the host time a Triton
  launch spends finding its kernel, with and without the kernel cache;
- ``gpu_profile``: where a MACE train step spends its GPU time and memory (``--by-module``: per
  MACE submodule); ``memory_peak``: what is alive at its memory peak; ``gpu_capture``: the captured
  static step (CUDA graphs) checked against the uncaptured one, free of syncs, and timed;
- ``autocost_sim``: ``cost=auto`` simulated; ``plan_check``: a run's step logs against its plan;
- ``docs_check`` (``make docs-check``): the docs' commands and links; ``run_list``: commands in a
  time limit; ``gpu_checks``: the prepared GPU run (``bash tools/gpu_checks/run.sh a``, then ``b``).
"""
