"""benchmarks/hydragnn_samplers.py: a smoke run (``--quick``, HydraGNN from source) trains with
HydraGNN's node-budget sampler and with binpack at the same budget and records both."""

from __future__ import annotations

from tests.helpers.hydragnn_source import skip_unless_source

skip_unless_source()

from benchmarks.hydragnn_samplers import main  # noqa: E402
from tests.helpers.records import check_record, rows_of  # noqa: E402


def test_a_smoke_run_records_hydragnns_sampler_and_binpack(tmp_path):
    argv = ["--quick", "--out", str(tmp_path), "--work", str(tmp_path / "work")]
    assert main(argv) == 0
    rec = check_record(tmp_path, "hydragnn_samplers_quick", "benchmarks.hydragnn_samplers")
    hydragnn, binpack = rows_of(rec, "samplers")
    assert hydragnn[0] == "HydraGNN" and binpack[0] == "binpack" and hydragnn[2] == "1.00x"
    assert binpack[8] == "16 (0)"  # binpack trains each of the 16 graphs once per epoch
    assert "max_nodes: 116" in rec["description"]  # 8 x the mean graph, as both ran
    assert (tmp_path / "work" / "binpack0.log").read_text().count("is replaced by binpack") == 1
