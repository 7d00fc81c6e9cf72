"""benchmarks/gpu_mace.py, gpu_md.py, gpu_profile.py and gpu_kernels.py: log parsing and tiny smoke
runs on the CPU.

The GPU figures themselves come from running the script on a GPU machine (docs/benchmarks.md);
here we check that the script cannot rot: it builds the workload, runs every way it can, names the
ways it cannot run, and reads mace's epoch times correctly.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from benchmarks import gpu_mace
from tests.helpers import ROOT, clean_env

LOG = """\
2026-11-22 10:00:00.000 INFO: Started training, reporting errors on validation set
2026-11-22 10:00:01.500 INFO: Initial: head: Default, loss=1.0, RMSE_E_per_atom=1.00 meV, RMSE_F=1.00 meV / A
2026-11-22 10:00:11.750 INFO: Epoch 0: head: Default, loss=0.9, RMSE_E_per_atom=1.00 meV, RMSE_F=1.00 meV / A
2026-11-22 10:00:11.800 INFO: Epoch 0: head: Other, loss=0.9, RMSE_E_per_atom=1.00 meV, RMSE_F=1.00 meV / A
2026-11-22 10:00:14.000 INFO: Epoch 1: head: Default, loss=0.8, RMSE_E_per_atom=1.00 meV, RMSE_F=1.00 meV / A
"""  # noqa: E501


def test_epoch_seconds_reads_mace_validation_lines():
    assert gpu_mace.epoch_seconds(LOG, 0) == 10.25  # from "Initial" to the first "Epoch 0" line
    assert gpu_mace.epoch_seconds(LOG, 1) == 2.25  # first line of each epoch (several heads)
    assert gpu_mace.epoch_seconds(LOG, 2) is None


def test_step_ratios_are_to_stock_and_cueq_of_the_same_group_whichever_runs_first():
    """An H100 run printed ours without a ratio to cuEquivariance, which ran after it: the rows of a
    group now take their ratios once the group is done."""
    import torch

    def row(way, inference_ms, train_ms, force):
        return {
            "way": way,
            "inference_s": inference_ms / 1e3,
            "train_s": train_ms / 1e3,
            "peak_gib": 2.0,
            "forces": torch.full((3, 3), force, dtype=torch.float64),
        }

    label = "| float64 | 4000 | 312012 | {} |".format
    group = [
        (label("stock"), row("stock", 80.0, 400.0, 1.0)),
        (label("fused[triton]"), row("fused", 40.0, 140.0, 1.5)),
        (label("fused[cuda]"), "no C++ CUDA kernels in this build"),
        (label("cueq"), row("cueq", 64.0, 140.0, 1.0)),
    ]
    assert gpu_mace.step_rows(group) == [
        "| float64 | 4000 | 312012 | stock | 80.0 | 400.0 | 1.00x | 2.00 | 0.0e+00 | 1.25x | 2.86x |",  # noqa: E501
        "| float64 | 4000 | 312012 | fused[triton] | 40.0 | 140.0 | 0.35x | 2.00 | 5.0e-01 | 0.62x | 1.00x |",  # noqa: E501
        "| float64 | 4000 | 312012 | fused[cuda] | - | - | - | - | - | - | no C++ CUDA kernels in this build |",  # noqa: E501
        "| float64 | 4000 | 312012 | cueq | 64.0 | 140.0 | 0.35x | 2.00 | 0.0e+00 | 1.00x | 1.00x |",  # noqa: E501
    ]
    assert all(
        len(line.split("|")) == len(gpu_mace.STEP_HEADER[0].split("|"))
        for line in gpu_mace.step_rows(group)
    )
    alone = gpu_mace.step_rows(group[1:2])  # neither stock nor cuEquivariance ran
    assert alone == [
        "| float64 | 4000 | 312012 | fused[triton] | 40.0 | 140.0 | - | 2.00 | - | - | - |"
    ]


def test_smoke_run_on_cpu_names_what_it_cannot_run():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_mace.py"),
            "--device",
            "cpu",
            "--quick",
            "--dtypes",
            "float64",
            "--no-epoch",
            "--tiles-also",
            "tp_segment=8x32/w4",
            "--zero-filled-also",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {
        line.split("|")[4].strip(): line
        for line in res.stdout.splitlines()
        if line.startswith("| float64 |")
    }
    # one more fused row, the tiles pinned (on a CPU: no change)
    tiled = "fused tiles tp_segment=8x32/w4"
    zero_filled = (
        "fused zero-filled"  # and one with CFM_PLUGINS_TRITON_UNFILLED=0 (on a CPU: no change)
    )
    assert set(rows) == {"stock", "cueq", "fused", "fused+capture", tiled, zero_filled}, res.stdout
    assert "gpu_capture.py" in rows["fused+capture"]  # the captured step has its own script
    for way in ("fused", tiled, zero_filled):
        fused = [c.strip() for c in rows[way].split("|")]
        assert float(fused[5]) > 0 and float(fused[6]) > 0  # inference and train times measured
        assert float(fused[9]) < 1e-8  # forces of the fused model equal stock's (float64)
        assert fused[10] == fused[11] == "-"  # no cuEquivariance here: no ratios to it


def test_a_misspelt_tiles_value_stops_the_run_before_any_model_is_built():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_mace.py"),
            "--device",
            "cpu",
            "--quick",
            "--no-epoch",
            "--tiles-also",
            "tp_segmnt=8x32/w4",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode != 0 and "--tiles-also 'tp_segmnt=8x32/w4'" in res.stderr
    assert "unknown kernel 'tp_segmnt'" in res.stderr and "| float64 |" not in res.stdout


def test_pinned_tiles_set_the_variable_inside_the_block_only(monkeypatch):
    import os

    monkeypatch.setenv("CFM_PLUGINS_TRITON_TILES", "tp_edge=8x32/w8")
    with gpu_mace.pinned_tiles("tp_segment=8x32/w4"):
        assert os.environ["CFM_PLUGINS_TRITON_TILES"] == "tp_segment=8x32/w4"
    assert os.environ["CFM_PLUGINS_TRITON_TILES"] == "tp_edge=8x32/w8"
    monkeypatch.delenv("CFM_PLUGINS_TRITON_TILES")
    with gpu_mace.pinned_tiles(None):
        assert "CFM_PLUGINS_TRITON_TILES" not in os.environ
    with gpu_mace.pinned_tiles("tp_segment=8x32/w4"):
        pass
    assert "CFM_PLUGINS_TRITON_TILES" not in os.environ
    with gpu_mace.pinned_env(
        {"CFM_PLUGINS_TRITON_UNFILLED": "1", "CFM_PLUGINS_TRITON_TILES": "tp_edge=8x32/w8"}
    ):
        assert os.environ["CFM_PLUGINS_TRITON_UNFILLED"] == "1"
    assert (
        "CFM_PLUGINS_TRITON_UNFILLED" not in os.environ
        and "CFM_PLUGINS_TRITON_TILES" not in os.environ
    )


def test_backends_give_one_fused_row_each_on_cuda():
    import torch

    ways = gpu_mace.expand_ways(
        ["stock", "fused", "fused+capture"], ["cuda", "triton"], torch.device("cuda")
    )
    assert ways == [
        ("stock", None),
        ("fused[cuda]", "cuda"),
        ("fused[triton]", "triton"),
        ("fused+capture", None),
    ]
    # on the CPU the backend of CUDA tensors changes nothing: one fused row
    assert gpu_mace.expand_ways(["fused"], ["cuda", "triton"], torch.device("cpu")) == [
        ("fused", None)
    ]


def test_epoch_ways_add_static_capture_per_backend():
    import torch

    mpirun = ["mpirun", "-np", "1"]
    ways = gpu_mace.epoch_commands(
        ["stock", "fused", "fused+capture"], ["cuda", "triton"], torch.device("cuda"), mpirun
    )
    assert list(ways) == [
        "stock",
        "fused+binpack[cuda]",
        "fused+binpack[triton]",
        "fused+binpack+static+capture[cuda]",
        "fused+binpack+static+capture[triton]",
    ]
    captured = ways["fused+binpack+static+capture[triton]"]
    assert captured[:3] == mpirun and captured[-1] == "mace_run_train"
    assert "mace,binpack,fused,static" in captured and "compile=reduce-overhead" in captured
    assert "fused_backend=triton" in captured
    assert "static" not in " ".join(ways["fused+binpack[triton]"])
    # no CUDA graphs on a CPU: inductor's default mode, one row
    cpu = gpu_mace.epoch_commands(
        ["fused+capture"], ["cuda", "triton"], torch.device("cpu"), mpirun
    )
    assert (
        list(cpu) == ["fused+binpack+static+capture"]
        and "compile=default" in cpu["fused+binpack+static+capture"]
    )


def test_an_epoch_run_past_its_timeout_is_stopped_with_its_children_and_keeps_its_log():
    import os
    import time

    child = "import time; time.sleep(120)"
    script = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('child', p.pid, flush=True); time.sleep(120)"
    )
    start = time.monotonic()
    text, rc = gpu_mace.run_logged([sys.executable, "-c", script], dict(os.environ), timeout=3)
    assert rc is None and time.monotonic() - start < 60
    pid = int(re.search(r"child (\d+)", text).group(1))
    for _ in range(50):  # the grandchild (an MPI rank, in a real run) is stopped too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"process {pid} of the stopped run is still alive")
    assert gpu_mace.run_logged(
        [sys.executable, "-c", "print('done')"], dict(os.environ), timeout=30
    ) == ("done\n", 0)


def test_md_smoke_run_on_cpu_times_each_way_and_compares_forces():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_md.py"),
            "--device",
            "cpu",
            "--atoms",
            "32",
            "--dtypes",
            "float64",
            "--hidden",
            "8x0e+8x1o",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--ways",
            "stock",
            "fused[cuda]",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {
        line.split("|")[3].strip(): [c.strip() for c in line.split("|")]
        for line in res.stdout.splitlines()
        if line.startswith("| float64 |")
    }
    assert set(rows) == {"stock", "fused[cuda]"}, (
        res.stdout
    )  # on CPU tensors the C++ CPU kernels run
    assert (
        float(rows["fused[cuda]"][4]) > 0 and float(rows["fused[cuda]"][7]) < 1e-8
    )  # timed; forces equal stock's
    assert (
        rows["fused[cuda]"][5].endswith("x") and rows["fused[cuda]"][6] == "-"
    )  # vs stock; cueq did not run
    for (
        row
    ) in rows.values():  # the model's input, made on the host: part of the step, not all of it
        assert 0 < float(row[8]) < float(row[4])
        assert float(row[9]) > 0  # the first evaluation, timed on its own


def test_md_rejects_an_unknown_way_before_building_anything():
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_md.py"),
            "--device",
            "cpu",
            "--ways",
            "stock",
            "fused[triton]+captured",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
    )
    assert res.returncode == 2 and "invalid choice: 'fused[triton]+captured'" in res.stderr, (
        res.stderr[-2000:]
    )


def test_profile_smoke_run_on_cpu_shows_the_fused_operators_only_in_the_fused_step(tmp_path):
    out = tmp_path / "profile.md"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_profile.py"),
            "--device",
            "cpu",
            "--quick",
            "--dtypes",
            "float64",
            "--ways",
            "stock",
            "fused",
            "--top",
            "40",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
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


def test_kernels_smoke_run_on_cpu_times_both_kernels_in_every_mode_and_names_what_is_missing():
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_kernels.py"), "--device", "cpu", "--quick"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
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
    if importlib.util.find_spec("cuequivariance_torch") is None:
        assert "cueq: not run: cuequivariance-torch not installed" in res.stdout


def test_kernels_time_each_layer_and_the_train_steps_chain():
    """``--layers 0 1``: each kernel in both layers (layer 0's conv TP takes scalars only, layer 1's
    product block gives scalars only), rows labelled by layer; ``train``: the conv TP's forces
    through
    the edge attributes and the weights, a chain of its own (other gradients than ``bwd2``'s)."""
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_kernels.py"),
            "--device",
            "cpu",
            "--quick",
            "--ways",
            "fused",
            "--layers",
            "0",
            "1",
            "--modes",
            "train",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
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


def test_kernels_record_a_row_that_runs_out_of_gpu_memory_and_go_on():
    """Stock's conv TP at 32000 nodes ran out of an H100's memory inside e3nn's scripted tensor
    product, which wraps the OOM in a plain RuntimeError; the row says OOM, other errors still
    raise."""
    import torch

    from benchmarks.gpu_mace import out_of_memory

    wrapped = RuntimeError(
        "The following operation failed in the TorchScript interpreter.\n"
        "RuntimeError: CUDA out of memory. Tried to allocate 8.33 GiB."
    )
    assert out_of_memory(wrapped) and out_of_memory(
        torch.cuda.OutOfMemoryError("CUDA out of memory.")
    )
    assert not out_of_memory(RuntimeError("shape mismatch"))


def test_kernels_tile_sweep_times_every_tile_config_of_each_triton_kernel_against_its_default():
    from cfm_plugins.ops.triton.configs import configs_for

    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_kernels.py"),
            "--device",
            "cpu",
            "--quick",
            "--ways",
            "fused",
            "--kernels",
            "tp",
            "--modes",
            "fwd",
            "--tiles",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
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
    # the fastest tiles, as a CFM_PLUGINS_TRITON_TILES value that the plugin reads back
    from cfm_plugins.ops.triton import configs

    pin = re.search(r"`CFM_PLUGINS_TRITON_TILES=(\S+)`", res.stdout).group(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CFM_PLUGINS_TRITON_TILES", pin)
        pinned = configs.pins()
    assert set(pinned) == {("tp_segment", "float64"), ("tp_edge", "float64")}
    assert all(cfg in configs_for(k, d) for (k, d), cfg in pinned.items())


def test_memory_peak_smoke_run_on_cpu_accounts_for_the_whole_peak_and_names_our_operators(tmp_path):
    out = tmp_path / "peak.md"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "memory_peak.py"),
            "--device",
            "cpu",
            "--quick",
            "--ways",
            "stock",
            "fused",
            "--top",
            "1000",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    sections = dict(part.split("\n", 1) for part in out.read_text().split("### ")[1:])
    assert [k.rsplit(": ", 1)[1] for k in sections] == ["stock", "fused"]
    for way, body in zip(("stock", "fused"), sections.values()):
        peak = float(re.search(r"peak ([\d.]+) MiB", body).group(1))
        rows = [line.split("|") for line in body.splitlines() if line.startswith("| `")]
        assert (
            peak > 1 and abs(sum(float(r[4]) for r in rows) - peak) < 0.05 * len(rows) + 0.1
        )  # all of it, by maker
        assert any("cfm::conv_tp" in r[1] for r in rows) == (way == "fused")


def test_the_sync_check_lists_every_synchronizing_call_with_its_stack(monkeypatch, capsys):
    """gpu_capture.sync_check on a GPU: torch warns at each synchronizing call ("warn" mode); the
    check counts them and prints each distinct call's stack, not torch's one-time notice that the
    mode is a prototype (an H100 run counted it as a sync). The GPU's warning is raised here by
    hand (torch.cuda's mode switch and synchronize are stood in for: no GPU here)."""
    import types
    import warnings

    import torch

    from benchmarks import gpu_capture

    modes = []

    def set_mode(mode):  # torch's first switch in a process warns once that the mode is a prototype
        if not modes:
            warnings.warn(
                "Synchronization debug mode is a prototype feature and does not yet detect all "
                "synchronizing operations",
                stacklevel=1,
            )
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cuda = types.SimpleNamespace(type="cuda")

    def waits_for_the_device():
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)

    def step():
        waits_for_the_device()
        waits_for_the_device()
        warnings.warn(
            "something else", stacklevel=1
        )  # not a sync: not counted, nor the prototype notice

    result = gpu_capture.sync_check(cuda, step)
    assert (
        result.startswith("FAIL: 2 synchronizing call(s), the first at")
        and "test_gpu_mace.py" in result
    )
    assert modes == ["warn", 0]
    out = capsys.readouterr().out
    assert (
        out.count("its stack:") == 2 and "waits_for_the_device" in out
    )  # two lines: two distinct stacks
    assert gpu_capture.sync_check(cuda, lambda: None) == "PASS" and modes[-2:] == ["warn", 0]


