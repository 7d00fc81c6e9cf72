"""Kernel efficiency: every fused kernel's FLOPs and bytes per call against the machine's limits.

    python -m benchmarks.efficiency                   # CPU, 512 nodes, float32 and float64
    OMP_NUM_THREADS=2 python -m benchmarks.efficiency --rounds 3 --budget 4
    python -m benchmarks.efficiency --device cuda     # the same table on a GPU (4096 nodes)
    python -m benchmarks.efficiency --quick           # smoke run (32 nodes, float32)

Per kernel of :data:`SPECS` (the workloads of the CPU kernel benchmarks ``kernels_*.py``:
MACE-MP-medium-like) and direction (:data:`DIRECTIONS`): its FLOPs and bytes per call, counted
from its descriptor (:class:`Cost`), its achieved GFLOP/s and GB/s, and these as fractions of the
machine's limits measured in the same run with the kernels' thread count (:func:`flop_limit`,
:func:`byte_limit`; their sizes: :func:`settings`), each the best of ``--rounds`` rounds
(:func:`measure`). Prints the tables and writes the record ``kernel_efficiency`` (``_gpu`` on a
GPU, ``_quick`` with ``--quick``) to ``--out`` (default ``out/benchmarks/``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.record import add_out_argument, command_line, table, write_record

#: ``forward``; ``backward``, the gradients a force evaluation takes (conv TP: node features, edge
#: attributes, per-edge weights; the others: node features); ``double backward``, the backward of
#: that backward with a cotangent on each of its gradients, differentiated w.r.t. the output's
#: cotangent, the inputs and the weights (force training's ``loss.backward()``). Each direction is
#: timed alone through the fused module, its graph built once (:func:`_directions`).
DIRECTIONS = ("forward", "backward", "double backward")
#: the node counts of the workloads, and the repeats of the conv TP's 4-atom fcc cell giving them
SIZES = {32: (2, 2, 2), 512: (8, 4, 4), 4096: (16, 8, 8)}
INDEX_BYTES = 8  # index inputs (edge_index, element indices) are int64
#: below this fraction of both limits a kernel's row is named in the record's notes
LOW = 0.10


# ---------------------------------------------------------------------------------------------
# Counting, from the descriptors (pure: no torch needed for the conv TP and skip connection)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cost:
    """FLOPs and the least bytes moved by one call, as the ``*_costs`` functions count them from a
    kernel's descriptor: a multiply-add is 2 FLOPs; bytes are the least a call reads and writes
    (inputs, weights, outputs in the dtype, indices as int64)."""

    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else float("inf")


def conv_tp_costs(desc, nodes: int, edges: int, itemsize: int) -> dict[str, Cost]:
    """Per direction, the cost of the fused conv TP with its scatter
    (:class:`~cfm_plugins.ops.descriptors.conv_tp.ConvTPDescriptor`).

    Every pass over the edges (the forward, the node-feature gradient on the transposed tables,
    the edge-attribute gradient, the weight gradient) costs ``u = 2 NE + 3 S`` per edge: ``NE``
    coefficient multiply-adds (the pair scalars ``R[q]``, or the scatter of ``D[q]`` into the
    edge-attribute gradient) and ``S`` (channels summed over the pairs) channel products of three
    factors, a multiply and a multiply-add each. The backward is the transposed pass and the
    edge pass of both gradients (``3u``); the double backward is three forward passes (the
    output cotangent's three terms), two transposed passes and the edge gradients four times
    (``9u``). Bytes: node rows ``x`` (``dim_in``), output rows (``dim_out``), edge rows ``y``
    (``dim_edge``) and ``w`` (``weight_numel``), and the sender and receiver of every edge.
    """
    ne = int(desc.num_entries)
    channels = [int(desc.path_mul[p]) for p in range(desc.num_paths)]
    pairs = [
        int(desc.path_pair_start[p + 1]) - int(desc.path_pair_start[p])
        for p in range(desc.num_paths)
    ]
    s = sum(c * q for c, q in zip(channels, pairs))
    u = edges * (2 * ne + 3 * s)
    x, out = nodes * desc.dim_in, nodes * desc.dim_out
    y, w = edges * desc.dim_edge, edges * desc.weight_numel
    index = 2 * edges * INDEX_BYTES
    moved = {
        "forward": x + y + w + out,
        "backward": out + x + y + w + (x + y + w),  # g, x, y, w in; gx, gy, gw out
        "double backward": (out + x + y + w) + (x + y + w) + (out + x + y + w),
    }
    factor = {"forward": 1, "backward": 3, "double backward": 9}
    return {d: Cost(factor[d] * u, itemsize * moved[d] + index) for d in DIRECTIONS}


def conv_tp_radial_costs(desc, nodes: int, edges: int, hidden: int, itemsize: int) -> dict:
    """Per direction, the cost of the conv TP with the radial MLP's last layer inside
    (``cfm::conv_tp_radial_*``, ``hidden`` = K): the conv TP's passes (``u`` per pass, as in
    :func:`conv_tp_costs`) and ``G = 2 E K W`` per edge GEMM (the weights made again where a
    pass reads them; ``gh = gw wr^T``; ``gwr = h^T gw``). Forward ``u + G``; backward (node
    features, edge attributes, h) ``3u + 3G``; double backward (three radial forwards and the
    radial backward once per cotangent) ``10u + 12G``. Bytes as :func:`conv_tp_costs` with ``h``
    ([E, K]) and ``wr`` ([K, W]) in place of the per-edge weights, which are never stored."""
    base = conv_tp_costs(desc, nodes, edges, itemsize)
    ne = int(desc.num_entries)
    s = sum(
        int(desc.path_mul[p]) * (int(desc.path_pair_start[p + 1]) - int(desc.path_pair_start[p]))
        for p in range(desc.num_paths)
    )
    u = edges * (2 * ne + 3 * s)
    G = 2 * edges * hidden * int(desc.weight_numel)
    x, out = nodes * desc.dim_in, nodes * desc.dim_out
    y, h, wr = edges * desc.dim_edge, edges * hidden, hidden * int(desc.weight_numel)
    index = 2 * edges * INDEX_BYTES
    moved = {
        "forward": x + y + h + wr + out,
        "backward": out + x + y + h + wr + (x + y + h),
        "double backward": (out + x + y + h + wr) + (x + y + h) + (out + x + y + h + wr),
    }
    flops = {"forward": u + G, "backward": 3 * u + 3 * G, "double backward": 10 * u + 12 * G}
    assert set(base) == set(flops)
    return {d: Cost(flops[d], itemsize * moved[d] + index) for d in DIRECTIONS}


def symmetric_contraction_fold_flops(desc, elements: int) -> int:
    """FLOPs of folding the weights into per-element coefficients, ``coeff[e, row, c] = sum_k
    A[row, k] W[e, k, c]``: one multiply-add per (row, k) of every block, channel and element
    present."""
    return 2 * desc.channels * elements * sum(int(b.A.shape[0] * b.A.shape[1]) for b in desc.blocks)


def symmetric_contraction_costs(desc, nodes: int, elements: int, itemsize: int) -> dict[str, Cost]:
    """Per direction, the cost of the fused symmetric contraction
    (:class:`~cfm_plugins.ops.descriptors.symmetric_contraction.SCDescriptor`), ``elements`` the
    elements present among the nodes.

    Per node and channel, with ``J`` monomials (``J1`` of degree 1), ``T`` terms and ``Sp`` stored
    monomials of degree 2 or more: the forward forms each monomial of degree >= 2 (a multiply)
    and adds each term (a multiply-add): ``(J - J1) + 2 T``. The backward (node features) forms
    the stored monomials again (``Sp``), seeds each monomial from its terms (``2 T``) and walks
    the tree back (an add per degree-1 monomial, two multiply-adds per other one): ``Sp + 2 T +
    J1 + 4 (J - J1)``. The double backward (a tangent on the node features; gradients of the
    output cotangent, the node features and the coefficients) forms monomials and tangents
    (``4`` per monomial of degree >= 2), adds two products per term forward and one back
    (``6 T``) and walks the tree back with the tangent (``J1 + 10 (J - J1)``). The forward folds
    the weights (:func:`symmetric_contraction_fold_flops`), the double backward unfolds the
    coefficient gradient (as many FLOPs). Bytes: node features ``[nodes, channels, num_ell]``,
    output rows (``out_dim``), the present elements' weights, an element index per node.
    """
    J = len(desc.monomials)
    J1 = sum(1 for m in desc.monomials if len(m) == 1)
    T = int(desc.num_rows)
    Sp = sum(1 for j, m in enumerate(desc.monomials) if len(m) > 1 and desc.slot[j] >= 0)
    node = {
        "forward": (J - J1) + 2 * T,
        "backward": Sp + 2 * T + J1 + 4 * (J - J1),
        "double backward": 4 * (J - J1) + 6 * T + J1 + 10 * (J - J1),
    }
    fold = symmetric_contraction_fold_flops(desc, elements)
    folds = {"forward": fold, "backward": 0, "double backward": fold}
    x = nodes * desc.channels * desc.num_ell
    out = nodes * desc.out_dim
    weights = elements * desc.channels * sum(int(b.A.shape[1]) for b in desc.blocks)
    moved = {
        "forward": x + weights + out,
        "backward": out + x + weights + x,  # g, x, W in; gx out
        "double backward": (x + out + x + weights) + (out + x + weights),  # a, g, x, W; dg, dx, dW
    }
    return {
        d: Cost(
            nodes * desc.channels * node[d] + folds[d],
            itemsize * moved[d] + nodes * INDEX_BYTES,
        )
        for d in DIRECTIONS
    }


def skip_tp_costs(desc, nodes: int, elements: int, itemsize: int) -> dict[str, Cost]:
    """Per direction, the cost of the fused skip connection
    (:class:`~cfm_plugins.ops.descriptors.skip_tp.SkipTPDescriptor`), ``elements`` the elements
    present among the nodes.

    Per node and path ``(mul_in, mul_out, D)``: the forward's ``mul_in * mul_out * D``
    multiply-adds and one multiply-add per output element of the path (its coefficient); the
    backward (node features) is the same product transposed (a multiply-add per input element);
    the double backward is a forward (the output cotangent) and the weight gradient:
    ``nodes * D * mul_in * mul_out`` multiply-adds and a multiply per weight of a present element.
    Bytes: node rows in and out, the present elements' weights, an element index per node.
    """
    fwd = bwd = wgrad = 0
    per_element = 0
    for _, mul_in, _, mul_out, dim in desc.path_io:
        fwd += nodes * (2 * mul_in * mul_out * dim + 2 * mul_out * dim)
        bwd += nodes * (2 * mul_in * mul_out * dim + 2 * mul_in * dim)
        wgrad += 2 * nodes * dim * mul_in * mul_out + elements * mul_in * mul_out
        per_element += mul_in * mul_out
    x, out, weights = nodes * desc.dim_in, nodes * desc.dim_out, elements * per_element
    flops = {"forward": fwd, "backward": bwd, "double backward": fwd + wgrad}
    moved = {
        "forward": x + weights + out,
        "backward": out + weights + x,  # g, W in; gx out
        "double backward": (x + out + weights) + (out + weights),  # a, g, W in; dg, dW out
    }
    return {d: Cost(flops[d], itemsize * moved[d] + nodes * INDEX_BYTES) for d in DIRECTIONS}


# ---------------------------------------------------------------------------------------------
# The machine's limits, measured
# ---------------------------------------------------------------------------------------------
def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(
    fn: Callable[[], object], repeat: int, device=None, budget: float = 0.0, most: int = 1000
) -> float:
    """The least seconds of one call of ``fn`` (synchronised) after a warm-up call: of at least
    ``repeat`` calls, and of more while less than ``budget`` seconds have passed (at most
    ``most``). On a shared machine the best call is the one least disturbed."""
    fn()
    _sync(device)
    best, calls, start = float("inf"), 0, time.perf_counter()
    while calls < max(1, repeat) or (time.perf_counter() - start < budget and calls < most):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return best


def flop_limit(dtype, device, n: int, repeat: int, budget: float = 0.0) -> float:
    """FLOP/s of ``torch.mm`` of two ``n x n`` matrices (``2 n^3`` FLOPs) in ``dtype``."""
    import torch

    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    c = torch.empty(n, n, dtype=dtype, device=device)
    return 2.0 * n**3 / best_seconds(lambda: torch.mm(a, b, out=c), repeat, device, budget)


def byte_limit(dtype, device, nbytes: int, repeat: int, budget: float = 0.0) -> float:
    """Bytes/s of copying a tensor of ``nbytes`` into another (``2 nbytes`` moved: read and
    written)."""
    import torch

    n = nbytes // torch.empty(0, dtype=dtype).element_size()
    src = torch.randn(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    return (
        2.0
        * src.numel()
        * src.element_size()
        / best_seconds(lambda: dst.copy_(src), repeat, device, budget)
    )


# ---------------------------------------------------------------------------------------------
# The kernels: workload, counts and one callable per direction
# ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One kernel on its workload in one dtype: what it is, its counted costs and a callable per
    direction (one call, its graph built beforehand)."""

    workload: str
    costs: dict[str, Cost]
    calls: dict[str, Callable[[], object]]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Spec:
    """How the efficiency table measures a kernel of the kernel table: ``build(dtype, device,
    nodes) -> Case``, ``nodes`` one of :data:`SIZES`."""

    title: str
    build: Callable[..., Case]


