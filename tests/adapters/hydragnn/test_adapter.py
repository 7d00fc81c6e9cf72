"""The hydragnn adapter inside real HydraGNN 3.0 training (examples/hydragnn/train.py) under real
mpirun."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import BIN, ROOT, run_mpi, synthetic_step_env
from tests.helpers.hydragnn_source import skip_if_source

skip_if_source()  # examples/hydragnn/train.py is written for 3.0's API
pytest.importorskip(
    "hydragnn", reason="HydraGNN is not installed here (`make venv` installs HydraGNN==3.0)"
)
pytest.importorskip(
    "torch_geometric", reason="torch_geometric is not installed (the [hydragnn] extra)"
)

import torch  # noqa: E402

from cfm_plugins.config import build_config, find_config_file  # noqa: E402
from cfm_plugins.steplog import load_imbalance, read_step_logs  # noqa: E402
from cfm_plugins_adapters.hydragnn import serves  # noqa: E402

CFM_RUN = str(BIN / "cfm-run")
EXAMPLE = ROOT / "examples" / "hydragnn"
EPOCHS = 2


def tagged_clusters(folder, n: int, seed: int):
    """``n`` graphs of 3..120 atoms, each tagged with its index (``idx``), as
    folder/dataset/clusters.pt."""
    from cfm_plugins.datasets.clusters import make_dataset

    graphs = make_dataset(n, seed=seed, max_atoms=120)
    for i, g in enumerate(graphs):
        g.idx = torch.tensor([i])
    (folder / "dataset").mkdir()
    torch.save(graphs, folder / "dataset" / "clusters.pt")
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A small size-diverse set (3..120 atoms, every graph tagged with its index) and a tiny
    EGNN."""
    folder = tagged_clusters(tmp_path_factory.mktemp("hydragnn"), 60, seed=1)
    config = json.loads((EXAMPLE / "config.json").read_text())
    arch = config["NeuralNetwork"]["Architecture"]
    arch.update(hidden_dim=8, num_conv_layers=2)
    arch["output_heads"]["graph"].update(dim_sharedlayers=8, dim_headlayers=[8, 8])
    config["NeuralNetwork"]["Training"].update(num_epoch=EPOCHS, batch_size=4)
    config["cfm_plugins"] = {
        "enable": ["hydragnn", "binpack"],
        "step_log": str(folder / "steps" / "binpack"),
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def train(work: Path, *cfm_args: str):
    return run_mpi(
        [CFM_RUN, *cfm_args, "--", "python", str(EXAMPLE / "train.py"), str(work / "config.json")],
        timeout=300,
        cwd=work,
    )


def train_losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"Epoch: \d+, Train Loss: ([0-9.eE+-]+)", log)]


def n_train(work: Path) -> int:
    import hydragnn

    graphs = torch.load(work / "dataset" / "clusters.pt", weights_only=False)
    return len(hydragnn.preprocess.split_dataset(graphs, 0.8, False)[0])


@pytest.fixture(scope="module")
def binpack_run(work):
    """Enabled by the JSON config's own "cfm_plugins" key (no --enable)."""
    out = train(work)
    assert out.returncode == 0, out.stdout[-5000:]
    return out


def test_hydragnn_uses_cfm_run_ranks_and_binpack_loaders(binpack_run):
    log = binpack_run.stdout
    assert "plugins enabled: hydragnn, binpack (from config-file)" in log
    # HydraGNN's setup_ddp took the process group cfm-run made, on both ranks
    assert (
        len(
            re.findall(
                r"HydraGNN setup_ddp: using cfm-run's process group \(gloo at [0-9.]+:\d+\)", log
            )
        )
        == 2
    )
    for role in ("train", "valid", "test"):
        assert len(re.findall(rf"binpack {role}: \d+ steps? on each of 2 ranks", log)) == 2, role
    losses = train_losses(log)
    assert len(losses) == EPOCHS and all(np.isfinite(losses)), losses


