"""The benchmarks: what cfm-plugins does for a user, measured. Run from the repository root as
modules, ``python -m benchmarks.<name> [--quick] [--out DIR]``; each prints its tables and writes
its result as a record (``out/benchmarks/<workload>.json``, :mod:`benchmarks.record`).

- ``sampler``: the bin-packing sampler against the usual batchers on the MACE paper's mix;
- ``kernels`` (``kernels_*``): the fused kernels on the CPU against stock (and cuEquivariance's);
- ``mace_train``, ``nequip_train``, ``hydragnn_mace``: training epochs on 2 CPU ranks, stock,
  binpack, fused and both; ``static_train``: static shapes + compile against eager;
  ``static_shapes``: what padding to one budget costs;
- ``convergence``: training quality with binpack (validation curves over seeds);
- ``gpu_mace`` (the MACE step and epoch), ``gpu_md`` (MD), ``gpu_kernels`` (the kernels alone):
  on a GPU, against stock and cuEquivariance (each has a CPU smoke run).

``make bench`` runs ``sampler``, ``kernels`` and ``mace_train`` (the other targets and the tools
of ``tools/``: CONTRIBUTING.md); ``workload.py``, ``baselines.py`` and ``training.py`` are helpers.
"""