def _directions(call, wrt: tuple, params: tuple) -> dict[str, Callable]:
    """The three directions of ``call(*wrt)``: the forward without a graph; the backward of the
    inputs ``wrt`` for one output cotangent; the double backward of those gradients with a
    cotangent on each, differentiated w.r.t. the output cotangent, ``wrt`` and ``params``."""
    import torch

    def forward():
        with torch.no_grad():
            return call(*wrt)

    out = call(*wrt)
    g = torch.randn_like(out)

    def backward():
        return torch.autograd.grad(out, wrt, g, retain_graph=True)

    g2 = g.clone().requires_grad_(True)
    first = torch.autograd.grad(call(*wrt), wrt, g2, create_graph=True)
    cot = tuple(torch.randn_like(t) for t in first)

    def double_backward():
        return torch.autograd.grad(
            first, (g2, *wrt, *params), cot, retain_graph=True, allow_unused=True
        )

    return {"forward": forward, "backward": backward, "double backward": double_backward}


def _with_default_dtype(dtype, make):
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return make()
    finally:
        torch.set_default_dtype(previous)


def _conv_tp_inputs(dtype, device, nodes: int):
    """(bench module, tp, fused conv TP, nodes, edges, edge_index, x, y) of the conv TP workload."""
    import mace  # noqa: F401  (before e3nn)
    import torch
    from e3nn import o3

    from benchmarks import kernels_conv_tp as bench
    from cfm_plugins.ops.conv_tp import FusedConvTP

    nodes, ei, vec = bench.make_graph(SIZES[nodes])
    tp = bench.build_tp(dtype).to(device)
    fused = FusedConvTP.from_e3nn(tp)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, tp.irreps_in1.dim, generator=gen, dtype=dtype).to(device)
    y = o3.spherical_harmonics(
        o3.Irreps.spherical_harmonics(bench.LMAX),
        torch.from_numpy(vec).to(dtype),
        True,
        normalization="component",
    ).to(device)
    return bench, tp, fused, nodes, ei.shape[1], torch.from_numpy(ei).to(device), x, y, gen


