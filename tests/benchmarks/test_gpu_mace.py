"""benchmarks/gpu_mace.py: log parsing, the ratios of the step and epoch tables, and a tiny smoke
run on the CPU.

The GPU figures themselves come from running the benchmark on a GPU machine; here we check that
the script cannot rot: it builds the workload, runs every way it can, names the ways it cannot
run, reads mace's epoch times correctly and writes its record.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from benchmarks import gpu_mace
from tests.helpers import run_module
from tests.helpers.records import check_record, rows_of

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


def test_smoke_run_on_cpu_names_what_it_cannot_run_and_writes_the_step_record(tmp_path):
    res = run_module(
        "benchmarks.gpu_mace",
        *"--device cpu --quick --dtypes float64 --no-epoch".split(),
        *"--tiles-also tp_segment=8x32/w4 --zero-filled-also --out".split(),
        str(tmp_path),
        timeout=570,
    )
    assert res.returncode == 0, res.stdout[-3000:]
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
    # the record: the same rows, the device and versions named, no epoch record (--no-epoch)
    rec = check_record(tmp_path, "gpu_mace_step_quick", "benchmarks.gpu_mace")
    step = rows_of(rec, "step")
    assert {r[3] for r in step} == set(rows) and all(r[0] == "float64" for r in step)
    assert "mace-torch" in rec["versions"] and "--quick" in rec["command"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_mace_step_quick.json"]


def test_a_misspelt_tiles_value_stops_the_run_before_any_model_is_built(tmp_path):
    res = run_module(
        "benchmarks.gpu_mace",
        *"--device cpu --quick --no-epoch --tiles-also tp_segmnt=8x32/w4 --out".split(),
        str(tmp_path),
        timeout=570,
    )
    assert res.returncode != 0 and "--tiles-also 'tp_segmnt=8x32/w4'" in res.stdout
    assert "unknown kernel 'tp_segmnt'" in res.stdout and "| float64 |" not in res.stdout
    assert not any(tmp_path.iterdir())  # no record


def test_pinned_tiles_and_switches_hold_inside_the_block_only(monkeypatch):
    """A ``--tiles-also`` row runs with its tiles pinned and a ``--zero-filled-also`` row with the
    debug switch read again; the rows after them with what was in force before."""
    from cfm_plugins.ops import _debug, configure
    from cfm_plugins.ops.triton import configs

    previous = configure(tiles="tp_edge=8x32/w8")
    try:
        with gpu_mace.pinned_tiles("tp_segment=8x32/w4"):
            assert (
                configs.tiles() == "tp_segment=8x32/w4" and ("tp_edge", None) not in configs.pins()
            )
        assert configs.tiles() == "tp_edge=8x32/w8"
        with gpu_mace.pinned_tiles(None):
            assert configs.tiles() == "tp_edge=8x32/w8"
    finally:
        configure(**previous)
    monkeypatch.delenv(_debug.UNFILLED_ENV, raising=False)
    _debug.reread()
    assert _debug.unfilled()
    with gpu_mace.pinned_env({_debug.UNFILLED_ENV: "0"}):
        assert not _debug.unfilled()
    assert _debug.unfilled() and _debug.UNFILLED_ENV not in os.environ


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


def test_epoch_ways_name_a_compile_backend_only_on_the_compiled_ways():
    import torch

    ways = gpu_mace.epoch_commands(
        ["stock+binpack", "fused", "fused+static"],
        ["cuda"],
        torch.device("cpu"),
        ["mpirun"],
        compile_backend="aot_eager",
    )
    named = [label for label, cmd in ways.items() if "compile_backend=aot_eager" in cmd]
    assert named == ["fused+binpack+static+default"]
    static = ways["fused+binpack+static+default"]
    assert static[static.index("compile=default") + 1 :][:2] == ["-o", "compile_backend=aot_eager"]


def test_aot_eager_with_capture_on_cuda_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        gpu_mace.main(
            "--device cuda --epoch-ways fused+capture --compile-backend aot_eager".split()
        )
    assert "capture" in capsys.readouterr().err


def test_an_epoch_run_past_its_timeout_is_stopped_with_its_children_and_keeps_its_log():
    import os
    import time

    child = "import time; time.sleep(120)"
    script = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {child!r}]); "
        "print('child', p.pid, flush=True); time.sleep(120)"
    )
    # rc None: stopped at the time-out (the script would sleep 120 s and exit 0)
    text, rc = gpu_mace.run_logged([sys.executable, "-c", script], dict(os.environ), timeout=3)
    assert rc is None
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
    rows = gpu_mace.epoch_rows(
        {"stock": 8.0, "fused+binpack[triton]": 2.0, "cueq": 4.0, "cueq+binpack": 2.5}
    )
    assert rows[2:] == [
        "| stock | 8.00 | 1.00x | 2.00x | 3.20x |",
        "| fused+binpack[triton] | 2.00 | 0.25x | 0.50x | 0.80x |",
        "| cueq | 4.00 | 0.50x | 1.00x | 1.60x |",
        "| cueq+binpack | 2.50 | 0.31x | 0.62x | 1.00x |",
    ]
    assert gpu_mace.epoch_headline(rows) == {
        "epoch vs stock, fused+binpack[triton]": "0.25x",
        "epoch vs cueq, fused+binpack[triton]": "0.50x",
        "epoch vs cueq+binpack, fused+binpack[triton]": "0.80x",
    }
    cut = gpu_mace.epoch_rows(
        {"stock": "timed out after 40 s, see x", "fused+binpack[triton]": 2.81}
    )
    assert cut[2:] == [
        "| stock | timed out after 40 s, see x | - | - | - |",
        "| fused+binpack[triton] | 2.81 | - | - | - |",
    ]


def test_epoch_ways_of_the_fair_table_each_run_what_they_name():
    """stock and cuEquivariance with and without binpack's batches (kernels against kernels on the
    same batches), the fused kernels with and without binpack, and binpack + fused + static with
    compile=default (no capture); each label maps back to its way (for its time limit)."""
    import torch

    mpirun = ["mpirun", "-np", "1"]
    ways = gpu_mace.epoch_commands(
        list(gpu_mace.EPOCH_WAYS), ["triton"], torch.device("cuda"), mpirun
    )
    assert list(ways) == [
        "stock",
        "stock+binpack",
        "cueq",
        "cueq+binpack",
        "fused+binpack[triton]",
        "fused[triton]",
        "fused+binpack+static+default[triton]",
        "fused+binpack+static+capture[triton]",
    ]
    enabled = {
        label: cmd[cmd.index("--enable") + 1] for label, cmd in ways.items() if "--enable" in cmd
    }
    assert enabled == {
        "stock+binpack": "mace,binpack",
        "cueq+binpack": "mace,binpack",
        "fused+binpack[triton]": "mace,binpack,fused",
        "fused[triton]": "mace,fused",
        "fused+binpack+static+default[triton]": "mace,binpack,fused,static",
        "fused+binpack+static+capture[triton]": "mace,binpack,fused,static",
    }
    assert ways["stock"] == ["mace_run_train"] and "cfm-run" not in ways["cueq"]
    assert ways["cueq+binpack"][-2:] == ["mace_run_train", "--enable_cueq=True"]
    assert ways["stock+binpack"][:3] == mpirun and ways["stock+binpack"][-1] == "mace_run_train"
    assert "compile=default" in ways["fused+binpack+static+default[triton]"]
    assert "compile=reduce-overhead" in ways["fused+binpack+static+capture[triton]"]
    assert [gpu_mace.epoch_way(label) for label in ways] == list(gpu_mace.EPOCH_WAYS)


def test_compile_rows_say_after_how_many_epochs_the_compile_is_repaid():
    """first + (n - 1) later <= n uncompiled: (30 - 2) / (3 - 2) = 28 epochs; never where the
    compiled epochs are no faster; "-" without an uncompiled run of the same backend."""
    rows = gpu_mace.compile_rows(
        {
            "fused+binpack+static+default[triton]": [30.0, 2.0, 2.2, 1.8],
            "fused+binpack+static+default[cuda]": [30.0, 4.0, None],
            "fused+binpack+static+default": [30.0, 2.0],
        },
        {"fused+binpack[triton]": 3.0, "fused+binpack[cuda]": 3.0},
    )
    assert rows[2:] == [
        "| fused+binpack+static+default[triton] | 4 | 30.00 | 2.00 | 3.00 | 28 epochs |",
        "| fused+binpack+static+default[cuda] | 2 | 30.00 | 4.00 | 3.00 | never (no faster per "
        "epoch) |",
        "| fused+binpack+static+default | 2 | 30.00 | 2.00 | - | - |",
    ]


def test_static_epochs_below_two_stop_before_any_run():
    with pytest.raises(SystemExit) as exc:
        gpu_mace.main(["--device", "cpu", "--static-epochs", "1"])
    assert exc.value.code == 2


def test_fused_kernels_option_swaps_only_the_kernels_named():
    """``--fused-kernels conv_tp`` (the step without another kernel): prepare swaps the conv TPs
    and leaves the contractions stock; a misspelt name stops the run before any model."""
    import torch

    from cfm_plugins.ops.conv_tp import FusedConvTP
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
    from cfm_plugins.testing import mace_model

    stock = mace_model()
    cpu = torch.device("cpu")
    for kernels, contraction in ((["conv_tp"], False), (None, True)):
        model = gpu_mace.prepare("fused", stock, cpu, kernels)
        kinds = {type(m) for m in model.modules()}
        assert FusedConvTP in kinds and (FusedSymmetricContraction in kinds) == contraction
    assert not any(isinstance(m, FusedConvTP) for m in stock.modules())  # a copy was patched
    with pytest.raises(SystemExit, match="unknown fused kernel 'conv_tpp'"):
        gpu_mace.main(["--device", "cpu", "--quick", "--fused-kernels", "conv_tpp"])
