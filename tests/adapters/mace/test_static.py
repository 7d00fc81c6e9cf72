"""The ``static`` feature inside a real mace_run_train under ``mpirun -np 2``: padded batches
give the unpadded validation metrics, and a compiled run compiles once per shape and never after
epoch 0."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import run_mpi
from tests.helpers.mace_runs import CFM_RUN, mace_args, make_tiny_set


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mace_static")
    make_tiny_set(folder)
    return folder


def metrics(log: str) -> list[float]:
    """Every number of mace's validation lines (loss, RMSE_E_per_atom, RMSE_F), in order."""
    lines = re.findall(r"(?:Initial|Epoch \d+): head: Default, (loss=.*)", log)
    return [float(x) for line in lines for x in re.findall(r"=\s*([0-9.eE+-]+)", line)]


def small(args: list[str]) -> list[str]:
    """A smaller model (one interaction, correlation 2) so that compiling stays affordable on 2
    cores."""
    swap = {"--num_interactions=2": "--num_interactions=1", "--correlation=3": "--correlation=2"}
    return [swap.get(a, a) for a in args]


@pytest.mark.mpi
@pytest.mark.slow
def test_mpirun_static_shapes_give_the_same_validation_metrics(data):
    logs = {}
    for label, enable in (("plain", "mace,binpack,fused"), ("static", "mace,binpack,fused,static")):
        out = run_mpi(
            [
                CFM_RUN,
                "--enable",
                enable,
                "--",
                "mace_run_train",
                *small(mace_args(data, label, epochs=2)),
            ],
            timeout=600,
        )
        assert out.returncode == 0, out.stdout[-4000:]
        logs[label] = out.stdout
    assert "every batch padded to" in logs["static"]
    plain, static = metrics(logs["plain"]), metrics(logs["static"])
    assert len(plain) == len(static) >= 9, (plain, static)
    np.testing.assert_allclose(
        static, plain, rtol=1e-7
    )  # as printed by mace (8 decimals for the loss)


@pytest.mark.mpi
@pytest.mark.slow
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
        timeout=1200,
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