def build_conv_tp(dtype, device, nodes: int) -> Case:
    import torch

    bench, tp, fused, nodes, edges, edge_index, x, y, gen = _conv_tp_inputs(dtype, device, nodes)
    w = torch.randn(edges, tp.weight_numel, generator=gen, dtype=dtype).to(device)
    wrt = tuple(t.clone().requires_grad_(True) for t in (x, y, w))
    calls = _directions(lambda a, b, c: fused(a, b, c, edge_index), wrt, ())
    itemsize = x.element_size()
    return Case(
        f"{nodes} atoms, {edges} edges (CuNi fcc, r_max {bench.R_MAX} A); node features "
        f"{bench.CHANNELS}x({bench.HIDDEN}), spherical harmonics l<={bench.LMAX}",
        conv_tp_costs(fused.descriptor, nodes, edges, itemsize),
        calls,
    )


def build_conv_tp_radial(dtype, device, nodes: int) -> Case:
    """The conv TP of :func:`build_conv_tp` with its weights made inside from h [E, 64] and the
    radial MLP's last layer (``conv_tp_radial``)."""
    import torch
    from e3nn import nn

    hidden = 64
    _, tp, fused, nodes, edges, edge_index, x, y, gen = _conv_tp_inputs(dtype, device, nodes)
    torch.manual_seed(0)
    mlp = _with_default_dtype(
        dtype, lambda: nn.FullyConnectedNet([8, hidden, tp.weight_numel], torch.nn.functional.silu)
    ).to(device)
    last = mlp[len(mlp) - 1]
    fused.use_radial(last, gpu=True)
    h = torch.randn(edges, hidden, generator=gen, dtype=dtype).to(device)
    wrt = tuple(t.clone().requires_grad_(True) for t in (x, y, h))
    calls = _directions(lambda a, b, c: fused(a, b, c, edge_index), wrt, (last.weight,))
    return Case(
        f"the conv TP's workload with h [{edges}, {hidden}] and the radial MLP's last layer "
        f"[{hidden}, {tp.weight_numel}] in place of the per-edge weights",
        conv_tp_radial_costs(fused.descriptor, nodes, edges, hidden, x.element_size()),
        calls,
    )


