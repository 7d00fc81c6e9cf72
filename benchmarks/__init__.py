"""The benchmarks, run from the repository root as modules: ``python -m benchmarks.<name>
[--quick]``.

``make bench`` runs ``sampler``, ``kernels`` and ``mace_train``; ``make bench-nequip`` runs
``nequip_train``; ``gpu_mace`` is for a GPU machine. Results are in ``docs/benchmarks.md``.
What only the benchmarks use lives here too: ``workload.py`` (the MACE paper's graph-size mix)
and ``baselines.py`` (the packers the sampler is compared with).
"""
