"""Eager fused MACE steps and the host: how often the fused modules copy device values to the host.

On a GPU each such copy (an ``.item()``, a ``.tolist()``, a ``unique`` or ``repeat_interleave``
sizing its output) waits for every queued kernel, so the host cannot run ahead. The fused modules
make two per batch: the range check of ``edge_index`` where its CSR is built (conv TP) and the node
grouping by element (symmetric contraction: the one-hot check and the counts in one copy), each
cached on its tensor and shared by the layers. Stock mace makes none. Here they are counted on CPU
(operators that size their output from values, and ``Tensor.tolist``/``item``); on a GPU
``torch.cuda.set_sync_debug_mode`` counts them (the CUDA test).
"""

from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cfm_plugins.ops import _backend
from cfm_plugins.ops.patching import patch_model
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction, node_groups
from tests.helpers.mace_models import mace_batch, mace_module, tiny_mace

needs_ext = pytest.mark.skipif(
    _backend.choose(torch.device("cpu")) != "cpu", reason="compiled CPU kernel not built"
)

#: operators whose output size (or result) is a device value: each is a wait on a GPU
SIZED_BY_VALUES = {
    "_local_scalar_dense",
    "nonzero",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "repeat_interleave",
    "masked_select",
    "bincount",
}


class CountHostCopies(TorchDispatchMode):
    """Counts the operators of SIZED_BY_VALUES (repeat_interleave only without output_size) and the
    calls of Tensor.tolist and Tensor.item (on CPU tensors these reach no operator)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.host_lists = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in SIZED_BY_VALUES and not (
            name == "repeat_interleave" and (kwargs or {}).get("output_size")
        ):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._saved = torch.Tensor.tolist, torch.Tensor.item
        counter = self

        def tolist(t, *a, **k):
            counter.host_lists += 1
            return counter._saved[0](t, *a, **k)

        def item(t, *a, **k):
            counter.host_lists += 1
            return counter._saved[1](t, *a, **k)

        torch.Tensor.tolist, torch.Tensor.item = tolist, item
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist, torch.Tensor.item = self._saved
        return super().__exit__(*exc)


def fresh(batch: dict) -> dict:
    """The batch as new tensors (a new batch of a loader: nothing cached on them)."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def train_step(model, batch):
    out = model(batch, training=True, compute_force=True)
    loss = out["energy"].pow(2).sum() + out["forces"].pow(2).sum()
    loss.backward()


@needs_ext
def test_an_eager_fused_mace_train_step_copies_to_the_host_twice_per_batch():
    stock = tiny_mace(
        "ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
    )
    fused = copy.deepcopy(stock)
    report = patch_model(fused)
    # two layers each; the skip connections check their one-hot once, in the warm-up step
    assert report.counts == {"symmetric_contraction": 2, "conv_tp": 2, "skip_tp": 2}
    batch = mace_batch()
    counts = {}
    for name, model in (("stock", stock), ("fused", fused)):
        train_step(model, fresh(batch))  # warm-up
        with CountHostCopies() as c:
            train_step(model, fresh(batch))
        counts[name] = (dict(c.ops), c.host_lists)
    assert counts["stock"] == ({}, 0)
    # one copy for the edge_index range, one for the node grouping; no operator sized by values
    assert counts["fused"] == ({}, 2), counts
    train_step(fused, batch)
    with (
        CountHostCopies() as c
    ):  # the same batch again (a second epoch's, a validation pass): both cached
        train_step(fused, batch)
    assert (dict(c.ops), c.host_lists) == ({}, 0)


