"""The ``static`` feature inside a real mace_run_train under ``mpirun -np 2``: padded batches
give the unpadded validation metrics, and a compiled run compiles once per shape and never after
epoch 0."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import run_mpi
from tests.helpers.mace_runs import CFM_RUN, binpack_fused_run, mace_args, make_tiny_set, small


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mace_static")
    make_tiny_set(folder)
    return folder


def metrics(log: str) -> list[float]:
    """Every number of mace's validation lines (loss, RMSE_E_per_atom, RMSE_F), in order."""
    lines = re.findall(r"(?:Initial|Epoch \d+): head: Default, (loss=.*)", log)
    return [float(x) for line in lines for x in re.findall(r"=\s*([0-9.eE+-]+)", line)]


def test_mpirun_static_shapes_give_the_same_validation_metrics(data, tmp_path_factory):
    """The static run against the binpack+fused run of the same small model on the same (seeded)
    set, that run shared with test_adapter.py."""
    _, returncode, plain_log = binpack_fused_run(tmp_path_factory)
    assert returncode == 0, plain_log[-4000:]
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack,fused,static",
            "--",
            "mace_run_train",
            *small(mace_args(data, "static", epochs=2)),
        ],
        timeout=570,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    assert "every batch padded to" in out.stdout
    plain, static = metrics(plain_log), metrics(out.stdout)
    assert len(plain) == len(static) >= 9, (plain, static)
    np.testing.assert_allclose(
        static, plain, rtol=1e-7
    )  # as printed by mace (8 decimals for the loss)


def test_mpirun_compiled_run_compiles_once_per_shape_and_not_after_the_first_epoch(data):
    """aot_eager: the graphs dynamo captures (forward with forces, fullgraph) without code
    generation."""
    out = run_mpi(
        [
            CFM_RUN,
            "--enable",
            "mace,binpack,fused,static",
            "-o",
            "compile=default",
            "-o",
            "compile_backend=aot_eager",
            "--",
            "mace_run_train",
            *small(mace_args(data, "compiled", epochs=2)),
        ],
        timeout=570,
    )
    assert out.returncode == 0, out.stdout[-4000:]
    summary = re.findall(
        r"rank (\d): dynamo compiled (\d+) graph\(s\) for (\d+) shape\(s\).*graph breaks: (.*)",
        out.stdout,
    )
    assert sorted(s[0] for s in summary) == ["0", "1"], out.stdout[-3000:]
    for _, graphs, shapes, breaks in summary:
        assert int(graphs) == int(shapes) >= 2 and breaks.strip() == "none", summary
    after_first = out.stdout.split("Epoch 0:", 1)[1].split("Training complete", 1)[0]
    assert "compiling the forward" not in after_first  # epoch 1 reuses epoch 0's graphs
    assert "over the budget" not in out.stdout
