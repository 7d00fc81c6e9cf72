"""examples/make_dataset.py, the command line of cfm_plugins.datasets.cuni: files, summary, bad
arguments."""

from __future__ import annotations

import subprocess
import sys

from ase.io import read

from tests.helpers import ROOT, clean_env

SCRIPT = ROOT / "examples" / "make_dataset.py"


def test_cli_writes_files_and_summary(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(tmp_path),
            "--n-train",
            "8",
            "--n-valid",
            "2",
            "--seed",
            "1",
            "--max-atoms",
            "64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout
    assert "train: 10 frames" in out.stdout and "atoms histogram" in out.stdout
    for name in ("train", "valid", "test", "cell512"):
        assert (tmp_path / f"{name}.xyz").exists()
    assert max(len(a) for a in read(tmp_path / "train.xyz", index=":")) <= 64
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--max-atoms", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert bad.returncode == 2 and "--max-atoms" in bad.stdout
