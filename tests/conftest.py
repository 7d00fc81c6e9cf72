"""Fixtures shared by every test module, and the cost markers of every test (``COSTS``).

Layout: the tests mirror the package. The tests of ``cfm_plugins/<sub>/<module>.py`` are in
``tests/<sub>/test_<module>.py`` (top-level modules: ``tests/test_<module>.py``); those of an
adapter ``adapters/<trainer>/<module>.py`` in ``tests/adapters/<trainer>/test_<module>.py``, with
``test_adapter.py`` for the adapter itself (its ``__init__``: the command it serves, real training
runs); a module's tests split by what they need carry a suffix (``test_batch_sampler_mpi.py``,
``test_conv_tp_mace.py``: on whole MACE models). ``tests/datasets``, ``tests/examples``,
``tests/benchmarks`` and ``tests/tools`` test ``cfm_plugins.datasets``, the example scripts, the
benchmarks users run and the maintainers' tools. Helpers (functions, model builders) are in
``tests/helpers/``; ``tests/scripts/`` holds the programs the MPI tests launch.

Cost markers are set in one table here (``COSTS``), never on the test functions: a new costly test
gets its row there.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from tests.helpers import run_mpi

# Cost markers (declared in pyproject.toml) are set here, in this one table, by path and by test
# name, never on the test functions: ``make test`` runs the tests that carry none of them (plus
# those marked ``fast``), ``make test-all`` runs everything. A new test that runs ``mpirun``, a
# trainer, a compiler, the Triton interpreter over a whole model or a benchmark end to end gets its
# row here (or matches one).
# (path from the repository root, test name without its parameters, markers): fnmatch patterns.
# mpi: real `mpirun -np 2` jobs (and 2-rank jobs of srun's tasks or torchrun); trainer: a real
# trainer runs (mace_run_train, nequip-train, HydraGNN's training); compile: torch.compile,
# torch.export + AOTInductor, TorchScript export, a C++ or Triton ahead-of-time compile;
# interpreter: a whole model through the Triton interpreter; bench: a benchmark or maintainer tool
# run end to end; slow: over ~10 s on 2 cores otherwise; fast: kept in `make test` whatever else it
# carries (the one short 2-rank MACE run).
COSTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # mace_run_train
    ("tests/adapters/mace/test_adapter.py", "*", ("trainer",)),
    ("tests/adapters/mace/test_adapter.py", "test_mpirun_*", ("mpi",)),
    ("tests/adapters/mace/test_adapter.py", "*_on_every_rank", ("mpi",)),
    ("tests/adapters/mace/test_adapter.py", "test_mpirun_binpack_fused_*", ("fast",)),
    ("tests/adapters/mace/test_static.py", "*", ("mpi", "trainer")),
    ("tests/adapters/mace/test_static.py", "*_compiled_*", ("compile",)),
    ("tests/adapters/mace/test_tiny_runs.py", "*", ("trainer",)),
    ("tests/adapters/mace/test_tiny_runs.py", "test_mpirun_*", ("mpi",)),
    ("tests/adapters/mace/test_tiny_runs.py", "*_so_ranks_train_one_model", ("mpi",)),
    ("tests/adapters/mace/test_tiny_runs.py", "test_cost_auto_*", ("mpi",)),
    ("tests/adapters/mace/test_weighting.py", "*_on_two_ranks", ("mpi",)),
    ("tests/adapters/mace/test_workflows.py", "*", ("mpi", "trainer")),
    ("tests/adapters/mace/test_data_checks.py", "test_mace_run_train_*", ("trainer",)),
    ("tests/adapters/mace/test_data_checks.py", "test_mace_run_train_mpirun_*", ("mpi",)),
    ("tests/adapters/mace/test_guard.py", "*", ("trainer",)),
    ("tests/adapters/mace/test_guard.py", "test_mpirun_*", ("mpi",)),
    # HydraGNN's training (examples/hydragnn/train.py; from source: its MACE stack)
    ("tests/adapters/hydragnn/test_adapter.py", "test_hydragnn_uses_cfm_run_*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_adapter.py", "test_every_graph_once_*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_adapter.py", "test_reference_run_*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_adapter.py", "test_cost_auto_*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_adapter.py", "test_the_example_trains_*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_guard.py", "*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_adapter_mace.py", "*", ("mpi", "trainer")),
    ("tests/adapters/hydragnn/test_node_budget.py", "*", ("mpi", "trainer")),
    ("tests/benchmarks/test_hydragnn_samplers.py", "*", ("mpi", "trainer")),
    # nequip-train (in .venv-nequip)
    ("tests/adapters/nequip/test_adapter.py", "test_nequip_*", ("mpi", "trainer")),
    ("tests/adapters/nequip/test_adapter.py", "test_every_structure_*", ("mpi", "trainer")),
    ("tests/adapters/nequip/test_adapter.py", "test_fused_losses_*", ("mpi", "trainer")),
    (
        "tests/adapters/nequip/test_adapter.py",
        "test_checkpoint_of_a_fused_run_*",
        ("mpi", "trainer"),
    ),
    ("tests/adapters/nequip/test_adapter.py", "test_cost_auto_*", ("mpi", "trainer")),
    ("tests/adapters/nequip/test_adapter.py", "*_aotinductor_*", ("compile",)),
    ("tests/adapters/nequip/test_seams.py", "test_nequip_train_*", ("trainer",)),
    ("tests/adapters/nequip/test_guard.py", "test_nequip_*", ("mpi", "trainer")),
    ("tests/adapters/nequip/test_weighting_resume.py", "*", ("mpi", "trainer")),
    ("tests/datasets/test_nequip_config.py", "test_a_run_killed_*", ("trainer",)),
    # cfm-plan against the shared 2-rank MACE run (made once for test_adapter.py too)
    ("tests/plan/test_measured.py", "*", ("mpi", "trainer", "fast")),
    # mpirun of small programs (tests/scripts/, cfm-run itself)
    ("tests/sampler/test_batch_sampler_mpi.py", "*", ("mpi",)),
    ("tests/test_run_command.py", "test_mpirun_*", ("mpi",)),
    ("tests/test_run_command.py", "*_every_rank*", ("mpi",)),
    ("tests/test_run_command.py", "test_a_rank_killed_outright_*", ("mpi",)),
    ("tests/test_distributed.py", "test_single_node_ranks_*", ("mpi",)),
    ("tests/test_distributed.py", "test_a_users_own_mpi_*", ("mpi",)),
    ("tests/test_distributed.py", "test_a_stalled_rank_*", ("mpi",)),
    ("tests/test_distributed.py", "test_each_rank_takes_its_own_gpu_*", ("mpi",)),
    ("tests/test_distributed.py", "test_cuda_asked_for_where_no_rank_*", ("mpi",)),
    ("tests/test_distributed.py", "test_a_rendezvous_address_*", ("mpi",)),
    ("tests/test_distributed.py", "test_two_ranks_on_one_gpu_*", ("mpi", "trainer")),
    ("tests/test_distributed.py", "test_nccl_on_a_shared_gpu_*", ("mpi",)),
    # several ranks started by srun (processes with its variables) or torchrun, and mpi4py
    ("tests/test_launchers.py", "test_srun_tasks_*", ("mpi",)),
    ("tests/test_launchers.py", "test_torchrun_workers_meet_*", ("mpi",)),
    ("tests/test_launchers.py", "test_a_task_that_never_comes_*", ("mpi",)),
    ("tests/test_launchers.py", "test_a_failure_on_one_srun_task_*", ("mpi",)),
    ("tests/test_launchers.py", "test_an_mpi4py_that_does_not_see_*", ("mpi",)),
    ("tests/test_launchers.py", "test_hydragnn_which_uses_mpi_*", ("mpi",)),
    ("tests/test_launchers.py", "test_a_training_under_each_launcher_*", ("mpi", "trainer")),
    # compilers
    ("tests/*", "*torch_compile*", ("compile",)),
    ("tests/ops/test_export.py", "*_aoti_*", ("compile",)),
    ("tests/ops/test_export.py", "test_create_lammps_model_*", ("compile",)),
    ("tests/ops/test_host_syncs.py", "*_traced_*", ("compile",)),
    ("tests/ops/triton/test_aot.py", "*compile*", ("compile",)),
    ("tests/static_shapes/test_forward.py", "test_compiled_*", ("compile",)),
    # the Triton interpreter over whole MACE models
    ("tests/ops/triton/test_register_mace.py", "*", ("interpreter",)),
    ("tests/ops/triton/test_conv_tp_radial.py", "*", ("slow",)),
    # benchmarks and maintainers' tools run end to end
    *(
        (folder, name, ("bench",))
        for folder in ("tests/benchmarks/*", "tests/tools/*")
        for name in ("*smoke_run*", "*tile_sweep*", "test_kernels_time_*")
    ),
    ("tests/tools/test_triton_host.py", "*", ("bench",)),
    ("tests/benchmarks/test_startup.py", "*", ("mpi", "trainer")),
    # long for other reasons
    ("tests/test_build.py", "test_build_jobs_*", ("slow",)),
    ("tests/ops/test_symmetric_contraction_mace.py", "*", ("slow",)),
    ("tests/plan/test_readers.py", "test_mace_prepare_data_*", ("slow",)),
)


def cost_markers(path: str, name: str) -> set[str]:
    """The markers of test ``name`` (no parameters) in ``path`` (from the repository root)."""
    return {
        marker
        for path_glob, name_glob, markers in COSTS
        if fnmatchcase(path, path_glob) and fnmatchcase(name, name_glob)
        for marker in markers
    }


def pytest_configure(config):
    # a test stuck where Python cannot run: its worker ended, the test run once more (the module)
    config.pluginmanager.import_plugin("tests.helpers.stuck_tests")


def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        name = getattr(item, "originalname", None) or item.name.split("[")[0]
        marks = cost_markers(path, name)
        # needs CUDA: what skips without it, saying so (reason "needs CUDA ...")
        if any(
            "CUDA" in str(m.kwargs.get("reason", "")) and "needs" in str(m.kwargs.get("reason", ""))
            for m in item.iter_markers("skipif")
        ):
            marks.add("gpu")
        for mark in sorted(marks):
            item.add_marker(mark)
    items[:] = heavy_files_first(items, root)


#: the weight of a test by its heaviest cost marker (a trainer run costs most, a slow test least)
HEAVY = {"trainer": 4, "mpi": 3, "compile": 3, "interpreter": 3, "bench": 2, "slow": 1}


def heavy_files_first(items, root) -> list:
    """``items`` with the heaviest files first (the sum of their tests' :data:`HEAVY` weights),
    each file's tests together and in their order: pytest-xdist's ``--dist loadfile`` hands files
    out in this order, so the long files start early instead of ending the run on one worker."""
    by_file: dict = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    heavy = {
        f: sum(max((HEAVY.get(m.name, 0) for m in it.iter_markers()), default=0) for it in group)
        for f, group in by_file.items()
    }
    order = sorted(by_file, key=lambda f: -heavy[f])  # stable: ties keep collection order
    return [item for f in order for item in by_file[f]]


@pytest.fixture
def mpi():
    return run_mpi


@pytest.fixture
def f64():
    """torch's default dtype float64 for the test, restored after."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