@needs_ext
def test_a_traced_fused_mace_train_step_sizes_nothing_by_values():
    """The static forward as compiled (forces inside, the backward of the loss): no operator in the
    forward or backward graphs is sized by a value and no size is an unbacked symbol, so on a GPU
    the whole step is one CUDA graph and nothing waits for the device (an H200's sync check failed
    on the captured step while the symmetric contraction's chunking used bincount and
    repeat_interleave)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    from cfm_plugins.static_shapes import forward
    from cfm_plugins.static_shapes.mace import MACE_SPEC, e3nn_codegen_off

    with e3nn_codegen_off():
        model = tiny_mace(
            "ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
        )
    patch_model(model)
    graphs, sized = [], []

    def record(gm, example_inputs):
        graphs.append(gm)
        for node in gm.graph.nodes:
            name = getattr(node.target, "__name__", str(node.target)).split(".")[0]
            val = node.meta.get("val")
            if name in SIZED_BY_VALUES or (val is not None and free_unbacked_symbols(val)):
                sized.append((name, (node.meta.get("stack_trace") or "").strip().splitlines()[-2:]))
        return gm.forward

    forward.install(
        model,
        MACE_SPEC,
        compile="default",
        backend=aot_autograd(fw_compiler=record, bw_compiler=record),
    )
    train_step(model, fresh(mace_batch()))
    ops = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert len(graphs) == 2 and any("cfm.symmetric_contraction" in o for o in ops), (
        ops
    )  # forward and backward
    assert any("cfm.conv_tp" in o for o in ops), ops
    assert sized == [], sized


@pytest.mark.parametrize("chunk", [3, 128])
@pytest.mark.parametrize("form", ["one-hot", "indices"])
def test_node_groups_equal_unique_and_chunks(form, chunk):
    """The grouping on the host gives what torch's unique and the module's chunking give."""
    sc = mace_module("0e+1o", 4, 2, 7, False)
    fused = FusedSymmetricContraction.from_mace(sc)
    g = torch.Generator().manual_seed(3)
    idx = torch.tensor([5, 5, 1, 5, 1, 1, 1, 5, 5, 5, 3, 5, 5, 1, 5, 5])[
        torch.randperm(16, generator=g)
    ]
    y = torch.nn.functional.one_hot(idx, 7).double() if form == "one-hot" else idx.clone()
    present, inv, counts, order, chunk_ptr = node_groups(y, idx, 7, chunk)
    r_present, r_inv, r_counts = torch._unique2(
        idx, sorted=True, return_inverse=True, return_counts=True
    )
    fused._chunk = chunk
    r_order, r_chunk_ptr = fused._chunks(r_inv, r_counts, idx.shape[0])
    for a, b in zip(
        (present, inv, counts, order, chunk_ptr), (r_present, r_inv, r_counts, r_order, r_chunk_ptr)
    ):
        assert a.dtype == b.dtype and torch.equal(a, b), (a, b)
    if chunk == 3:
        assert chunk_ptr.tolist() == [0, 3, 5, 6, 9, 12, 15, 16]  # 1: 5 nodes, 3: 1, 5: 10
    assert node_groups(y, idx, 7, chunk) is node_groups(y, idx, 7, chunk)  # cached on y
    cached = node_groups(y, idx, 7, chunk)
    y.add_(0) if form == "one-hot" else y.mul_(1)  # an in-place change: recomputed
    assert node_groups(y, idx, 7, chunk) is not cached


def cuda_waits(model, batch) -> list[str]:
    """The synchronizing CUDA calls of one train step on a fresh copy of ``batch``, as warned."""
    train_step(model, fresh(batch))
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(model, fresh(batch))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # Only the syncs: the first set_sync_debug_mode of a process also warns, once, that the mode is
    # a prototype ("... does not yet detect all synchronizing operations").
    return [
        str(w.message) for w in caught if "called a synchronizing CUDA operation" in str(w.message)
    ]


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (counts the waits with set_sync_debug_mode)"
)
def test_cuda_eager_fused_mace_train_step_waits_for_the_device_at_most_twice_more_than_stock():
    stock = tiny_mace(
        "ScaleShiftMACE", "RealAgnosticResidualInteractionBlock", "RealAgnosticInteractionBlock"
    ).cuda()
    fused = copy.deepcopy(stock)
    patch_model(fused)
    batch = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in mace_batch().items()}
    stock_waits, fused_waits = cuda_waits(stock, batch), cuda_waits(fused, batch)
    print(f"waits per train step: stock {len(stock_waits)}, fused {len(fused_waits)}")
    assert len(fused_waits) <= len(stock_waits) + 2, fused_waits