def test_every_graph_once_per_epoch_equal_steps_and_reshuffled(work, binpack_run):
    ranks = read_step_logs(str(work / "steps" / "binpack"))
    assert len(ranks) == 2
    assert len(ranks[0]) == len(ranks[1]) > 0  # equal steps on every rank
    steps = len(ranks[0]) // EPOCHS
    assert steps * EPOCHS == len(ranks[0])
    n = n_train(work)
    epochs = []
    for e in range(EPOCHS):
        ids = [i for r in ranks for rec in r[e * steps : (e + 1) * steps] for i in rec["ids"]]
        assert sorted(ids) == list(range(n)), f"epoch {e}: not every training graph exactly once"
        epochs.append([sorted(rec["ids"]) for rec in ranks[0][e * steps : (e + 1) * steps]])
    assert epochs[0] != epochs[1], "HydraGNN's set_epoch calls did not re-pack the batches"
    # the plan balances atoms: per-step atom imbalance close to 1
    atoms = np.array([[rec["atoms"] for rec in r] for r in ranks], dtype=float)
    assert atoms.max(axis=0).sum() / atoms.mean(axis=0).sum() < 1.1
    assert load_imbalance(ranks, "compute_cpu_s") >= 1.0  # the timings are there and well-formed


def test_reference_run_steps_match_and_fused_says_once_that_nothing_fits(work, binpack_run):
    """HydraGNN's own DistributedSampler batches (no binpack) with fused enabled: EGNN has no
    MACE-style module, so fused says so once per rank and the run trains as stock."""
    (work / "steps").mkdir(exist_ok=True)
    out = train(work, "--enable", "hydragnn,fused", "-o", f"step_log={work / 'steps' / 'stock'}")
    assert out.returncode == 0, out.stdout[-5000:]
    said = re.findall(
        r"fused: the model \(EGCLStack\) has no module that a fused kernel "
        r"\(symmetric_contraction, conv_tp, skip_tp\) replaces; nothing was swapped",
        out.stdout,
    )
    assert len(said) == 2, out.stdout[-3000:]
    assert (
        "plugins enabled: hydragnn, fused (from cli)" in out.stdout
    )  # --enable overrides the config key
    assert "binpack not enabled" in out.stdout
    stock = read_step_logs(str(work / "steps" / "stock"))
    ours = read_step_logs(str(work / "steps" / "binpack"))
    assert len(stock[0]) == len(stock[1])
    # the same optimizer steps per epoch at the same batch size (default capacity), within one
    assert abs(len(ours[0]) - len(stock[0])) <= EPOCHS, (len(ours[0]), len(stock[0]))
    # the mean batch is the configured batch size
    graphs = np.mean([rec["graphs"] for r in ours for rec in r])
    assert 3.0 <= graphs <= 5.0, graphs
    # first-epoch losses of the same model on the same data: same scale
    s, b = train_losses(out.stdout), train_losses(binpack_run.stdout)
    assert len(s) == len(b) == EPOCHS and 0.5 < b[0] / s[0] < 2.0, (s, b)


def test_serves_hydragnn_commands(work, tmp_path):
    cfg = str(work / "config.json")
    assert serves(["python", str(EXAMPLE / "train.py"), cfg])
    assert serves(["python", "other.py", cfg])  # the JSON has HydraGNN's NeuralNetwork section
    other = tmp_path / "other.json"
    other.write_text('{"model": "x"}')
    script = tmp_path / "plain.py"
    script.write_text("print('hello')\n")
    assert not serves(["python", str(script), str(other)])
    assert not serves(["mace_run_train", "--config", "x.yaml"])
    assert not serves([])


