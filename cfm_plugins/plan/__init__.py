"""``cfm-plan``: binpack's packing, the balance and the epoch time at a target rank count, from the
user's own data files, before a large run (docs/plan.md).

- :mod:`.readers`: the data files as the trainers read them (extended XYZ and ASE formats, mace's
  HDF5 and LMDB, ASE databases, PyG graph lists, sizes files), sizes only;
- :mod:`.neighbours`: edge counts at a cutoff with periodic images (compiled: ``cfm::count_edges``;
  else vesin or matscipy);
- :mod:`.sizes`, :mod:`.cache`: every structure checked, counted once, cached beside the output;
- :mod:`.planning`: binpack's bins from the sampler's own code next to the trainer's own batches
  (``DistributedSampler`` + :func:`~cfm_plugins.sampler.fixed_count_batches`), LIF and balance;
- :mod:`.predict`: step time (a saved ``cost=auto`` fit or coefficients) and gradient all-reduce;
- :mod:`.report`: the tables, the JSON and the picture; :mod:`.cli`: the command; ``--compare``:
  :mod:`.compare`, the other trainers' samplers modelled in :mod:`.peer_samplers`.

At the top of the package's layers: it reads the sampler and binpack's capacity rule.
"""
