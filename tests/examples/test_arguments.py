"""The examples' command lines refuse counts they cannot run with (``--epochs 0``, ``--np 0``,
``--max-tokens 0``, ...) as usage errors naming the argument (exit 2), before any work: before,
``demo.py --epochs 0`` trained and then failed in its summary, ``--max-tokens 0`` was silently
ignored, ``--n-train 0`` failed inside mace_run_train and ``--max-atoms 2`` in numpy."""

from __future__ import annotations

import argparse

import pytest

from cfm_plugins.datasets import cuni
from cfm_plugins.testing import at_least
from tests.helpers import load_example

BAD = [
    ("demo.py", ["--epochs", "0"], "argument --epochs: '0': must be >= 1"),
    ("demo.py", ["--n-train", "0"], "argument --n-train: '0': must be >= 1"),
    ("demo.py", ["--np", "0"], "argument --np: '0': must be >= 1"),
    ("demo.py", ["--max-atoms", "3"], "argument --max-atoms: '3': must be >= 4"),
    ("demo.py", ["--max-tokens", "0"], "argument --max-tokens: '0': must be >= 1"),
    ("demo.py", ["--epochs", "two"], "argument --epochs: 'two' is not an integer"),
    ("demo_nequip.py", ["--seeds", "0"], "argument --seeds: '0': must be >= 1"),
    ("demo_nequip.py", ["--md-steps", "0"], "argument --md-steps: '0': must be >= 1"),
    ("hydragnn/demo.py", ["--max-tokens", "-5"], "argument --max-tokens: '-5': must be > 0"),
    ("hydragnn/demo.py", ["--epochs", "0"], "argument --epochs: '0': must be >= 1"),
    ("md.py", ["--model", "m.model", "--steps", "0"], "argument --steps: '0': must be >= 1"),
    ("make_dataset.py", ["--out", "x", "--n-valid", "0"], "argument --n-valid: '0': must be >= 1"),
    (
        "make_dataset.py",
        ["--out", "x", "--max-atoms", "2"],
        "argument --max-atoms: '2': must be >= 4",
    ),
]


@pytest.mark.parametrize("script,argv,says", BAD, ids=[f"{s}{' '.join(a[-2:])}" for s, a, _ in BAD])
def test_a_count_the_example_cannot_run_with_is_a_usage_error(
    script, argv, says, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # nothing may be written: the error comes first
    if script.endswith("demo.py") or script == "demo_nequip.py":
        argv = argv + ["--out", str(tmp_path / "out")]  # not examples/out
    with pytest.raises(SystemExit) as stop:
        load_example(script).main(argv)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_at_least_takes_floats_and_refuses_nan():
    positive = at_least(0, float, above=True)
    assert positive("0.5") == 0.5
    for text, says in (
        ("0", "'0': must be > 0"),
        ("nan", "'nan': must be > 0"),
        ("x", "'x' is not a number"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            positive(text)
    assert at_least(0)("0") == 0


def test_make_dataset_refuses_sizes_it_cannot_make_and_writes_an_empty_split(tmp_path):
    with pytest.raises(ValueError, match="max_atoms=3: the smallest structure made has 4 atoms"):
        cuni.make_dataset(tmp_path / "a", n_train=1, max_atoms=3)
    with pytest.raises(ValueError, match="n_valid=-1: a number of structures must be >= 0"):
        cuni.make_dataset(tmp_path / "a", n_train=1, n_valid=-1)
    assert not (tmp_path / "a").exists()
    paths = cuni.make_dataset(tmp_path / "b", n_train=2, n_valid=1, n_test=0, max_atoms=12)
    assert "test: 0 frames, no structures" in cuni.summary(paths)
