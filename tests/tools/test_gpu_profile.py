"""tools/gpu_profile.py: a smoke run on the CPU."""

from __future__ import annotations

import re

from tests.helpers import run_module


def _profile(out, *options: str) -> None:
    """``python -m tools.gpu_profile --device cpu --quick OPTIONS --out OUT``, which succeeds."""
    res = run_module(
        "tools.gpu_profile", "--device", "cpu", "--quick", *options, "--out", out, timeout=570
    )
    assert res.returncode == 0, res.stdout[-3000:]


def test_profile_smoke_run_on_cpu_shows_the_fused_operators_only_in_the_fused_step(tmp_path):
    out = tmp_path / "profile.md"
    _profile(out, "--dtypes", "float64", "--ways", "stock", "fused", "--top", "40")
    sections = dict(part.split("\n", 1) for part in out.read_text().split("### ")[1:])
    stock = next(v for k, v in sections.items() if k.endswith(": stock"))
    fused = next(v for k, v in sections.items() if k.endswith(": fused"))
    assert (
        "cfm::" not in stock and "`cfm::conv_tp_bwd`" in fused
    )  # the profiled step ran our kernels
    for body in (stock, fused):
        wall, kernels = (
            float(x) for x in re.search(r"wall ([\d.]+) ms, kernels ([\d.]+) ms", body).groups()
        )
        assert (
            0 < kernels <= wall * 1.5
        )  # self times add up to about the step (profiler overhead aside)


def test_backward_operators_land_in_the_module_whose_forward_made_them():
    """attribute_events on a toy model with MACE's submodule names: the first backward (forces)
    and the double backward of the loss on them count in the module whose forward ran the
    operator (the embedding's matrix products, the model's own tanh), the loss outside the model;
    every backward function finds its forward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tools.gpu_profile import ModuleRanges, attribute_events

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.node_embedding = torch.nn.Linear(3, 8)
            self.readouts = torch.nn.ModuleList([torch.nn.Linear(8, 1)])

        def forward(self, x):
            return self.readouts[0](torch.tanh(self.node_embedding(x))).sum()

    model = Toy().double()
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    with ModuleRanges(model), profile(activities=[ProfilerActivity.CPU]) as prof:
        energy = model(x)
        (forces,) = torch.autograd.grad(energy, x, create_graph=True)
        ((forces**2).sum() + energy).backward()
    assert not ModuleRanges(model).handles  # the hooks are gone after the block
    out = attribute_events(prof.events(), cuda=False)
    rows = out["rows"]
    assert out["unmapped"] == 0
    emb, own, outside = rows["embedding"], rows["model (other)"], rows["loss and backward"]
    assert emb["ops"]["aten::addmm"] == 1 and emb["ops"]["aten::mm"] >= 2  # forward, backward
    assert all(t > 0 for t in emb["phase_us"])  # forward, backward and double backward
    assert own["ops"]["aten::tanh"] == 1 and own["ops"]["aten::tanh_backward"] >= 1
    assert outside["ops"]["PowBackward0"] == 1 and "aten::tanh" not in outside["ops"]
    assert rows["readouts"]["ops"]["aten::addmm"] == 1 and rows["conv TP"]["launches"] == 0
    total = sum(r["us"] for r in rows.values())
    assert total == sum(sum(r["phase_us"]) for r in rows.values()) > 0


def test_by_module_smoke_run_on_cpu_has_every_row_and_our_operators_in_their_modules(tmp_path):
    """The per-module table of a small model: every module row, each way's shares summing to
    100 %, the fused way's cfm:: operators in the conv TP, product and skip connection rows only,
    none in stock's step, cuEquivariance named as not run, every backward function placed."""
    out = tmp_path / "by_module.md"
    ways = ["--ways", "stock", "cueq", "fused"]
    _profile(out, "--by-module", "--dtypes", "float64", *ways, "--top", "30")
    from tools.gpu_profile import MODULE_ROWS

    text = out.read_text()
    main_table = text.split("#### ")[0]  # the one table; each way's details follow
    table = [line for line in main_table.splitlines() if line.startswith("| ")]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table}
    assert rows["module"][:3] == [" stock ms ", " stock % ", " stock launches "]
    assert [c.strip() for c in rows["module"][3:6]] == ["fused ms", "fused %", "fused launches"]
    for name in MODULE_ROWS:
        assert name in rows, name
    for col in (1, 4):  # the shares of stock and fused
        shares = [float(rows[name][col].strip().rstrip("%")) for name in MODULE_ROWS]
        assert abs(sum(shares) - 100) < 0.5
    assert "cueq: not run: cuequivariance-torch not installed" in text
    assert "had no recorded forward" not in text
    stock_detail, fused_detail = text.split("#### stock:")[1].split("#### fused:")
    assert "cfm::" not in stock_detail
    detail = {
        line.split("|")[1].strip(): line
        for line in fused_detail.splitlines()
        if line.startswith("| ")
    }
    assert "cfm::conv_tp_fwd" in detail["conv TP"] and "cfm::conv_tp_bwd" in detail["conv TP"]
    assert "cfm::symmetric_contraction_bwd" in detail["product"]
    for name, line in detail.items():
        if name not in ("conv TP", "product", "skip connection", "radial MLP"):
            assert "cfm::" not in line, name
