"""Step times and the all-reduce model (``cfm_plugins.plan.predict``)."""

from __future__ import annotations

import json
import math

import pytest

from cfm_plugins.plan.predict import (
    FABRICS,
    allreduce_seconds,
    gradient_bytes,
    parse_linear,
    read_fit,
)
from cfm_plugins.sampler.autocost import (
    Calibration,
    CostCalibration,
    StepCost,
    write_state,
)


def test_allreduce_model():
    f = FABRICS["ib-hdr"]
    nbytes = gradient_bytes(1_000_000, "float32")
    assert nbytes == 4_000_000 and gradient_bytes(10, "float64") == 80
    assert allreduce_seconds(nbytes, 1, f) == 0.0
    want = 2 * 7 / 8 * 4e6 / 25e9 + 2 * 3 * 2e-6
    assert allreduce_seconds(nbytes, 8, f) == pytest.approx(want)
    assert allreduce_seconds(nbytes, 740, f) > allreduce_seconds(nbytes, 8, f)
    for fab in FABRICS.values():
        assert fab.bandwidth > 0 and fab.latency > 0 and fab.source


def test_parse_linear():
    m = parse_linear("0.03,2.2e-5")
    assert (m.c0, m.a, m.b, m.g) == (0.03, 2.2e-5, 0.0, 0.0)
    assert m.predict(1000, 0, 1) == pytest.approx(0.052)
    for bad in ("0.03", "a,b", "0.1,-1", "1,2,3,4,5"):
        with pytest.raises(ValueError, match="C0,A"):
            parse_linear(bad)
    with pytest.raises(ValueError, match="grows with nothing"):
        parse_linear("0.1,0,0")


def test_read_fit_from_a_saved_cost_auto_state(tmp_path):
    fit = StepCost(c0=0.02, a=1e-5, b=3e-7, g=0.0, terms=("atoms", "edges"))
    cal = CostCalibration()
    cal.history.append(Calibration(1, fit, 1.1, 1.01))
    path = tmp_path / "x_run-1.cfm-binpack.json"
    write_state(path, cal.state("digest"))
    assert read_fit(str(path)) == fit
    (tmp_path / "calib.json").write_text(json.dumps({"fit": fit.to_dict()}))
    assert read_fit(str(tmp_path / "calib.json")).b == 3e-7
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="other.json: holds no step-time fit"):
        read_fit(str(tmp_path / "other.json"))
    with pytest.raises(ValueError, match="missing.json: no such file"):
        read_fit(str(tmp_path / "missing.json"))
    assert math.isfinite(read_fit(str(path)).predict(10, 10, 1))