def test_md_ways_without_skin_convert_every_step_and_the_skin_rows_keep_the_list(tmp_path):
    """gpu_md's plain fused rows pass skin=None (on CUDA the default would keep the list), and each
    is followed by its ``skin S`` row with that skin."""
    import torch

    from benchmarks import gpu_md

    path = tmp_path / "m.model"
    torch.save(gpu_mace.build_model(torch.float64, "8x0e+8x1o").cpu(), path)
    ways = gpu_md.calculators(str(path), "float64", "cpu", ["stock", "fused[cuda]"], skin=0.5)
    assert [w for w, _ in ways] == ["stock", "fused[cuda]", "fused[cuda] skin 0.5"]
    plain, kept = ways[1][1](), ways[2][1]()
    assert plain.md_graphs is None and kept.md_graphs.neighbours.skin == 0.5
    only = gpu_md.calculators(
        str(path), "float64", "cpu", ["stock", "fused[cuda]"], skin=0.5, skin_only=True
    )
    assert [w for w, _ in only] == ["stock", "fused[cuda] skin 0.5"]


def test_epoch_timeouts_are_one_for_all_or_one_per_way_and_a_miscount_stops_before_any_run():
    import torch

    ways = ["stock", "cueq", "fused", "fused+capture"]
    commands = gpu_mace.epoch_commands(ways, ["triton", "cuda"], torch.device("cuda"), ["mpirun"])
    assert gpu_mace.epoch_timeouts(None, ways, commands) == dict.fromkeys(commands)
    assert gpu_mace.epoch_timeouts([50.0], ways, commands) == dict.fromkeys(commands, 50.0)
    per = gpu_mace.epoch_timeouts([10.0, 20.0, 30.0, 40.0], ways, commands)
    assert per == {
        "stock": 10.0,
        "cueq": 20.0,
        "fused+binpack[triton]": 30.0,
        "fused+binpack[cuda]": 30.0,
        "fused+binpack+static+capture[triton]": 40.0,
        "fused+binpack+static+capture[cuda]": 40.0,
    }
    with pytest.raises(SystemExit) as exc:
        gpu_mace.main(
            ["--device", "cpu", "--epoch-ways", "stock", "fused", "--epoch-timeout", "1", "2", "3"]
        )
    assert exc.value.code == 2


