"""Example data sets with real EMT labels, made with ASE alone (no download), deterministic for a
seed.

Size-diverse on purpose (a few atoms to a few hundred): the spread that makes fixed-count batches
unbalanced across ranks. The examples, demos, benchmarks and tests train on them; so can you.

- :mod:`~cfm_plugins.datasets.cuni`: CuNi bulk cells, slabs and clusters as extended XYZ files
  with the keys mace_run_train reads (``make_dataset``, ``make_structures``, ``make_cell512``).
- :mod:`~cfm_plugins.datasets.nequip_config`: a nequip-train config that trains on those files.
- :mod:`~cfm_plugins.datasets.clusters`: molecules and metal clusters as PyG graphs, what
  HydraGNN trains on (``make_dataset``).

Nothing is imported here: each module needs its own extras (ASE; torch_geometric for ``clusters``).
The command lines are ``examples/make_dataset.py``, ``examples/nequip_config.py`` and
``examples/hydragnn/make_dataset.py``.
"""
