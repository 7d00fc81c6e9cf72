"""benchmarks/gpu_kernels.py: the kernels alone, tiny smoke runs on the CPU (every mode, both
layers, the tile sweep) and the train chain's gradients."""

from __future__ import annotations

import importlib.util
import re

from tests.helpers import run_module
from tests.helpers.records import check_record, rows_of


def test_kernels_smoke_run_on_cpu_times_both_kernels_in_every_mode_and_names_what_is_missing(
    tmp_path,
):
    res = run_module(
        "benchmarks.gpu_kernels", *"--device cpu --quick --out".split(), str(tmp_path), timeout=570
    )
    assert res.returncode == 0, res.stdout[-3000:]
    rows = [
        [c.strip() for c in line.split("|")]
        for line in res.stdout.splitlines()
        if line.startswith("| sc |") or line.startswith("| tp |")
    ]
    assert [(r[1], r[5]) for r in rows] == [
        (k, m) for k in ("sc", "tp") for m in ("fwd", "bwd", "bwd2")
    ]
    for r in rows:
        assert float(r[6]) > 0 and float(r[10]) > 0  # stock and fused timed
        assert r[12].endswith("x")  # ours against stock, same run
    rec = check_record(tmp_path, "gpu_kernels_quick", "benchmarks.gpu_kernels")
    assert [(r[0], r[4]) for r in rows_of(rec, "kernels")] == [(r[1], r[5]) for r in rows]
    if importlib.util.find_spec("cuequivariance_torch") is None:
        assert "cueq: not run: cuequivariance-torch not installed" in res.stdout
        assert "cueq: not run: cuequivariance-torch not installed" in rec["notes"][0]


def test_kernels_time_each_layer_and_the_train_steps_chain(tmp_path):
    """``--layers 0 1``: each kernel in both layers (layer 0's conv TP takes scalars only, layer 1's
    product block gives scalars only), rows labelled by layer; ``train``: the conv TP's forces
    through
    the edge attributes and the weights, a chain of its own (other gradients than ``bwd2``'s)."""
    res = run_module(
        "benchmarks.gpu_kernels",
        *"--device cpu --quick --ways fused --layers 0 1 --modes train --out".split(),
        str(tmp_path),
        timeout=570,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    rows = [
        [c.strip() for c in line.split("|")]
        for line in res.stdout.splitlines()
        if line.startswith("| sc L") or line.startswith("| tp L")
    ]
    assert [(r[1], r[5]) for r in rows] == [
        (f"{k} L{layer}", "train") for k in ("sc", "tp") for layer in (0, 1)
    ]
    assert all(float(r[6]) > 0 for r in rows)
    assert (
        rows[2][4] == rows[3][4] and int(rows[2][4]) > 0
    )  # both layers' conv TP on the same edges


def test_the_train_chain_differentiates_the_forces_through_the_weights_too():
    import torch

    from benchmarks.gpu_kernels import run_mode

    w0 = torch.randn(5, 3, dtype=torch.float64)

    def call(x, y, w):  # a trilinear toy with the conv TP's call form
        return x * y * w

    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    bwd2 = run_mode("tp", call, [], [x, y, w0], "bwd2")
    train = run_mode("tp", call, [], [x, y, w0], "train")
    # bwd2: L = sum (d/dy sum(xyw)^2)^2 = sum (2 x^2 y w^2)^2; train adds sum (2 x^2 y^2 w)^2
    assert torch.allclose(bwd2[0], 16 * x**3 * y**2 * w0**4)
    assert torch.allclose(train[0], 16 * x**3 * y**2 * w0**4 + 16 * x**3 * y**4 * w0**2)
    assert torch.allclose(train[1], 16 * x**4 * y**2 * w0**3 + 8 * x**4 * y**4 * w0)


def test_kernels_tile_sweep_times_every_tile_config_of_each_triton_kernel_against_its_default(
    tmp_path,
):
    from cfm_plugins.ops.triton.configs import configs_for

    res = run_module(
        "benchmarks.gpu_kernels",
        *"--device cpu --quick --ways fused --kernels tp --modes fwd --tiles --out".split(),
        str(tmp_path),
        timeout=570,
    )
    assert res.returncode == 0, res.stdout[-3000:]
    rows = [
        [c.strip() for c in line.split("|")]
        for line in res.stdout.splitlines()
        if line.startswith("| tp | tp_")
    ]
    want = [
        (k, c.label() + (" (default)" if i == 0 else ""))
        for k in ("tp_segment", "tp_edge")
        for i, c in enumerate(configs_for(k, "float64"))
    ]
    assert [(r[2], r[5]) for r in rows] == want
    for r in rows:
        ms = float(r[6].split()[0])
        assert ms > 0 and (
            r[6].endswith("x)") != r[5].endswith("(default)")
        )  # alternatives vs the default
    assert "on a CPU the C++ kernels run, tiles change nothing" in res.stdout
    # the fastest tiles, as a fused_tiles value that the plugin reads back
    from cfm_plugins.ops.triton import configs

    pin = re.search(r"`-o fused_tiles=(\S+)`", res.stdout).group(1)
    pinned = configs.parse_tiles(pin)
    assert set(pinned) == {("tp_segment", "float64"), ("tp_edge", "float64")}
    assert all(cfg in configs_for(k, d) for (k, d), cfg in pinned.items())
    rec = check_record(tmp_path, "gpu_kernels_quick", "benchmarks.gpu_kernels")
    assert [(r[1], r[4]) for r in rows_of(rec, "tiles")] == want
    assert any(f"fused_tiles={pin}" in note for note in rec["notes"])
