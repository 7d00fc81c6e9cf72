"""The captured static step on the GPU: exact against the uncaptured step, free of syncs, and timed.

    python -m tools.gpu_capture                                         # the full check (GPU)
    python -m tools.gpu_capture --backend cuda triton --atoms 500 4000  # both kernel backends
    python -m tools.gpu_capture --device cpu --mode default --quick     # a smoke run anywhere

The workload is ``benchmarks/gpu_mace.py``'s (its MACE-MP-medium-like model on a rattled CuNi cell
of each ``--atoms``), for each ``--dtypes`` and kernels ``stock`` and ``fused`` (on CUDA once per
``--backend``), set up as ``CFMCalculator(compile=...)`` sets it up (:func:`static_model`). Per
configuration (:func:`run_config`) the train and inference steps are checked (captured with
compile=``--mode`` against compile=off, padded against unpadded, no sync, no graph break or skipped
CUDA graph) and timed (eager unpadded, eager padded, captured); on CUDA also whether a pinned batch
moves without blocking. Each check prints a PASS/FAIL line (the exit status is 1 if any FAILs or
errors); the tables go to stdout and as markdown to ``--out`` (default out/tools/gpu_capture.md).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

from benchmarks.gpu_mace import build_model, cuni_atoms, cuni_cell, device_name
from cfm_plugins.static_shapes import COMPILE_BACKENDS

ROOT = Path(__file__).resolve().parents[1]

R_MAX = 6.0
#: the padded batch's budget: the structure's size + 5 % headroom
HEADROOM = 0.05
#: the largest relative error (max |a - b| / max |b|) a check passes with, per dtype
TOL = {"float64": 1e-10, "float32": 1e-4}
#: What torch warns at each synchronizing call under ``set_sync_debug_mode("warn")``. The first call
#: of ``set_sync_debug_mode`` in a process also warns, once, that the mode is a prototype that "does
#: not yet detect all synchronizing operations": no sync (an H100 run counted it as one).
SYNC_WARNING = "called a synchronizing CUDA operation"
FAILURES: list[str] = []


def say(*lines):
    print("\n".join(str(x) for x in lines), flush=True)


@contextlib.contextmanager
def section(name: str):
    """Run a section; an exception is printed with its traceback, counted as a failure, and
    skipped."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - report and go on with the next section
        FAILURES.append(f"{name}: {type(exc).__name__}: {exc}")
        say(f"ERROR in {name}: {type(exc).__name__}: {exc}", traceback.format_exc())
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- warnings and logs
class Captured(logging.Handler):
    """Every warning logged by torch (its loggers do not propagate to the root) or raised with
    ``warnings.warn`` (through ``logging.captureWarnings``), deduplicated."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        text = f"{record.name}: {record.getMessage()}".strip()
        if text not in self.messages:
            self.messages.append(text)

    def take(self) -> list[str]:
        out, self.messages = self.messages, []
        return out


def capture_warnings() -> Captured:
    import torch._inductor.compile_fx  # noqa: F401  (make the loggers that report cudagraph skips)
    import torch._inductor.cudagraph_trees  # noqa: F401
    import torch._inductor.cudagraph_utils  # noqa: F401
    import torch._inductor.output_code  # noqa: F401

    handler = Captured()
    for name in ["", *logging.root.manager.loggerDict]:
        logger = logging.getLogger(name)
        if name == "" or (name.startswith("torch") and not logger.propagate):
            logger.addHandler(handler)
    logging.captureWarnings(True)
    return handler


def cudagraph_skips() -> int:
    from torch._dynamo.utils import counters

    return int(counters["inductor"].get("cudagraph_skips", 0))


# ---------------------------------------------------------------------------- batches and models
class Workload:
    """One cell: the unpadded batch (a dict), the padded one (a PaddedBatch) and the EMT labels, on
    ``device``.

    The padded batch is one structure padded as the calculator pads it (``PaddingCollater``, a
    budget of the structure's size + :data:`HEADROOM`, pad edges 2 r_max long); ``tracker`` shares
    the budget of another cell of the same size, so both get the same padded shape."""

    def __init__(self, atoms, e, f, dtype, device, tracker=None):
        import torch
        from mace import data as mace_data
        from mace.tools import AtomicNumberTable, torch_geometric, torch_tools

        from cfm_plugins.static_shapes.budget import BudgetTracker, budget_for
        from cfm_plugins.static_shapes.mace import PaddingCollater, batch_sizes

        with torch_tools.default_dtype(dtype):  # as CFMCalculator builds its graphs
            graph = mace_data.AtomicData.from_config(
                mace_data.config_from_atoms(atoms),
                z_table=AtomicNumberTable(list(range(1, 90))),
                cutoff=R_MAX,
            )
        self.atoms, self.edges = len(atoms), int(graph["edge_index"].shape[1])
        self.plain = torch_geometric.Batch.from_data_list([graph]).to(device).to_dict()
        if tracker is None:
            tracker = BudgetTracker(
                budget_for(*batch_sizes([graph]), HEADROOM), HEADROOM, "gpu_capture"
            )
        self.tracker = tracker
        batch = PaddingCollater(torch_geometric.Batch.from_data_list, tracker, 2.0 * R_MAX)([graph])
        for key in batch.padded.keys:  # floats in the model's dtype, as CFMCalculator._padded
            value = batch.padded[key]
            if torch.is_tensor(value) and torch.is_floating_point(value):
                batch.padded[key] = value.to(dtype)
        self.padded_cpu = batch.remake_views()
        self.padded = self.padded_cpu.clone().to(device)
        self.padded_inputs = self.padded.to_dict()  # with REAL_SIZES
        self.sizes = self.padded.padded_sizes()  # (graphs, atoms, edges)
        self.e_ref = torch.tensor([e], dtype=dtype, device=device)
        self.f_ref = torch.as_tensor(f, dtype=dtype, device=device)


def check_cell(n_atoms: int):
    """The cell of the checks: another composition and rattle, its atoms shuffled (every edge index
    differs from the warm-up cell's), with its EMT labels."""
    import numpy as np
    from ase.calculators.emt import EMT

    atoms = cuni_atoms(n_atoms, seed=1)
    atoms = atoms[np.random.default_rng(1).permutation(len(atoms))]
    atoms.rattle(0.1, seed=2)
    atoms.calc = EMT()
    return atoms, float(atoms.get_potential_energy()), atoms.get_forces()


def fresh(inputs: dict) -> dict:
    """A new input dict of the same tensors, detached: every step gets leaf positions of its own,
    as a new batch would (no ``positions.grad`` accumulating over the steps, nothing left set by
    the last)."""
    import torch

    return {k: v.detach() if torch.is_tensor(v) else v for k, v in inputs.items()}


def base_model(dtype, hidden: str, device):
    """The stock model as the static seam builds it: e3nn code generation off, no TorchScript.

    The model is ``gpu_mace.build_model``'s MACE-MP-medium-like ScaleShiftMACE (hidden ``hidden``,
    l<=3, correlation 3, 89 elements, radial MLP [64,64,64], r_max 6 A, 2 layers)."""
    from cfm_plugins.static_shapes.mace import e3nn_codegen_off, without_torchscript

    with e3nn_codegen_off():
        model = build_model(dtype, hidden)
    return without_torchscript(model).to(device)


def static_model(
    stock, hidden: str, fused: bool, compile: str, kernels=None, backend: str = "inductor"
):
    """A copy of ``stock`` (same weights), patched when ``fused``, with the static forward
    installed.

    Set up as the ``static`` plugin's mace seam and ``CFMCalculator(compile=...)`` set it up: built
    with e3nn's code generation off, ``without_torchscript`` (:func:`base_model`), patched
    (``patch_model``, with ``kernels``), then ``cfm_plugins.static_shapes.forward.install(model,
    MACE_SPEC, compile=..., dynamic=False)`` (TracedSwaps around the compiled call,
    ``configure_dynamo``).

    Not ``copy.deepcopy``: e3nn scripts its fx modules when a module is copied or pickled, and a
    model holding TorchScript cannot be compiled. The copy is the same seeded build, without
    TorchScript from the start, checked equal to ``stock`` key by key."""
    import torch

    from cfm_plugins.ops.patching import patch_model
    from cfm_plugins.static_shapes.forward import install
    from cfm_plugins.static_shapes.mace import MACE_SPEC, holds_torchscript

    param = next(stock.parameters())
    model = base_model(param.dtype, hidden, param.device)
    ref, got = stock.state_dict(), model.state_dict()
    differ = [k for k in ref if k not in got or not torch.equal(ref[k], got[k])]
    if differ or ref.keys() != got.keys() or holds_torchscript(model):
        raise RuntimeError(
            f"the copy of the model differs from it ({differ[:3]}...) or holds TorchScript"
        )
    if fused:
        patch_model(model, kernels)
    install(model, MACE_SPEC, compile=compile, dynamic=False, backend=backend)
    return model


@contextlib.contextmanager
def frozen(model):
    """Parameters without gradients while evaluating (as mace's ``evaluate`` and the calculator)."""
    before = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(model.parameters(), before):
            p.requires_grad_(flag)


def train_step(model, inputs, e_ref, f_ref):
    """``model(batch, training=True, compute_force=True)``, a loss on energy and forces against the
    EMT labels (as ``gpu_mace.measure``), ``backward()``."""
    import torch

    # a new step: the last step's graph outputs may be reused
    torch.compiler.cudagraph_mark_step_begin()
    model.zero_grad(
        set_to_none=True
    )  # grads are outputs of the captured backward: never accumulate into them
    out = model(fresh(inputs), training=True, compute_force=True)
    loss = ((out["energy"] - e_ref) ** 2).mean() + ((out["forces"] - f_ref) ** 2).mean()
    loss.backward()
    return loss, out


def infer_step(model, inputs):
    """Energy + forces, parameters frozen (as mace's evaluation and the calculator)."""
    import torch

    torch.compiler.cudagraph_mark_step_begin()
    with frozen(model):
        return model(fresh(inputs), training=False, compute_force=True)


def snapshot_train(model, wl, inputs) -> dict:
    """Clones of what a train step gives (a replay may overwrite the graph's own outputs)."""
    loss, out = train_step(model, inputs, wl.e_ref, wl.f_ref)
    grads = {
        n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()
    }
    return {
        "loss": loss.detach().clone(),
        "grads": grads,
        "energy": out["energy"].detach().clone(),
        "forces": out["forces"].detach().clone(),
    }


def snapshot_infer(model, inputs) -> dict:
    out = infer_step(model, inputs)
    return {"energy": out["energy"].detach().clone(), "forces": out["forces"].detach().clone()}


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def compare(label: str, got: dict, ref: dict, tol: float) -> dict:
    """PASS/FAIL lines for every quantity of ``ref``; returns the max relative error of each."""
    errors = {}
    for key, value in ref.items():
        if key == "grads":
            worst, name = 0.0, "-"
            for n, g in value.items():
                h = got["grads"].get(n)
                if (g is None) != (h is None):
                    worst, name = float("inf"), f"{n} (gradient missing on one side)"
                    break
                if g is not None and g.shape != h.shape:
                    worst, name = float("inf"), f"{n} (shape {tuple(h.shape)} vs {tuple(g.shape)})"
                    break
                if g is not None and rel(h, g) >= worst:
                    worst, name = rel(h, g), n
            err, what = worst, f"grads ({len(value)} parameters, worst {name})"
        else:
            shape_ok = got[key].shape == value.shape
            err, what = (rel(got[key], value) if shape_ok else float("inf")), key
        ok = err < tol
        if not ok:
            FAILURES.append(f"{label} {what}: {err:.2e}")
        say(f"{'PASS' if ok else 'FAIL'} {label} {what}: max rel err {err:.2e} (tol {tol:g})")
        errors[key] = err
    return errors


def verdict(check: str) -> str:
    """PASS, or the first word of a check's failure (``FAIL: ...`` -> ``FAIL``)."""
    return check if check == "PASS" else check.split(":")[0].split()[0].upper()


def sync_check(device, step) -> str:
    """``step`` under ``set_sync_debug_mode("warn")``: PASS, or FAIL with the number of
    synchronizing calls and where the first was made. Every call's Python stack (its last frames)
    is printed: a failed check says at once what to fix, where the "error" mode showed only the
    message."""
    import torch

    if device.type != "cuda":
        return "skipped (CUDA only)"
    sites: list[str] = []

    def note(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):  # not torch's one-time notice that the mode is a prototype
            frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
            sites.append("".join(traceback.format_list(frames[-8:])))

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    if not sites:
        return "PASS"
    distinct = list(dict.fromkeys(sites))
    for i, site in enumerate(distinct):
        say(
            f"synchronizing call {i + 1} of {len(distinct)} distinct ({len(sites)} in all), its "
            f"stack:\n{site}"
        )
    last = sites[0].strip().splitlines()[-2].strip()
    return f"FAIL: {len(sites)} synchronizing call(s), the first at {last}"


def timed(fn, reps: int, warmup: int, device) -> tuple[float, float | None]:
    """Median wall time and median GPU time (CUDA events; ``None`` off CUDA) of ``fn``, in ms."""
    import torch

    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    wall, gpu = [], []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t = time.perf_counter()
        fn()
        if cuda:
            end.record()
        sync()
        wall.append(1e3 * (time.perf_counter() - t))
        if cuda:
            gpu.append(start.elapsed_time(end))
    return statistics.median(wall), (statistics.median(gpu) if gpu else None)


def pinned_check(wl, device) -> str:
    """Whether the pinned padded batch moves to ``device`` without blocking the host (CUDA only)."""
    import torch

    if device.type != "cuda":
        return "skipped (CUDA only)"
    out = []
    for pin in (False, True):
        b = wl.padded_cpu.clone()
        if pin:
            b.pin_memory()
        pinned = all(
            v.is_pinned() for _, v in b.padded("positions", "edge_index", "node_attrs", "shifts")
        )
        torch.cuda.synchronize()
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(
                50_000_000
            )  # keep the stream busy ~tens of ms: a blocking copy waits for it
        t = time.perf_counter()
        b.to(device)  # PaddedBatch.to: non_blocking when pinned
        t_to = 1e3 * (time.perf_counter() - t)
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        t_sync = 1e3 * (time.perf_counter() - t)
        views = (
            b.positions.data_ptr() == b.padded.positions.data_ptr()
            and b.positions.device.type == "cuda"
        )
        verdict = "non-blocking" if busy and t_to < 0.5 * t_sync else "blocking (or inconclusive)"
        out.append(
            f"{'pinned' if pin else 'pageable'} (is_pinned {pinned}): to() returned after "
            f"{t_to:.2f} ms, stream still busy {busy}, synchronized after {t_sync:.2f} ms, views "
            f"on device {views}: {verdict}"
        )
    return "; ".join(out)


# ---------------------------------------------------------------------------- one configuration
def run_config(args, device, dtype_name, stock, label, fused, wl0, wl1, capture, rows, checks):
    """Checks and times one (dtype, atoms, kernels) configuration; appends its table rows.

    Two copies of the model with the same weights (:func:`static_model`): compile=off (eager on the
    padded batch) and compile=``args.mode`` (``reduce-overhead``: inductor + CUDA graph trees). They
    warm up on ``wl0``; the checks run on ``wl1``, another cell of the same size and padded shape
    (:func:`check_cell`: other positions, species and edges), so the captured graphs are replayed
    on new inputs. Checks, each a PASS/FAIL line:

    - captured vs compile=off: the loss, every parameter gradient, energies and forces of both
      steps, max relative error below :data:`TOL`;
    - padded vs unpadded (eager): the same quantities, same tolerances (the padding is inert);
    - no sync: one captured train step and one inference step under :func:`sync_check`;
    - dynamo's compiled graphs and graph breaks (``compile_counts``), inductor's
      ``cudagraph_skips`` counter and every warning logged while compiling and running: under
      ``reduce-overhead`` a "skipping cudagraphs" line means the step is not captured and the check
      is not what it claims (a FAIL); and the seconds the compile and the warm-up steps take (the
      first steps compile: what a training run pays once per shape budget).

    Timing (:func:`timed`): ``args.reps`` steps after ``args.warmup`` of the eager step on the
    unpadded batch (the compile=off model, plain batch), the eager step on the padded batch and the
    captured step, train and inference.
    """
    import torch

    from cfm_plugins.static_shapes import forward

    tol = TOL[dtype_name]
    name = f"{dtype_name} {wl0.atoms} atoms {label}"
    say(
        "",
        f"### {name}: padded to {wl0.sizes[1]} atoms, {wl0.sizes[2]} edges, {wl0.sizes[0]} graphs "
        f"(real {wl0.atoms} atoms, {wl0.edges} edges; check cell {wl1.edges} edges, padded "
        + (
            "the same)"
            if wl1.sizes == wl0.sizes
            else f"to {wl1.sizes}: a second shape, compiled again)"
        ),
    )
    # this configuration's graphs only (also frees the last one's CUDA graph trees)
    torch._dynamo.reset()
    counts0, skips0 = forward.compile_counts(), cudagraph_skips()
    capture.take()
    off = static_model(stock, args.hidden, fused, "off", args.fused_kernels)
    cap = static_model(
        stock, args.hidden, fused, args.mode, args.fused_kernels, args.compile_backend
    )
    check = {"config": name, "sync_train": "-", "sync_infer": "-"}

    with section(f"{name}: compile and warm up"):
        t = time.perf_counter()
        for _ in range(
            max(3, args.warmup)
        ):  # CUDA graph trees: warm-up run, recording, then replays
            train_step(cap, wl0.padded_inputs, wl0.e_ref, wl0.f_ref)
            infer_step(cap, wl0.padded_inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        check["compile_s"] = f"{time.perf_counter() - t:.1f}"
        say(f"compiled and warmed up in {check['compile_s']} s")

    with section(f"{name}: check"):
        got_t, got_i = (
            snapshot_train(cap, wl1, wl1.padded_inputs),
            snapshot_infer(cap, wl1.padded_inputs),
        )
        ref_t, ref_i = (
            snapshot_train(off, wl1, wl1.padded_inputs),
            snapshot_infer(off, wl1.padded_inputs),
        )
        plain_t, plain_i = snapshot_train(off, wl1, wl1.plain), snapshot_infer(off, wl1.plain)
        e1 = compare(f"{name} captured vs off, train:", got_t, ref_t, tol)
        e2 = compare(f"{name} captured vs off, inference:", got_i, ref_i, tol)
        e3 = compare(f"{name} padded vs unpadded (eager), train:", ref_t, plain_t, tol)
        e4 = compare(f"{name} padded vs unpadded (eager), inference:", ref_i, plain_i, tol)
        check.update(
            loss=e1["loss"],
            grads=e1["grads"],
            e_train=e1["energy"],
            f_train=e1["forces"],
            e_infer=e2["energy"],
            f_infer=e2["forces"],
            padded=max(*e3.values(), *e4.values()),
        )

    with section(f"{name}: sync check"):
        for key, step in (
            # (F821: ruff reads the `del cap` at the end as if it came first)
            ("sync_train", lambda: train_step(cap, wl0.padded_inputs, wl0.e_ref, wl0.f_ref)),  # noqa: F821
            ("sync_infer", lambda: infer_step(cap, wl0.padded_inputs)),  # noqa: F821
        ):
            check[key] = sync_check(device, step)
            if check[key].startswith("FAIL"):
                FAILURES.append(f"{name} {key}: {check[key]}")
            step_name = "train" if key == "sync_train" else "inference"
            say(
                f"{verdict(check[key])} {name} no sync in the captured {step_name} "
                f"step{'' if check[key] == 'PASS' else ': ' + check[key]}"
            )

    with section(f"{name}: timing"):
        ways = {
            "eager": (off, wl0.plain),
            "eager padded": (off, wl0.padded_inputs),
            "captured": (cap, wl0.padded_inputs),
        }
        for step in ("train", "inference"):
            times = {}
            for way, (model, inputs) in ways.items():
                fn = (
                    (lambda m=model, i=inputs: train_step(m, i, wl0.e_ref, wl0.f_ref))
                    if step == "train"
                    else (lambda m=model, i=inputs: infer_step(m, i))
                )
                times[way] = timed(fn, args.reps, args.warmup, device)
            (w0, g0), (w1, g1), (w2, g2) = times.values()
            gpu = f"{g0:.2f} / {g1:.2f} / {g2:.2f}" if g0 is not None else "-"
            rows.append(
                f"| {dtype_name} | {wl0.atoms} | {wl0.edges} | {wl0.sizes[1]} / {wl0.sizes[2]} | "
                f"{label} | {step} | {w0:.2f} | {w1:.2f} | {w2:.2f} | {w1 / w0:.2f}x | "
                f"{w2 / w0:.2f}x | {gpu} |"
            )
            say(rows[-1])

    counts1 = forward.compile_counts()
    check["graphs"] = counts1["graphs"] - counts0["graphs"]
    breaks = {
        k: v - counts0["graph_breaks"].get(k, 0)
        for k, v in counts1["graph_breaks"].items()
        if v != counts0["graph_breaks"].get(k, 0)
    }
    check["breaks"] = sum(breaks.values())
    check["skips"] = cudagraph_skips() - skips0
    fwd = forward.installed(cap)
    # the compiled call always runs training=True (MACE_SPEC.compiled_kwargs): the inference step
    # may reuse the train step's graph (1, as on an H200) or get its own (2)
    say(
        f"dynamo: {check['graphs']} graph(s) compiled for the train and inference steps (1 or 2), "
        f"graph breaks {breaks or 'none'}, shapes {fwd.shapes if fwd else '-'}; inductor "
        f"cudagraph_skips: {check['skips']}"
    )
    logged = capture.take()
    skipped = [m for m in logged if "skipping cudagraph" in m.lower()]
    if args.mode == "reduce-overhead" and (skipped or check["skips"]):
        FAILURES.append(f"{name}: CUDA graphs skipped ({check['skips']}): {skipped}")
        say(f"FAIL {name}: CUDA graphs were skipped: the step is not captured")
    say(
        f"warnings logged ({len(logged)}):" if logged else "warnings logged: none",
        *[f"  {m}" for m in logged],
    )
    checks.append(check)
    del off, cap
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_table(checks) -> list[str]:
    def f(v):
        return f"{v:.1e}" if isinstance(v, float) else str(v)

    lines = [
        "| configuration | loss | grads | E train | F train | E inference | F inference | padded "
        "vs unpadded | no sync (train) | no sync (inference) | graphs | breaks | cudagraph skips "
        "| compile + warm-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        lines.append(
            "| "
            + " | ".join(
                f(c.get(k, "-"))
                for k in (
                    "config",
                    "loss",
                    "grads",
                    "e_train",
                    "f_train",
                    "e_infer",
                    "f_infer",
                    "padded",
                    "sync_train",
                    "sync_infer",
                    "graphs",
                    "breaks",
                    "skips",
                    "compile_s",
                )
            )
            + " |"
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--dtypes", nargs="+", default=["float64", "float32"], choices=["float32", "float64"]
    )
    p.add_argument("--atoms", type=int, nargs="+", default=[500])
    p.add_argument(
        "--mode",
        default="reduce-overhead",
        choices=["reduce-overhead", "default", "max-autotune"],
        help="compile mode of the captured model "
        "(reduce-overhead: CUDA graphs; default for a CPU run)",
    )
    p.add_argument(
        "--backend",
        dest="backends",
        nargs="+",
        default=["cuda"],
        choices=["cuda", "triton"],
        help="kernel backends of the fused kernels on CUDA; several give one row each",
    )
    p.add_argument(
        "--compile-backend",
        default="inductor",
        choices=COMPILE_BACKENDS,
        help="torch.compile backend of the captured model (aot_eager: dynamo's graphs run op by "
        "op, no code generation; checks the graphs quickly, times nothing worth reporting)",
    )
    p.add_argument("--hidden", default="128x0e+128x1o")
    p.add_argument(
        "--fused-kernels",
        nargs="+",
        default=None,
        metavar="KERNEL",
        help="the kernels the fused rows swap (default: auto, every kernel the model has; a named "
        "skip_tp also runs its GPU kernel)",
    )
    p.add_argument(
        "--no-stock", action="store_true", help="only the fused kernels (skip the stock e3nn rows)"
    )
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes for a smoke run (hidden 8x0e+8x1o, 32 atoms, 1 rep)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / "out" / "tools" / "gpu_capture.md",
        metavar="FILE",
        help="where the markdown goes (default out/tools/gpu_capture.md)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.atoms, args.hidden, args.reps, args.warmup = [32], "8x0e+8x1o", 1, 1

    import mace  # noqa: F401  (before e3nn)
    import torch

    from cfm_plugins.ops import _backend
    from cfm_plugins.static_shapes.forward import check_compile_mode

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda but torch sees no CUDA device: run this on a GPU machine or pass "
            "--device cpu --mode default"
        )
    try:
        check_compile_mode(args.mode, device, args.compile_backend)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    capture = capture_warnings()
    command = "python -m tools.gpu_capture " + " ".join(sys.argv[1:] if argv is None else argv)
    head = [
        "## The captured static step (tools/gpu_capture.py)",
        "",
        f"Command: `{command}`",
        "",
        f"Device: {device_name(device)}",
        "",
        f"Workload: ScaleShiftMACE {args.hidden}, l<=3, correlation 3, 89 elements, radial MLP "
        f"[64,64,64], r_max {R_MAX:g}, 2 layers; one rattled CuNi fcc cell padded to its size + "
        f"{HEADROOM:.0%}; captured = compile={args.mode} (backend {args.compile_backend}) of the "
        f"static forward; median of {args.reps} steps after {args.warmup} warm-ups.",
        "",
    ]
    say(*head)
    kernels = ([] if args.no_stock else [("stock", False, None)]) + (
        [(f"fused[{b}]", True, b) for b in args.backends]
        if device.type == "cuda"
        else [("fused", True, None)]
    )
    rows = [
        "| dtype | atoms | edges | padded atoms / edges | kernels | step | eager ms "
        "| eager padded ms | captured ms | padded vs eager | captured vs eager "
        "| GPU ms (eager / padded / captured) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    checks, pinned = [], []
    cells = {}
    for n in args.atoms:
        with section(f"cells of {n} atoms"):
            cells[n] = (cuni_cell(n, seed=0), check_cell(n))
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        stock = None
        with section(f"{dtype_name} model"):
            stock = base_model(dtype, args.hidden, device)
        if stock is None:
            continue
        for n, ((a0, e0, f0), (a1, e1, f1)) in cells.items():
            wl0 = wl1 = None
            with section(f"{dtype_name} {n} atoms: batches"):
                wl0 = Workload(a0, e0, f0, dtype, device)
                wl1 = Workload(a1, e1, f1, dtype, device, tracker=wl0.tracker)
            if wl1 is None:
                continue
            if dtype_name == args.dtypes[0]:
                with section(f"{n} atoms: pinned batch"):
                    pinned.append(f"- {wl0.atoms} atoms: {pinned_check(wl0, device)}")
                    say(pinned[-1])
            for label, fused, backend in kernels:
                with section(f"{dtype_name} {n} atoms {label}"):
                    if backend is not None:
                        _backend.set_gpu_backend(backend)
                    run_config(
                        args,
                        device,
                        dtype_name,
                        stock,
                        label,
                        fused,
                        wl0,
                        wl1,
                        capture,
                        rows,
                        checks,
                    )
            del wl0, wl1
        del stock
    verdict = (
        ["**All checks PASS.**"]
        if not FAILURES
        else [f"**{len(FAILURES)} FAIL/ERROR:**", ""] + [f"- {f}" for f in FAILURES]
    )
    lines = (
        head
        + [
            "Checks (max relative error of captured vs compile=off; padded vs unpadded: eager, "
            f"worst quantity; tolerance {TOL}):",
            "",
        ]
        + check_table(checks)
        + ["", "Timing (ms per step; ratios are time ratios, < 1 is faster):", ""]
        + rows
        + ["", "Pinned padded batch to the device:", ""]
        + (pinned or ["- skipped"])
        + ["", *verdict, ""]
    )
    text = "\n".join(lines)
    say("", text)
    with section("writing --out"):
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        say(f"written to {args.out}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