def build_symmetric_contraction(dtype, device, nodes: int) -> Case:
    import mace  # noqa: F401  (before e3nn)
    import torch
    from e3nn import o3
    from mace.modules.symmetric_contraction import SymmetricContraction

    from benchmarks import kernels_symmetric_contraction as bench
    from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction

    irreps_in = o3.Irreps("+".join(f"{bench.MUL}x{ir}" for ir in ("0e", "1o", "2e", "3o")))
    torch.manual_seed(0)
    sc = _with_default_dtype(
        dtype,
        lambda: SymmetricContraction(
            irreps_in,
            o3.Irreps(bench.HIDDEN),
            bench.CORR,
            num_elements=bench.ELEMENTS,
            use_reduced_cg=False,
        ),
    ).to(device)
    fused = FusedSymmetricContraction.from_mace(sc)
    gen = torch.Generator().manual_seed(0)  # the same nodes in every dtype
    idx = torch.randint(0, bench.ELEMENTS, (nodes,), generator=gen)
    x = torch.randn(nodes, bench.MUL, 16, generator=gen, dtype=torch.float64)
    x = x.to(dtype).to(device)
    y = torch.nn.functional.one_hot(idx, bench.ELEMENTS).to(dtype).to(device)
    present = int(idx.unique().numel())
    xs = x.clone().requires_grad_(True)
    params = tuple(p for p in fused.parameters() if p.requires_grad)
    calls = _directions(lambda a: fused(a, y), (xs,), params)
    desc = fused.descriptor
    costs = symmetric_contraction_costs(desc, nodes, present, x.element_size())
    fold = symmetric_contraction_fold_flops(desc, present)
    return Case(
        f"{nodes} nodes, {present} of {bench.ELEMENTS} elements present; x [{nodes}, "
        f"{bench.MUL}, 16] (l<=3), hidden {bench.HIDDEN}, correlation {bench.CORR}",
        costs,
        calls,
        [
            f"symmetric contraction: folding the weights into per-element coefficients (a "
            f"batched GEMM in torch) is {100 * fold / costs['forward'].flops:.0f} % of the "
            f"forward's FLOPs at {nodes} nodes and {present} elements present."
        ],
    )


