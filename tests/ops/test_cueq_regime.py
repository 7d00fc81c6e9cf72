"""The one warning where cuEquivariance's kernels were measured faster than ours (float64 training
batches of more than 2900 atoms on an NVIDIA GPU with cuEquivariance installed): where it fires,
that it fires once, and that the fused contraction of an eager step hands it each batch."""

from __future__ import annotations

import logging

import mace  # noqa: F401  (before e3nn)
import pytest
import torch

from cfm_plugins.ops import cueq_regime
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from tests.helpers.mace_models import mace_module

CUDA = torch.device("cuda")  # a device name only: nothing runs on it in the CPU tests
CPU = torch.device("cpu")
F64, F32 = torch.float64, torch.float32
LIMIT = cueq_regime.FLOAT64_TRAIN_NODES


@pytest.fixture
def fresh(monkeypatch):
    """A process that has said nothing yet, with cuEquivariance found (it is not installed on CPU
    machines: its kernels need an NVIDIA GPU)."""
    monkeypatch.setattr(cueq_regime, "_SAID", [False])
    monkeypatch.setattr(cueq_regime, "_CUEQ", [True])


@pytest.mark.parametrize(
    "device,dtype,nodes,training,slower",
    [
        (CUDA, F64, 4000, True, True),
        (CUDA, F64, LIMIT + 1, True, True),
        (CUDA, F64, LIMIT, True, False),  # level there (1.01x at 2916 atoms on an H200)
        (CUDA, F64, 2048, True, False),  # ours faster (0.89x)
        (CUDA, F32, 4000, True, False),  # float32: ours faster at every size
        (CUDA, F64, 4000, False, False),  # inference: ours faster (0.77x at 4000 atoms)
        (CPU, F64, 4000, True, False),  # cuEquivariance's kernels do not run on CPUs
    ],
)
def test_slower_than_cueq_only_where_measured(fresh, device, dtype, nodes, training, slower):
    assert cueq_regime.slower_than_cueq(device, dtype, nodes, training) is slower


def test_nothing_to_say_without_cueq(fresh, monkeypatch):
    monkeypatch.setattr(cueq_regime, "_CUEQ", [False])
    assert not cueq_regime.slower_than_cueq(CUDA, F64, 4000, True)


def test_said_once_with_what_to_do(fresh, caplog):
    caplog.set_level(logging.WARNING, logger="cfm_plugins.ops")
    assert not cueq_regime.note_batch(CUDA, F64, 2000, True)
    assert not caplog.records
    assert [cueq_regime.note_batch(CUDA, F64, n, True) for n in (4000, 3500, 5000)] == [True] * 3
    (record,) = caplog.records
    text = record.getMessage()
    for part in ("4000 atoms", "max_tokens=2000", "--enable_cueq", "Said once"):
        assert part in text, part


def test_cueq_installed_is_looked_up_once(monkeypatch):
    monkeypatch.setattr(cueq_regime, "_CUEQ", [])
    found = cueq_regime.cueq_installed()
    import importlib.util

    assert found == (importlib.util.find_spec("cuequivariance_torch") is not None)
    assert cueq_regime._CUEQ == [found]


def _contraction(dtype=F64):
    """A fused product-block contraction (4 channels, correlation 2, 2 elements)."""
    return FusedSymmetricContraction.from_mace(mace_module("0e+1o", 4, 2, 2, True, dtype))


def _inputs(nodes, dtype=F64, device=CPU):
    g = torch.Generator().manual_seed(nodes)
    x = torch.randn(nodes, 4, 16, generator=g, dtype=dtype)  # [nodes, channels, (lmax+1)**2]
    y = torch.nn.functional.one_hot(torch.randint(0, 2, (nodes,), generator=g), 2).to(dtype)
    return x.to(device), y.to(device)


def test_the_fused_contraction_hands_each_eager_batch_over(monkeypatch):
    """What the contraction reports (device, dtype, atoms, training): training where its weights
    are trainable and gradients on; not in a calculator (weights frozen) nor under no_grad."""
    seen = []
    monkeypatch.setattr(cueq_regime, "note_batch", lambda *args: seen.append(args) or False)
    sc = _contraction()
    sc(*_inputs(7))
    assert seen[-1] == (CPU, F64, 7, True)
    with torch.no_grad():
        sc(*_inputs(9))
    assert seen[-1] == (CPU, F64, 9, False)
    for p in sc.parameters():
        p.requires_grad_(False)
    sc(*_inputs(12))
    assert seen[-1] == (CPU, F64, 12, False)
    assert len(seen) == 3


def test_a_cpu_training_batch_past_the_limit_says_nothing(fresh, caplog):
    caplog.set_level(logging.WARNING, logger="cfm_plugins.ops")
    _contraction()(*_inputs(LIMIT + 1))
    assert not caplog.records


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (not counted: no GPU here)")
def test_cuda_float64_training_batch_past_the_limit(monkeypatch, caplog):
    monkeypatch.setattr(cueq_regime, "_SAID", [False])
    caplog.set_level(logging.WARNING, logger="cfm_plugins.ops")
    sc = _contraction().cuda()
    x, y = _inputs(LIMIT + 100, device=torch.device("cuda"))
    with torch.no_grad():
        sc(x, y)
    assert not caplog.records  # inference: ours was faster
    sc(x, y)
    sc(x, y)
    said = [r for r in caplog.records if "float64 training batch" in r.getMessage()]
    assert len(said) == (1 if cueq_regime.cueq_installed() else 0)
