"""The ``fused`` plugin's options: listed by ``cfm-run --list``, checked at start (a bad value is a
usage error before any work), handed once to the kernels' settings (``cfm_plugins.ops.configure``),
and ``fused_kernels=auto`` (the default): every kernel the model has, no warning for one it lacks;
a kernel named that the model lacks is still reported."""

from __future__ import annotations

import logging
import subprocess

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

import cfm_plugins.ops as ops
from cfm_plugins.config import Config
from cfm_plugins.manager import create_manager
from cfm_plugins.options import TrainerSettings
from cfm_plugins.testing import BIN, clean_env
from tests.helpers.mace_models import BLOCKS, mace_tp, tiny_mace

LOGGER = "cfm_plugins.fused"

OPTIONS = {  # name -> (type, default) as cfm-run --list shows them
    "fused_kernels": ("str", "'auto'"),
    "fused_backend": ("str {auto,cuda,triton}", "'auto'"),
    "fused_tiles": ("str", "''"),
    "fused_autotune": ("bool", "False"),
}


@pytest.fixture
def settings_kept():
    """The kernels' settings as they were before the test, after it."""
    previous = ops.settings()
    yield
    ops.configure(**previous)


def fused_config(**options) -> Config:
    config = Config(enabled=["mace", "fused"], options=options)
    create_manager(config)
    return config


def run_cfm(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "cfm-run"), *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=120,
    )


def test_every_option_is_listed_with_its_type_and_default():
    res = run_cfm("--list")
    assert res.returncode == 0, res.stderr[-2000:]
    listed = res.stdout
    for name, (kind, default) in OPTIONS.items():
        assert f"  {name} ({kind}, default {default}; fused)" in listed, name


@pytest.mark.parametrize(
    "how",
    [
        ["-o", "fused_tiles=tp_segmnt=8x32/w4"],
        ["--cfm-fused-tiles=tp_segmnt=8x32/w4"],  # in the trainer's command
        [],  # CFM_FUSED_TILES in the environment
    ],
    ids=["option", "trainer-flag", "environment"],
)
def test_a_bad_tile_is_a_usage_error_at_start_naming_option_value_and_syntax(how):
    cli, trainer = (how, []) if how[:1] == ["-o"] else ([], how)
    env = clean_env(CFM_FUSED_TILES="tp_segmnt=8x32/w4") if not how else clean_env()
    res = run_cfm(
        "--enable", "mace,fused", *cli, "--", "mace_run_train", *trainer, "--help", env=env
    )
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stdout == ""  # the trainer never started
    said = res.stderr
    assert "option fused_tiles='tp_segmnt=8x32/w4'" in said
    assert "unknown kernel 'tp_segmnt'; known: sc_bwd, sc_bwd2, sc_fwd" in said
    assert "expected KERNEL[:DTYPE]=TILE entries, comma separated" in said


def test_auto_cannot_be_mixed_with_names_and_unknown_names_are_refused():
    with pytest.raises(ValueError, match="auto means every kernel the model has and stands alone"):
        fused_config(fused_kernels="auto,conv_tp")
    with pytest.raises(ValueError, match="unknown fused kernel 'conv'"):
        fused_config(fused_kernels="conv")


def test_the_options_are_the_kernels_settings_once_started(settings_kept):
    fused_config()  # the defaults, whatever was set before
    assert ops.settings() == {"backend": "auto", "tiles": "", "autotune": False}
    fused_config(fused_tiles="tp_edge:float64=4x32/w4", fused_autotune="true", fused_backend="cuda")
    assert ops.settings() == {
        "backend": "cuda",
        "tiles": "tp_edge:float64=4x32/w4",
        "autotune": True,
    }
    from cfm_plugins.ops.triton import configs

    assert configs.pins() == {("tp_edge", "float64"): configs.TileConfig(4, 32, 4)}


@pytest.mark.parametrize("value", ["false", "true"])
def test_the_retired_deterministic_option_is_an_error_saying_what_to_do(settings_kept, value):
    """``fused_deterministic`` chose atomic adds for the weight gradients (never timed); they are
    gone, and setting the option, to either value, says so at start, not "unknown option"."""
    with pytest.raises(ValueError) as err:
        fused_config(fused_deterministic=value)
    said = str(err.value)
    assert f"cfm-plugins option fused_deterministic={value!r}: the Triton weight gradients" in said
    assert "always reduced in a fixed order" in said and "drop the option" in said
    assert "unknown" not in said


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_a_gpu_backend_asked_for_on_a_cpu_run_is_said_once_at_start(settings_kept, backend):
    """`-o fused_backend=triton` on a CPU run was ignored without a word."""
    config = fused_config(fused_backend=backend, device="cpu")
    assert len(config.warnings) == 1, config.warnings
    assert (
        f"fused_backend={backend}: this run is on the CPU, where the fused operators run their "
        "C++ CPU kernels; the option chooses the kernels of CUDA tensors" in config.warnings[0]
    )
    assert fused_config(fused_backend="auto", device="cpu").warnings == []
    if not torch.cuda.is_available():  # device auto resolves to the CPU here
        assert len(fused_config(fused_backend=backend).warnings) == 1


def test_auto_refuses_the_trainers_own_kernel_swaps_too():
    config = fused_config()
    with pytest.raises(ValueError, match="enable_cueq/enable_oeq replace the same modules"):
        config.pm.hook.cfm_trainer_settings(
            config=config, trainer=TrainerSettings(kernel_swaps=("cueq",))
        )


def patch(config, model, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        [report] = config.pm.hook.cfm_patch_model(model=model, config=config)
    return report, [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


class ConvOnly(torch.nn.Module):
    """A model whose one equivariant layer is mace's conv tensor product (as NequIP's and HydraGNN's
    message passing): no symmetric contraction."""

    def __init__(self):
        super().__init__()
        self.conv_tp = mace_tp("0e+1o", 2, 4)


def test_auto_swaps_every_kernel_a_mace_model_has(caplog):
    report, warned = patch(fused_config(), tiny_mace("MACE", BLOCKS[0], BLOCKS[1]), caplog)
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    assert warned == []


def test_auto_on_a_model_without_a_symmetric_contraction_warns_nothing(caplog):
    report, warned = patch(fused_config(), ConvOnly(), caplog)
    assert report.counts == {"symmetric_contraction": 0, "conv_tp": 1, "skip_tp": 0}
    assert warned == []
    assert "swapped in ConvOnly: conv_tp: 1 (conv_tp)\n" in caplog.text  # the kernel it has
    caplog.clear()  # a kernel named that the model lacks is still said
    named = fused_config(fused_kernels="symmetric_contraction,conv_tp")
    report, warned = patch(named, ConvOnly(), caplog)
    assert report.missing == ("symmetric_contraction",) and len(warned) == 1
    assert "has no module for symmetric_contraction of fused_kernels" in warned[0].getMessage()


def test_auto_on_a_model_with_nothing_to_fuse_says_so_once(caplog):
    config, model = fused_config(), torch.nn.Sequential(torch.nn.Linear(3, 2))
    report, warned = patch(config, model, caplog)
    patch(config, model, caplog)  # nequip patches at every Trainer setup: said once per model
    assert report.total == 0 and len(warned) == 1
    said = warned[0].getMessage()
    assert "Sequential" in said and "no module that a fused kernel" in said
    assert "nothing was swapped" in said
