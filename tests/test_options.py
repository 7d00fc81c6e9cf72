"""Declared options: conversion of the values users write, and the checks done at start (issue
24)."""

from __future__ import annotations

import pytest

from cfm_plugins.config import Config
from cfm_plugins.manager import create_manager
from cfm_plugins.options import Option, convert


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "1e999"])
def test_a_float_must_be_finite(text):
    with pytest.raises(ValueError, match=f"option x='{text}' is not a finite number"):
        convert(text, float, "x")
    with pytest.raises(ValueError, match="is not a finite number"):
        Option("x", float, 1.0, "help").convert(
            float(text)
        )  # a YAML .nan / .inf arrives as a float


def test_positive_options_refuse_zero_and_negatives_naming_value_and_source():
    opt = Option("t", float, 300.0, "seconds", positive=True)
    assert opt.convert("2.5") == 2.5 and opt.convert(None) is None
    for bad in ("0", "-5", -1.0):
        with pytest.raises(
            ValueError,
            match=rf"option t={bad!r} \(from the environment \(CFM_T\)\): must be a "
            r"number > 0 \(default 300\)",
        ):
            opt.convert(bad, "the environment (CFM_T)")
    assert (
        Option("s", float, 0.0, "may be 0").convert("-1") == -1.0
    )  # only declared ones are checked


@pytest.mark.parametrize("value", ["0", "-1", "abc", "nan", "inf", float("nan")])
def test_max_tokens_and_collective_timeout_are_checked_by_create_manager(value):
    for name in ("max_tokens", "collective_timeout"):
        with pytest.raises(ValueError, match=f"option {name}="):
            create_manager(
                Config(enabled=["binpack"] if name == "max_tokens" else [], options={name: value})
            )
    config = Config(options={"max_tokens": "3072", "collective_timeout": "1800"})
    create_manager(config)
    assert config.get("max_tokens") == 3072.0 and config.get("collective_timeout") == 1800.0