def build_skip_tp(dtype, device, nodes: int) -> Case:
    import torch

    from benchmarks import kernels_skip_tp as bench
    from cfm_plugins.ops.skip_tp import FusedSkipTP

    tp, _ = bench.build(dtype)
    tp = tp.to(device)
    fused = FusedSkipTP.from_e3nn(tp)
    if getattr(device, "type", str(device)) == "cuda":
        fused.enable_gpu_kernels()
    gen = torch.Generator().manual_seed(bench.ELEMENTS)
    idx = torch.randint(0, bench.ELEMENTS, (nodes,), generator=gen)
    y = torch.nn.functional.one_hot(idx, bench.ELEMENTS).to(dtype).to(device)
    x = torch.randn(nodes, tp.irreps_in1.dim, generator=gen, dtype=torch.float64)
    x = x.to(dtype).to(device)
    present = int(idx.unique().numel())
    xs = x.clone().requires_grad_(True)
    calls = _directions(lambda a: fused(a, y), (xs,), (tp.weight,))
    return Case(
        f"{nodes} nodes, {present} of {bench.ELEMENTS} elements present; {bench.IRREPS} x "
        f"{bench.ELEMENTS}x0e -> {bench.IRREPS}",
        skip_tp_costs(fused.descriptor, nodes, present, x.element_size()),
        calls,
    )