def test_json_config_key_enables_plugins_and_is_removed(work):
    argv = ["python", "train.py", str(work / "config.json")]
    assert find_config_file(argv) == (2, work / "config.json")
    config = build_config(None, (), trainer_argv=argv, environ={})
    assert config.enabled == ["hydragnn", "binpack"] and config.source == "config-file"
    assert config.get("step_log").endswith("binpack")
    copy = json.loads(Path(argv[2]).read_text())  # HydraGNN reads a copy without the key
    assert (
        argv[2] != str(work / "config.json")
        and "cfm_plugins" not in copy
        and "NeuralNetwork" in copy
    )


def test_json_config_copy_keeps_json_numbers(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(
        '{"NeuralNetwork": {"Training": {"Optimizer": {"learning_rate": 1e-3}}}, '
        '"cfm_plugins": ["hydragnn"]}'
    )
    argv = ["python", "train.py", str(cfg)]
    assert build_config(None, (), trainer_argv=argv, environ={}).enabled == ["hydragnn"]
    lr = json.loads(Path(argv[2]).read_text())["NeuralNetwork"]["Training"]["Optimizer"][
        "learning_rate"
    ]
    assert lr == 1e-3 and isinstance(lr, float)


def test_the_options_the_adapter_reads_are_declared_once_elsewhere():
    """step_log (every adapter's) is the core's, fused_kernels the fused feature's: the adapter
    declares none of its own, so no default lives twice."""
    import cfm_plugins_adapters.hydragnn as adapter
    from cfm_plugins.manager import catalog

    options = catalog().options()
    assert options["step_log"].plugin == "core" and options["fused_kernels"].plugin == "fused"
    assert not hasattr(adapter, "cfm_declare_options")


# ------------------------------------------------------------------------------------- cost=auto
def epoch_ids(ranks, epoch):
    """Per rank, the sorted graph ids of every step of ``epoch``."""
    return [[sorted(rec["ids"]) for rec in r if rec["epoch"] == epoch] for r in ranks]


@pytest.fixture(scope="module")
def auto_work(work, tmp_path_factory):
    """The EGNN of the example on a larger set (200 graphs: about 20 steps per rank and epoch,
    enough to fit)."""
    folder = tagged_clusters(tmp_path_factory.mktemp("hydragnn_auto"), 200, seed=2)
    config = json.loads((work / "config.json").read_text())
    config.pop("cfm_plugins")
    config["NeuralNetwork"]["Training"]["num_epoch"] = 3
    (folder / "auto.json").write_text(json.dumps(config))
    config["NeuralNetwork"]["Training"].update(num_epoch=2, **{"continue": 1, "startfrom": "auto"})
    (folder / "continued.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def auto_runs(auto_work):
    """cost=auto for 3 epochs (epoch 0 calibrates), then a run that continues from its model file
    (HydraGNN's Training.continue/startfrom) for 2 epochs; the ranks hand their samplers synthetic
    step times (:func:`~tests.helpers.synthetic_step_env`), so the fit does not depend on the
    machine's load."""
    runs = {}
    for name in ("auto", "continued"):
        out = run_mpi(
            [
                CFM_RUN,
                "--enable",
                "hydragnn,binpack",
                "-o",
                "cost=auto",
                "-o",
                f"step_log={auto_work / 'steps' / name}",
                "--",
                "python",
                str(EXAMPLE / "train.py"),
                str(auto_work / f"{name}.json"),
                "--log",
                name,
            ],
            timeout=300,
            cwd=auto_work,
            env=synthetic_step_env(),
        )
        assert out.returncode == 0, out.stdout[-5000:]
        runs[name] = out.stdout
    return runs


def test_cost_auto_calibrates_on_epoch_0_and_every_rank_plans_with_one_fit(auto_work, auto_runs):
    from cfm_plugins.steplog import read_step_events

    fits = re.findall(r"binpack cost=auto from epoch 1: step time = .*", auto_runs["auto"])
    assert len(fits) == 1, auto_runs["auto"][-4000:]  # one line, from rank 0
    assert (
        "thread CPU time of forward+backward" in fits[0]
        and "LIF measured in the calibration" in fits[0]
    )
    ranks = read_step_logs(str(auto_work / "steps" / "auto"))
    n = n_train(auto_work)
    for epoch, label in ((0, "initial"), (1, "auto-1"), (2, "auto-1")):
        recs = [[rec for rec in r if rec["epoch"] == epoch] for r in ranks]
        assert len(recs[0]) == len(recs[1]) > 0, epoch  # both ranks ran the same steps
        assert {rec["cost"] for r in recs for rec in r} == {label}
        assert sorted(i for r in recs for rec in r for i in rec["ids"]) == list(range(n)), epoch
    events = read_step_events(str(auto_work / "steps" / "auto"))
    assert (
        len(events[0]) == 1 and events[0] == events[1]
    )  # the same fit on both ranks, logged once each
    assert events[0][0]["from_epoch"] == 1 and events[0][0]["fit"]["ranks"] == 2
    saved = json.loads(
        (auto_work / "logs" / "auto" / "auto.cfm-binpack.json").read_text()
    )  # beside auto.pk
    assert saved["calibrations"][0]["fit"] == events[0][0]["fit"]


def test_cost_auto_continued_run_plans_with_the_saved_fit(auto_work, auto_runs):
    """A run continued from the model file (HydraGNN 3.0 counts epochs from 0 again) takes the saved
    fit from epoch 0 on: no calibration epoch, and its epoch 1 packs the batches the first run
    packed
    with that fit at epoch 1 (same costs, same seed + epoch)."""
    log = auto_runs["continued"]
    assert (
        "Load existing model" in log
        and "cost=auto: resuming with the saved fit from epoch 0" in log
    )
    assert "binpack cost=auto from epoch" not in log  # nothing calibrated again
    first = read_step_logs(str(auto_work / "steps" / "auto"))
    continued = read_step_logs(str(auto_work / "steps" / "continued"))
    assert {rec["cost"] for r in continued for rec in r} == {"auto-1"}
    assert epoch_ids(continued, 1) == epoch_ids(first, 1)


# ------------------------------------------------------------------- loaders iterated rank-locally
@pytest.mark.parametrize("cost", ["atoms", "edges", "auto"])
def test_the_example_trains_to_the_end_on_two_ranks_whatever_the_cost(tmp_path, cost):
    """Issue 83: HydraGNN's ``update_config`` (``check_if_graph_size_variable_dist``) iterates the
    train, val and test loaders until the first batch whose node count differs, so the ranks stop
    in different loaders. On these 40 graphs ``cost=atoms`` fills the training bins to the same
    node count, so one rank goes on into the validation loader alone: a collective inside a
    loader's iteration (the plan check of a first pass, a cost=auto gather) hung there. Every cost
    trains to the end."""
    import subprocess

    from cfm_plugins.datasets.clusters import make_dataset

    (tmp_path / "dataset").mkdir()
    torch.save(make_dataset(40, seed=0), tmp_path / "dataset" / "clusters.pt")  # as train.py does
    config = json.loads((EXAMPLE / "config.json").read_text())
    config["NeuralNetwork"]["Training"]["num_epoch"] = EPOCHS
    config["cfm_plugins"]["cost"] = cost
    (tmp_path / "config.json").write_text(json.dumps(config))
    try:
        out = train(tmp_path)  # 300 s: a hang fails here (a run takes about 30 s on 2 cores)
    except subprocess.TimeoutExpired as exc:
        log = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"cost={cost}: the 2-rank run did not end in {exc.timeout} s:\n{log[-3000:]}")
    assert out.returncode == 0, out.stdout[-5000:]
    for role in ("train", "valid", "test"):
        said = re.findall(rf"binpack {role}: \d+ steps? on each of 2 ranks", out.stdout)
        assert len(said) == 2, (role, out.stdout[-3000:])
    losses = train_losses(out.stdout)
    assert len(losses) == EPOCHS and all(np.isfinite(losses)), losses
