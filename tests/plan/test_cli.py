"""``cfm-plan`` as a user runs it (``cfm_plugins.plan.cli``): the tables, the JSON, the picture, the
cache, and bad input: usage errors name the argument (exit 2), data errors name the file and the
structure (exit 1), ``--skip-bad`` plans without them and counts them."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cfm_plugins.plan.cli import main
from tests.helpers import clean_env


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """40 CuNi cells of 4..72 atoms and one isolated-atom reference, as extended XYZ."""
    from ase import Atoms
    from ase.build import bulk
    from ase.io import write

    folder = tmp_path_factory.mktemp("plan_cli")
    frames = [Atoms("Cu", cell=[20, 20, 20], info={"config_type": "IsolatedAtom"})]
    rng = np.random.default_rng(0)
    for i in range(40):
        a = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(
            (int(rng.integers(1, 4)), int(rng.integers(1, 3)), 1 + i % 2)
        )
        a.rattle(0.05, seed=i)
        frames.append(a)
    write(folder / "train.xyz", frames)
    return folder


def run(argv, capsys):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_plan_with_its_json_picture_and_cache(data, tmp_path, capsys):
    argv = [data / "train.xyz", "--ranks", "1,2,4", "--r-max", "4.0", "--batch-size", "4"]
    argv += ["--device", "cpu", "--step-time", "linear:0.01,1e-4", "--params", "100000"]
    argv += ["--json", tmp_path / "plan.json", "--png", tmp_path / "plan.png"]
    code, out, err = run(argv, capsys)
    assert code == 0, err
    assert "ranks 4" in out and "speedup" in out and "efficiency" in out
    assert "1 one-atom IsolatedAtom" in out
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["data"]["structures"] == 40 and plan["excluded"]["isolated"] == 1
    assert [r["ranks"] for r in plan["results"]] == [1, 2, 4]
    for r in plan["results"]:
        for side in ("binpack", "stock"):
            assert {"steps", "lif", "straggler_ratio", "padding", "epoch_s"} <= set(r[side])
        assert r["stock"]["orders"] == 5 and "lif_min" in r["stock"]
        assert r["speedup"] > 0
    assert plan["time"]["fabric"]["name"] == "ib-hdr" and plan["time"]["params"] == 100000
    assert set(plan["efficiency"]["binpack"]) == {"1", "2", "4"}
    assert not plan["data"]["files"][0]["from_cache"]
    code, out, err = run(argv, capsys)
    assert code == 0
    assert json.loads((tmp_path / "plan.json").read_text())["data"]["files"][0]["from_cache"]


@pytest.mark.parametrize(
    "extra,named",
    [
        (["--ranks", "0"], "--ranks"),
        (["--ranks", "2,x"], "--ranks"),
        (["--ranks", "2", "--max-tokens", "-5"], "--max-tokens"),
        (["--ranks", "2", "--max-tokens", "20"], "--max-tokens"),
        (["--ranks", "2", "--format", "cif2"], "--format"),
        (["--ranks", "2", "--cost", "edges"], "--r-max"),
        (["--ranks", "2", "--cost", "bogus"], "--cost"),
        (["--ranks", "2", "--step-time", "linear:1"], "--step-time"),
        (["--ranks", "2", "--interconnect", "carrier-pigeon"], "--interconnect"),
        (["--ranks", "2", "--batch-size", "0"], "--batch-size"),
    ],
)
def test_usage_errors_name_the_argument(data, extra, named, capsys):
    code, out, err = run([data / "train.xyz", "--no-cache", "-q", *extra], capsys)
    assert code == 2 and named in err and "Traceback" not in err, err


def test_an_undetectable_format_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "data.weird").write_text("?")
    code, out, err = run([tmp_path / "data.weird", "--ranks", "2", "--no-cache"], capsys)
    assert code == 2 and "--format" in err and "data.weird" in err


def test_a_missing_or_garbled_file_is_named(tmp_path, capsys):
    code, out, err = run([tmp_path / "gone.xyz", "--ranks", "2", "--no-cache"], capsys)
    assert code == 1 and "gone.xyz: no such file" in err
    (tmp_path / "garbled.xyz").write_text("3\nx\nCu 0 0\n")
    code, out, err = run([tmp_path / "garbled.xyz", "--ranks", "2", "--no-cache", "-q"], capsys)
    assert code == 1 and "garbled.xyz" in err and "Traceback" not in err


def test_bad_structures_stop_the_plan_unless_skipped(tmp_path, capsys):
    from ase import Atoms
    from ase.io import write

    good = Atoms("Cu2", positions=[[0, 0, 0], [1.5, 1.5, 0]], cell=[4, 4, 4], pbc=True)
    write(tmp_path / "bad.xyz", [good, Atoms(), good, Atoms("Cu", pbc=True), good, good])
    argv = [tmp_path / "bad.xyz", "--ranks", "2", "--r-max", "3", "--batch-size", "2", "-q"]
    code, out, err = run([*argv, "--no-cache"], capsys)
    assert code == 1
    assert "bad.xyz: structure 1 has no atoms" in err
    assert "bad.xyz: structure 3 is periodic" in err and "--skip-bad" in err
    code, out, err = run([*argv, "--skip-bad", "--json", tmp_path / "p.json"], capsys)
    assert code == 0, err
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["excluded"]["bad"] == 2 and plan["data"]["structures"] == 4
    assert "2 bad structure(s) skipped" in out


def test_large_rank_counts_finish_and_report_lif(tmp_path, capsys):
    atoms = np.random.default_rng(0).integers(1, 400, 60_000)
    np.savez(tmp_path / "sizes.npz", atoms=atoms)
    code, out, err = run(
        [
            tmp_path / "sizes.npz",
            "--ranks",
            "1024,16384",
            "--max-tokens",
            "3072",
            "--seeds",
            "2",
            "--json",
            tmp_path / "big.json",
            "-q",
        ],
        capsys,
    )
    assert code == 0, err
    plan = json.loads((tmp_path / "big.json").read_text())
    for r in plan["results"]:
        assert r["binpack"]["lif"] >= 1.0 and r["binpack"]["steps"] >= 1
    big = plan["results"][1]
    # 12M atoms fill 3,900 bins of 3072: at 16384 ranks one step of smaller bins
    assert big["ranks"] == 16384 and big["binpack"]["bins"] == 16384
    assert big["stock"]["steps"] == 1 and big["stock"]["dropped"] == 60_000 % 16384


def test_the_command_runs_as_python_m(data, tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "cfm_plugins.plan",
            str(data / "train.xyz"),
            "--ranks",
            "2",
            "--device",
            "cpu",
            "--cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ranks 2" in res.stdout
    assert "structures/s" in res.stderr  # the progress bar: rate (and time left where known)