#: the efficiency entry of each kernel of the kernel table, by its name there. A kernel the table
#: holds without an entry here is named in the output and the record's notes (no row). An entry
#: under another name (a variant of a kernel) is measured after the table's kernels.
SPECS: dict[str, Spec] = {
    "symmetric_contraction": Spec("symmetric contraction", build_symmetric_contraction),
    "conv_tp": Spec("conv TP + scatter", build_conv_tp),
    "conv_tp_radial": Spec("conv TP + radial layer", build_conv_tp_radial),
    "skip_tp": Spec("skip connection", build_skip_tp),
}


def measured_kernels(table_names) -> tuple[list[str], list[str]]:
    """(what the table measures: the kernels of ``table_names`` with an entry in :data:`SPECS`,
    then the entries of no kernel there; the kernels of ``table_names`` without an entry)."""
    table_names = list(table_names)
    measured = [n for n in table_names if n in SPECS]
    measured += [n for n in SPECS if n not in table_names]
    return measured, [n for n in table_names if n not in SPECS]


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
COLUMNS = [
    "kernel",
    "direction",
    "dtype",
    "GFLOP per call",
    "MB per call",
    "FLOP/byte",
    "ms (best)",
    "GFLOP/s",
    "GB/s",
    "% of FLOP/s limit",
    "% of bytes/s limit",
]


def figure(value: float) -> str:
    """Four significant digits, no exponent (whole numbers from 1000 up)."""
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def row(
    kernel: str,
    direction: str,
    dtype: str,
    cost: Cost,
    seconds: float,
    peak_flops: float,
    peak_bytes: float,
) -> list:
    """One row of the table: counts, time, achieved rates and their fractions of the limits."""
    flops, moved = cost.flops / seconds, cost.bytes / seconds
    return [
        kernel,
        direction,
        dtype,
        figure(cost.flops / 1e9),
        figure(cost.bytes / 1e6),
        figure(cost.intensity),
        figure(seconds * 1e3),
        figure(flops / 1e9),
        figure(moved / 1e9),
        f"{100 * flops / peak_flops:.1f}",
        f"{100 * moved / peak_bytes:.1f}",
    ]


def low_rows(rows: list[list]) -> list[str]:
    """``kernel direction dtype`` of every row below :data:`LOW` of both limits."""
    f, b = COLUMNS.index("% of FLOP/s limit"), COLUMNS.index("% of bytes/s limit")
    return [
        f"{r[0]} {r[1]} ({r[2]})"
        for r in rows
        if float(r[f]) < 100 * LOW and float(r[b]) < 100 * LOW
    ]


