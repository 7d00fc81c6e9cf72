"""Pinned tiles (the ``fused_tiles`` option, ``cfm_plugins.ops.configure(tiles=...)``): tiles per
kernel (and dtype) instead of the defaults or autotuning (``cfm_plugins.ops.triton.configs``), the
labels they are written in, a bad entry an error naming it before anything is pinned, and a pinned
tile the one a launch uses."""

from __future__ import annotations

import pytest

from tests.helpers import import_triton

import_triton()
from cfm_plugins.ops.triton import configs  # noqa: E402
from cfm_plugins.ops.triton.configs import TileConfig  # noqa: E402


@pytest.fixture
def gpu_branch(monkeypatch, launch_settings):
    """pick() as on a GPU (not interpreting), no autotuning, nothing pinned; ``configure`` (every
    setting put back after the test)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    launch_settings(tiles="", autotune=False)
    return launch_settings


def test_every_listed_tile_reads_back_from_its_label():
    for kernel, per_dtype in configs.DEFAULTS.items():
        for cfgs in per_dtype.values():
            for cfg in cfgs:
                assert configs.parse_label(cfg.label(), kernel) == cfg
    assert configs.parse_label("16x32/w8") == TileConfig(16, 32, 8)


def test_pinned_tiles_win_over_the_defaults_per_kernel_and_dtype(gpu_branch):
    default = configs.pick("tp_segment", "float32", 1000)
    assert default == configs.DEFAULTS["tp_segment"]["float32"][0]
    gpu_branch(tiles=" tp_segment=8x32/w8, tp_edge:float64=4x32/w8 ,")
    assert configs.pick("tp_segment", "float32", 1000) == TileConfig(8, 32, 8)
    assert configs.pick("tp_segment", "float64", 1000) == TileConfig(8, 32, 8)
    assert configs.pick("tp_edge", "float64", 1000) == TileConfig(4, 32, 8)
    assert configs.pick("tp_edge", "float32", 1000) == configs.DEFAULTS["tp_edge"]["float32"][0]
    assert configs.pick("sc_fwd", "float64", 1000) == configs.DEFAULTS["sc_fwd"]["float64"][0]
    gpu_branch(tiles="tp_edge=8x32/w8,tp_edge:float64=4x32/w4")  # the dtype's own pin first
    assert configs.pick("tp_edge", "float64", 1000) == TileConfig(4, 32, 4)
    assert configs.pick("tp_edge", "float32", 1000) == TileConfig(8, 32, 8)
    with configs.override(tp_edge=TileConfig(2, 4)):  # the tests' override stays above any pin
        assert configs.pick("tp_edge", "float32", 1000) == TileConfig(2, 4)
    gpu_branch(tiles="")
    assert configs.pick("tp_edge", "float64", 1000) == configs.DEFAULTS["tp_edge"]["float64"][0]


def test_a_pinned_kernel_is_not_autotuned(gpu_branch):
    gpu_branch(autotune=True, tiles="tp_segment=16x32/w8")

    def run(cfg):
        raise AssertionError("a pinned kernel must not be timed")

    assert configs.pick("tp_segment", "float32", 300_000, run) == TileConfig(16, 32, 8)


@pytest.mark.parametrize(
    "entry,message",
    [
        ("tp_segmnt=8x32/w4", "unknown kernel 'tp_segmnt'; known: sc_bwd"),
        ("tp_segment=8x32", "expected ROWSxCHANNELS/wWARPS"),
        ("tp_segment=8x24/w4", "channels must be a power of two, got 24"),
        ("tp_segment=8x32/w3", "warps must be a power of two, got 3"),
        ("tp_segment=8x32/w4/defer/presort", "/defer/presort is no tile variant"),
        ("tp_edge=4x32/w4/presort", "tp_edge has one kernel); write 4x32/w4 for tp_edge"),
        ("sc_fwd=16x32/w4/defer", "/defer is no tile variant"),
        ("tp_edge:float16=8x32/w4", "dtype 'float16': float32 or float64"),
        ("tp_edge 8x32/w4", "expected KERNEL[:DTYPE]=TILE"),
    ],
)
def test_a_bad_entry_is_an_error_that_names_it_and_pins_nothing(gpu_branch, entry, message):
    gpu_branch(tiles="tp_edge=8x32/w8")
    text = f"tp_segment=8x32/w4,{entry}"
    with pytest.raises(ValueError) as err:
        gpu_branch(tiles=text)
    said = str(err.value)
    assert said.startswith(f"tiles={text!r}: entry {entry!r}: ") and message in said, said
    assert "KERNEL[:DTYPE]=TILE entries, comma separated" in said  # what is allowed
    assert configs.tiles() == "tp_edge=8x32/w8"  # the former pins stay


def test_a_pinned_tile_is_the_one_a_launch_uses(triton_cpu, launch_settings, monkeypatch):
    """In the interpreter too (where the default is one tile as large as the problem): the conv TP's
    kernels launch with the pinned tiles, smaller than the problem, and give the C++ kernels'
    results."""
    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops.conv_tp import FusedConvTP
    from tests.helpers.conv_tp_cases import graph, inputs, op_args, rel_err
    from tests.helpers.mace_models import mace_tp

    launched = []
    note = configs.note_spills
    monkeypatch.setattr(
        configs, "note_spills", lambda k, d, cfg, c: (launched.append((k, cfg)), note(k, d, cfg, c))
    )
    tp = mace_tp("0e+1o", 2, 7)
    fused = FusedConvTP.from_e3nn(tp)
    x, y, w = inputs(tp, 6, 27, torch.float64, seed=3)
    xc, g_t, desc, desc_t, meta = op_args(fused, x, graph(6, 27, seed=4, isolated=(2,)))
    g = torch.randn(6, meta[1], dtype=torch.float64)

    def passes():
        return (
            torch.ops.cfm.conv_tp_fwd(xc, y, w, g_t, desc, desc_t, meta),
            *torch.ops.cfm.conv_tp_bwd(g, xc, y, w, g_t, desc, desc_t, meta, True, True, True),
        )

    launch_settings(tiles="tp_segment:float64=2x4/w4,tp_edge=4x4/w2")
    got = passes()
    assert set(launched) == {("tp_segment", TileConfig(2, 4, 4)), ("tp_edge", TileConfig(4, 4, 2))}
    launched.clear()
    launch_settings(tiles="")
    passes()
    assert TileConfig(2, 4, 4) not in {cfg for _, cfg in launched}
    with triton_cpu():
        ref = passes()
    for a, b in zip(got, ref):
        assert b.abs().max() > 0 and rel_err(a, b) < 1e-12