def test_the_epochs_data_set_is_made_once_per_size_and_found_again(tmp_path, capsys):
    """A later run into the same folder (another call on a warm GPU machine) finds the data set an
    earlier one made, and a different size makes a new one."""
    from ase.io import read

    from benchmarks.gpu_mace import epoch_data

    first = epoch_data(tmp_path / "data", 6)
    made = {k: p.stat().st_mtime_ns for k, p in first.items()}
    again = epoch_data(tmp_path / "data", 6)
    assert again == first and {k: p.stat().st_mtime_ns for k, p in again.items()} == made
    assert "made before, 6 structures" in capsys.readouterr().out
    bigger = epoch_data(tmp_path / "data", 8)
    assert bigger["train"].stat().st_mtime_ns != made["train"]
    assert "made before" not in capsys.readouterr().out
    frames = read(tmp_path / "data" / "train.xyz", ":")  # the isolated atoms, then the 8 structures
    assert (
        bigger["train"] == tmp_path / "data" / "train.xyz"
        and len(frames) - sum(len(a) == 1 for a in frames) == 8
    )


def test_epoch_ratios_are_to_stock_and_cueq_of_the_same_run_and_none_without_them():
    """An H200 run had stock cut by its limit and printed ours as "1.00x" stock (its own time as
    the base): a ratio now needs the way it is to."""
    rows = gpu_mace.epoch_rows({"stock": 8.0, "fused+binpack[triton]": 2.0, "cueq": 4.0})
    assert rows[2:] == [
        "| stock | 8.00 | 1.00x | 2.00x |",
        "| fused+binpack[triton] | 2.00 | 0.25x | 0.50x |",
        "| cueq | 4.00 | 0.50x | 1.00x |",
    ]
    cut = gpu_mace.epoch_rows(
        {"stock": "timed out after 40 s, see x", "fused+binpack[triton]": 2.81}
    )
    assert cut[2:] == [
        "| stock | timed out after 40 s, see x | - | - |",
        "| fused+binpack[triton] | 2.81 | - | - |",
    ]
