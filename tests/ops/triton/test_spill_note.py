"""The spill note of ``cfm_plugins.ops.triton.configs``: a launch warns once where the kernel Triton
compiled for the GPU spills registers.

On a GPU, ``kernel[grid](...)`` returns Triton's ``CompiledKernel``, whose ``n_spills`` (bytes of
local memory per thread) is set at its first launch. No driver here: the compiled kernels of the
first tests are stand-ins carrying that attribute; the last test launches a real kernel in the
interpreter (which returns no compiled kernel) through the operator.
"""

from __future__ import annotations

import logging
import types

import pytest

from tests.helpers import import_triton

import_triton()

from cfm_plugins.ops.triton import configs  # noqa: E402
from cfm_plugins.ops.triton.configs import TileConfig  # noqa: E402

LOGGER = "cfm_plugins.ops.triton"


@pytest.fixture(autouse=True)
def nothing_noted_yet(monkeypatch):
    monkeypatch.setattr(configs, "_SPILLS_NOTED", set())


def warnings_of(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
    ]


def test_a_spilling_kernel_is_named_once_with_its_tile_bytes_and_triton(caplog):
    import triton

    cfg = TileConfig(8, 32, 4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(3):
            configs.note_spills("tp_segment", "float64", cfg, types.SimpleNamespace(n_spills=1352))
    msgs = warnings_of(caplog)
    assert len(msgs) == 1, msgs
    assert "tp_segment (float64, tile 8x32/w4) spills 1352 bytes per thread" in msgs[0]
    assert f"triton {triton.__version__}" in msgs[0] and "fused_autotune=true" in msgs[0]


def test_each_kernel_dtype_and_tile_is_its_own_note_and_no_spill_says_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        configs.note_spills(
            "sc_bwd2", "float32", TileConfig(8, 32, 4), types.SimpleNamespace(n_spills=0)
        )
        configs.note_spills(
            "sc_bwd2", "float32", TileConfig(8, 32, 4), None
        )  # the interpreter's return
        configs.note_spills(
            "sc_bwd2", "float32", TileConfig(4, 32, 4), types.SimpleNamespace(n_spills=16)
        )
        configs.note_spills(
            "sc_bwd2", "float64", TileConfig(4, 32, 4), types.SimpleNamespace(n_spills=16)
        )
    msgs = warnings_of(caplog)
    assert len(msgs) == 2, msgs
    assert "sc_bwd2 (float32, tile 4x32/w4) spills 16 bytes" in msgs[0]
    assert "sc_bwd2 (float64, tile 4x32/w4) spills 16 bytes" in msgs[1]


def test_launch_runs_the_default_tile_once_and_notes_what_the_launch_returned(
    caplog, monkeypatch, launch_settings
):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # pick's GPU branch
    launch_settings(tiles="", autotune=False)
    launched = []

    def run(cfg):
        launched.append(cfg)
        return types.SimpleNamespace(n_spills=1352)

    import torch

    like = torch.zeros(0, dtype=torch.float64)  # a launch's tensor: its dtype picks the tile
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cfg = configs.launch("tp_segment", like, 300_000, run)
        configs.launch("tp_segment", like, 300_000, run)
    assert cfg == configs.DEFAULTS["tp_segment"]["float64"][0]
    assert launched == [cfg, cfg]
    msgs = warnings_of(caplog)
    assert (
        len(msgs) == 1 and f"tp_segment (float64, tile {cfg.label()}) spills 1352 bytes" in msgs[0]
    )


def test_an_interpreted_launch_goes_through_the_note_and_says_nothing(triton_cpu, caplog):
    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops.conv_tp import FusedConvTP
    from tests.helpers.conv_tp_cases import graph, inputs
    from tests.helpers.mace_models import mace_tp

    tp = mace_tp("0e+1o", 2, 3, torch.float64)
    x, y, w = inputs(tp, 4, 9, torch.float64)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = FusedConvTP.from_e3nn(tp)(x, y, w, graph(4, 9))
    assert out.abs().max() > 0
    assert [k[:2] for k in configs._SPILLS_NOTED] == [("tp_segment", "float64")]
    assert warnings_of(caplog) == []