def _markdown(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _backend_text(device) -> str:
    import torch

    try:
        from cfm_plugins.ops import _backend

        chosen = _backend.choose(torch.device(device))
    except (ImportError, AttributeError):
        return "unknown"
    return {"cpu": "C++ operators", "torch": "pure-torch fallback"}.get(chosen, chosen)


@dataclass
class Settings:
    """What one run measures: the device, dtypes, workload size, kernels and how long."""

    device: object
    dtypes: list[str]
    nodes: int
    names: list[str]
    repeat: int
    budget: float
    rounds: int
    mm_sizes: tuple[int, ...]
    copy_bytes: int


def settings(args, device) -> Settings:
    """The run's settings from the command line (``--quick``: tiny sizes, one call each). The
    limits: the fastest ``torch.mm`` of two square matrices in the kernel's dtype (n = 512, 1024,
    2048 on a CPU; 4096, 8192 on a GPU) for FLOP/s, a copy of a large tensor (256 MiB; 2 GiB on a
    GPU) for bytes/s."""
    from cfm_plugins.ops.kernel_table import kernel_names

    cuda, quick = device.type == "cuda", args.quick
    if cuda:
        mm_sizes, copy_bytes = ((1024,), 64 << 20) if quick else ((4096, 8192), 2 << 30)
    else:
        mm_sizes, copy_bytes = ((256,), 16 << 20) if quick else ((512, 1024, 2048), 256 << 20)
    names, _ = measured_kernels(kernel_names())
    if args.kernels:
        chosen = args.kernels.split(",")
        unknown = [n for n in chosen if n not in SPECS]
        if unknown:
            raise SystemExit(f"--kernels: no efficiency entry for {unknown}; known: {list(SPECS)}")
        names = [n for n in names if n in chosen]
    return Settings(
        device=device,
        dtypes=["float32"] if quick else args.dtypes.split(","),
        nodes=32 if quick else args.nodes or (4096 if cuda else 512),
        names=names,
        repeat=1 if quick else args.repeat,
        budget=0.0 if quick else args.budget,
        rounds=1 if quick else args.rounds,
        mm_sizes=mm_sizes,
        copy_bytes=copy_bytes,
    )


@dataclass
class Measured:
    """The best figures of every round: limits per dtype (FLOP/s, the mm size that gave it,
    bytes/s), seconds per (kernel, direction, dtype), and the counts, workloads and notes."""

    limits: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    workloads: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def limit(self, dtype: str, flops: float, n: int, moved: float) -> None:
        old = self.limits.get(dtype, (0.0, 0, 0.0))
        best = (flops, n) if flops > old[0] else old[:2]
        self.limits[dtype] = (*best, max(moved, old[2]))

    def time(self, key: tuple, seconds: float) -> None:
        self.seconds[key] = min(seconds, self.seconds.get(key, float("inf")))


def measure(run: Settings) -> Measured:
    """Every round: per dtype the limits, each kernel's directions, the limits again; the best
    figure of all rounds is kept (on a shared machine, the least disturbed one). Within a round a
    figure is the best call of at least ``--repeat`` calls and of as many as fit in ``--budget``
    seconds (:func:`best_seconds`)."""
    import torch

    m = Measured()
    per_size = run.budget / len(run.mm_sizes)

    def limits(dtype_name: str) -> None:
        dtype = getattr(torch, dtype_name)
        moved = byte_limit(dtype, run.device, run.copy_bytes, 3, run.budget)
        for n in run.mm_sizes:
            m.limit(dtype_name, flop_limit(dtype, run.device, n, 3, per_size), n, moved)
        flops, n, moved = m.limits[dtype_name]
        print(
            f"{dtype_name} limits so far: torch.mm {flops / 1e9:.1f} GFLOP/s (n={n}), copy "
            f"{moved / 1e9:.2f} GB/s",
            flush=True,
        )

    for r in range(run.rounds):
        print(f"round {r + 1} of {run.rounds}", flush=True)
        for dtype_name in run.dtypes:
            limits(dtype_name)
            for name in run.names:
                spec = SPECS[name]
                case = spec.build(getattr(torch, dtype_name), run.device, run.nodes)
                m.workloads[spec.title] = case.workload
                m.notes += [note for note in case.notes if note not in m.notes]
                for direction in DIRECTIONS:
                    key = (spec.title, direction, dtype_name)
                    m.costs[key] = case.costs[direction]
                    seconds = best_seconds(
                        case.calls[direction], run.repeat, run.device, run.budget
                    )
                    m.time(key, seconds)
                    print(f"  {dtype_name} {spec.title} {direction}: {seconds * 1e3:.2f} ms")
                del case
            limits(dtype_name)
    return m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny workloads, float32")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument(
        "--nodes",
        type=int,
        choices=sorted(SIZES),
        default=None,
        help="nodes (atoms) of every workload (default 512 on a CPU, 4096 on a GPU)",
    )
    ap.add_argument("--repeat", type=int, default=5, help="least calls per figure and round")
    ap.add_argument(
        "--budget",
        type=float,
        default=3.0,
        help="seconds per figure and round: more calls while they last (the best call counts)",
    )
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every figure (the best)")
    ap.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default torch.get_num_threads())"
    )
    ap.add_argument("--kernels", default=None, help="comma-separated (default: every kernel)")
    add_out_argument(ap)
    args = ap.parse_args(argv)

    import torch

    from cfm_plugins.ops.kernel_table import kernel_names

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    cuda = device.type == "cuda"
    run = settings(args, device)
    _, missing = measured_kernels(kernel_names())
    command = command_line(argv)
    where = f"{torch.cuda.get_device_name(device)}" if cuda else f"CPU, {threads} threads"
    print(f"command: {command}\ndevice: {where}; kernels: {_backend_text(device)}", flush=True)
    m = measure(run)

    limits, rows = [], []
    for dtype_name in run.dtypes:
        flops, n, moved = m.limits[dtype_name]
        limits.append(
            [dtype_name, figure(flops / 1e9), n, figure(moved / 1e9), "-" if cuda else threads]
        )
        rows += [
            row(kernel, direction, dtype, m.costs[kernel, direction, dtype], seconds, flops, moved)
            for (kernel, direction, dtype), seconds in m.seconds.items()
            if dtype == dtype_name
        ]
    limit_columns = [
        "dtype",
        "FLOP/s limit (GFLOP/s)",
        "from torch.mm n",
        "bytes/s limit (GB/s)",
        "threads",
    ]
    print("\n" + _markdown(limit_columns, limits) + "\n\n" + _markdown(COLUMNS, rows))
    notes = list(m.notes)
    low = low_rows(rows)
    if low:
        notes.append("Below 10 % of both limits: " + "; ".join(low) + ".")
    if missing:
        notes.append(
            "In the kernel table without an efficiency entry (benchmarks/efficiency.py, SPECS): "
            + ", ".join(missing)
            + "."
        )
    notes.append(
        "Timed through the fused modules: the conv TP's figures include its reorder of the node "
        "rows to channel-last and back, the symmetric contraction's forward its weight fold."
    )
    for note in notes:
        print(note)
    sizes = ", ".join(str(n) for n in run.mm_sizes)
    write_record(
        "kernel_efficiency" + ("_gpu" if cuda else "") + ("_quick" if args.quick else ""),
        "Fused kernels against the machine's measured limits",
        [
            table(
                "limits",
                limit_columns,
                limits,
                f"the machine's limits measured in this run: the fastest torch.mm of two n x n "
                f"matrices, n in {sizes} (FLOP/s), and a copy of {run.copy_bytes >> 20} MiB "
                "(bytes/s, read and written); the best call of every round",
            ),
            table(
                "kernels",
                COLUMNS,
                rows,
                "per kernel and direction: FLOPs and least bytes per call counted from the "
                "descriptor, the best time of the calls, the rates achieved and their fractions "
                "of the limits above",
            ),
        ],
        description=(
            "Workloads of the kernel benchmarks (MACE-MP-medium-like): "
            + "; ".join(f"{k}: {v}" for k, v in m.workloads.items())
            + f". {where}; per figure the best call of {run.rounds} rounds, each of at least "
            f"{run.repeat} calls and as many as fit in {run.budget:g} s, after a warm-up. "
            "Directions: forward; backward = the gradients a force evaluation takes (conv TP: "
            "node features, edge attributes, per-edge weights; the others: node features); "
            "double backward = the backward of that backward with a cotangent on each gradient, "
            "differentiated w.r.t. the output cotangent, the inputs and the weights. FLOPs: "
            "multiply-adds 2, multiplies and adds 1, as the descriptor's paths prescribe; bytes: "
            "the inputs, weights and outputs of the call in the dtype (indices as int64), read "
            "or written once"
        ),
        notes=notes,
        out=args.out,
        device=device,
        command=command,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
