"""``CFM_PLUGINS_TRITON_TILES``: tiles pinned per kernel (and dtype) on a GPU, instead of the
defaults or autotuning (``cfm_plugins.ops.triton.configs.pins``), and the labels they are written
in; a bad entry is an error naming it, at registration."""

from __future__ import annotations

import pytest

from tests.helpers import import_triton

import_triton()
from cfm_plugins.ops.triton import configs  # noqa: E402
from cfm_plugins.ops.triton.configs import TileConfig  # noqa: E402

ENV = "CFM_PLUGINS_TRITON_TILES"


@pytest.fixture
def gpu_branch(monkeypatch):
    """pick() as on a GPU (not interpreting), no autotuning, no override."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.delenv("CFM_PLUGINS_TRITON_AUTOTUNE", raising=False)
    monkeypatch.delenv(ENV, raising=False)
    return monkeypatch


def test_every_listed_tile_reads_back_from_its_label():
    for kernel, per_dtype in configs.DEFAULTS.items():
        for cfgs in per_dtype.values():
            for cfg in cfgs:
                assert configs.parse_label(cfg.label(), kernel) == cfg
    assert configs.parse_label("16x32/w8/defer/presort") == TileConfig(
        16, 32, 8, defer=True, presort=True
    )


def test_pinned_tiles_win_over_the_defaults_per_kernel_and_dtype(gpu_branch):
    default = configs.pick("tp_segment", "float32", 1000)
    assert default == configs.DEFAULTS["tp_segment"]["float32"][0]
    gpu_branch.setenv(ENV, " tp_segment=8x32/w8/defer/presort, tp_edge:float64=4x32/w4/defer ,")
    assert configs.pick("tp_segment", "float32", 1000) == TileConfig(
        8, 32, 8, defer=True, presort=True
    )
    assert configs.pick("tp_segment", "float64", 1000) == TileConfig(
        8, 32, 8, defer=True, presort=True
    )
    assert configs.pick("tp_edge", "float64", 1000) == TileConfig(4, 32, 4, defer=True)
    assert configs.pick("tp_edge", "float32", 1000) == configs.DEFAULTS["tp_edge"]["float32"][0]
    assert configs.pick("sc_fwd", "float64", 1000) == configs.DEFAULTS["sc_fwd"]["float64"][0]
    gpu_branch.setenv(ENV, "tp_edge=8x32/w8,tp_edge:float64=4x32/w4")  # the dtype's own pin first
    assert configs.pick("tp_edge", "float64", 1000) == TileConfig(4, 32, 4)
    assert configs.pick("tp_edge", "float32", 1000) == TileConfig(8, 32, 8)
    with configs.override(tp_edge=TileConfig(2, 4)):  # the tests' override stays above any pin
        assert configs.pick("tp_edge", "float32", 1000) == TileConfig(2, 4)


def test_a_pinned_kernel_is_not_autotuned(gpu_branch):
    gpu_branch.setenv("CFM_PLUGINS_TRITON_AUTOTUNE", "1")
    gpu_branch.setenv(ENV, "tp_segment=16x32/w8/defer/presort")

    def run(cfg):
        raise AssertionError("a pinned kernel must not be timed")

    assert configs.pick("tp_segment", "float32", 300_000, run) == TileConfig(
        16, 32, 8, defer=True, presort=True
    )


@pytest.mark.parametrize(
    "entry,message",
    [
        ("tp_segmnt=8x32/w4", "unknown kernel 'tp_segmnt'; known: sc_bwd"),
        ("tp_segment=8x32", "expected ROWSxCHANNELS/wWARPS"),
        ("tp_segment=8x24/w4", "channels must be a power of two, got 24"),
        ("sc_bwd=8x32/w4/presort", "/presort is a variant of tp_segment, tp_edge only, not sc_bwd"),
        ("sc_fwd=16x32/w4/defer", "/defer is a variant of tp_segment, tp_edge only, not sc_fwd"),
        ("tp_edge:float16=8x32/w4", "dtype 'float16': float32 or float64"),
        ("tp_edge 8x32/w4", "expected KERNEL[:DTYPE]=TILE"),
    ],
)
def test_a_bad_entry_is_an_error_that_names_it(gpu_branch, entry, message):
    gpu_branch.setenv(ENV, f"tp_segment=8x32/w4,{entry}")
    with pytest.raises(ValueError) as err:
        configs.pins()
    assert f"{ENV}: entry {entry!r}: " in str(err.value) and message in str(err.value)


def test_registration_refuses_a_bad_variable_before_registering(gpu_branch):
    from cfm_plugins.ops import triton as triton_kernels

    gpu_branch.setenv(ENV, "tp_segment=8x32/w3")
    with pytest.raises(ValueError, match="warps must be a power of two, got 3"):
        triton_kernels.register("CPU")
    assert not triton_kernels.registered("CPU")
