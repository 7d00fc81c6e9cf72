"""Tile sizes of the Triton kernels: a default per (kernel, dtype), alternatives for autotuning.

:data:`DEFAULTS` holds, per kernel and dtype, the default config and then the alternatives.
Every default compiles without register spills for sm_80, sm_90, gfx90a and gfx942 at the
MACE-MP-medium sizes with the triton releases ``make triton-check`` covers (docs/benchmarks.md);
a launch whose compiled kernel spills on the user's GPU says so once (:func:`note_spills`). The
alternatives may spill: they are what autotuning may pick on the user's GPU.

:func:`pick` chooses the config of a launch: a test's :func:`override`, a tile pinned by
:func:`set_tiles` (option ``fused_tiles``), the interpreter's config, or the default (the fastest
of the default and its alternatives with :func:`set_autotune`, option ``fused_autotune``).
:func:`launch` launches a kernel with it (:func:`run_tile` passes the tile). The settings are set
once, before the kernels run (:func:`cfm_plugins.ops.configure`): no launch reads the environment.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass

log = logging.getLogger("cfm_plugins.ops.triton")

__all__ = [
    "TileConfig",
    "DEFAULTS",
    "INTERPRETER",
    "pick",
    "launch",
    "note_spills",
    "override",
    "autotuning",
    "configs_for",
    "dtype_name",
    "parse_label",
    "parse_tiles",
    "pins",
    "set_tiles",
    "tiles",
    "set_autotune",
    "run_tile",
    "TILES_SYNTAX",
]


@dataclass(frozen=True)
class TileConfig:
    """Tile of one program: ``block_rows`` nodes (contraction) or edges (conv TP) by
    ``block_c`` channels, with ``num_warps`` warps (wavefronts on AMD)."""

    block_rows: int
    block_c: int
    num_warps: int = 4
    num_stages: int = 1

    def label(self) -> str:
        return f"{self.block_rows}x{self.block_c}/w{self.num_warps}"


_F32, _F64 = "float32", "float64"

#: kernel -> dtype -> [default, alternatives...]. The defaults are chosen for registers (no
#: spills) and occupancy (enough programs for 132 SMs at 500 nodes). Kernels: ``sc_fwd``,
#: ``sc_bwd``, ``sc_bwd2`` (nodes x channels), ``tp_segment`` (edges of one node x channels),
#: ``tp_edge`` (edges x channels), ``sc_reduce`` (rows: unused, block_c: flat width of the
#: weight-gradient reduction), ``skip_apply`` (node components x channels), ``skip_wgrad`` (weight
#: rows x channels).
DEFAULTS: dict[str, dict[str, list[TileConfig]]] = {
    "sc_fwd": {
        _F32: [TileConfig(16, 32, 4), TileConfig(32, 32, 4), TileConfig(16, 64, 4)],
        _F64: [TileConfig(16, 32, 4), TileConfig(8, 32, 4)],
    },
    "sc_bwd": {
        _F32: [TileConfig(8, 32, 4), TileConfig(16, 32, 4), TileConfig(8, 64, 4)],
        _F64: [TileConfig(8, 32, 4), TileConfig(4, 32, 4)],
    },
    "sc_bwd2": {
        _F32: [TileConfig(8, 32, 4), TileConfig(4, 32, 4)],
        _F64: [TileConfig(4, 32, 4), TileConfig(8, 32, 8)],
    },
    # conv TP (ops/triton/conv_tp.py). tp_segment's tile also sets tp_segment_t's. The defaults
    # timed fastest in GPU tile sweeps, beside these alternatives; the w8 tiles hold about half
    # the registers per thread of w4.
    "tp_segment": {
        _F32: [TileConfig(8, 32, 4), TileConfig(8, 32, 8), TileConfig(16, 32, 8)],
        _F64: [TileConfig(4, 32, 4), TileConfig(8, 32, 8)],
    },
    "tp_edge": {
        _F32: [
            TileConfig(8, 32, 4),
            TileConfig(16, 32, 4),
            TileConfig(8, 32, 8),
            TileConfig(16, 32, 8),
        ],
        _F64: [TileConfig(8, 32, 4), TileConfig(4, 32, 4), TileConfig(8, 32, 8)],
    },
    # the radial conv TP (ops/triton/conv_tp_radial.py): tiles of at least 16 x 16 multiply with
    # tl.dot, smaller ones with rank-1 updates over K; tp_radial_wr's are at least 16 x 16.
    # tp_radial_segment's tile also sets tp_radial_segment_t's. Untimed on a GPU: chosen for
    # registers (no spills in the ahead-of-time check).
    "tp_radial_segment": {
        _F32: [TileConfig(8, 32, 4), TileConfig(16, 16, 8)],  # 16x16/w8 spills on AMD
        _F64: [TileConfig(4, 32, 4), TileConfig(8, 32, 8)],
    },
    "tp_radial_edge": {
        _F32: [TileConfig(8, 32, 4), TileConfig(16, 16, 8)],
        _F64: [TileConfig(8, 32, 4), TileConfig(4, 32, 4)],
    },
    "tp_radial_wr": {
        _F32: [TileConfig(16, 32, 4), TileConfig(32, 32, 4)],
        _F64: [TileConfig(16, 32, 8), TileConfig(16, 32, 4)],
    },
    "sc_reduce": {
        _F32: [TileConfig(1, 512, 4)],
        _F64: [TileConfig(1, 512, 8)],
    },  # f64 w4 spilled 24 B on sm_90
    # the skip connection (ops/triton/skip_tp.py): skip_apply, rows (node components) x
    # destination channels; skip_wgrad, weight rows (u) x channels (w). Untimed on a GPU: chosen
    # for registers (no spills in the ahead-of-time check) and programs enough for 132 SMs.
    "skip_apply": {
        _F32: [TileConfig(32, 32, 4), TileConfig(64, 64, 4), TileConfig(64, 32, 4)],
        _F64: [TileConfig(32, 32, 4), TileConfig(16, 32, 4), TileConfig(64, 32, 4)],
    },
    "skip_wgrad": {
        _F32: [TileConfig(32, 32, 4), TileConfig(64, 64, 4), TileConfig(32, 64, 4)],
        _F64: [TileConfig(32, 32, 4), TileConfig(16, 32, 4)],
    },
}

#: Under the interpreter: one program covers as much as possible (rows up to 128, all channels
#: up to 128).
INTERPRETER: dict[str, TileConfig] = {
    "sc_fwd": TileConfig(128, 128),
    "sc_bwd": TileConfig(128, 128),
    "sc_bwd2": TileConfig(128, 128),
    "tp_segment": TileConfig(64, 128),
    "tp_edge": TileConfig(256, 128),
    "tp_radial_segment": TileConfig(64, 128),
    "tp_radial_edge": TileConfig(256, 128),
    "tp_radial_wr": TileConfig(256, 128),
    "sc_reduce": TileConfig(1, 4096),
    "skip_apply": TileConfig(64, 128),
    "skip_wgrad": TileConfig(128, 128),
}

_OVERRIDE: dict[str, TileConfig] = {}
_TUNED: dict[tuple, TileConfig] = {}
_SPILLS_NOTED: set[tuple] = set()


def configs_for(kernel: str, dtype_name: str) -> list[TileConfig]:
    """The default config of ``kernel`` for ``dtype_name`` ("float32"/"float64"), then its
    alternatives."""
    return DEFAULTS[kernel][dtype_name]


_AUTOTUNE = [False]  # set_autotune


def autotuning() -> bool:
    """Whether a GPU launch times the alternatives (:func:`set_autotune`; default off)."""
    return _AUTOTUNE[0]


def set_autotune(on: bool) -> None:
    """Time the tile alternatives at the first launch of each kernel, dtype and size class on the
    GPU (the ``fused_autotune`` option), or not (the default tiles, or the pinned ones)."""
    _AUTOTUNE[0] = bool(on)


#: what :func:`parse_tiles` takes, for error messages and the option's help
TILES_SYNTAX = (
    "KERNEL[:DTYPE]=TILE entries, comma separated, e.g. "
    "tp_segment=8x32/w8,tp_edge:float64=4x32/w4 (DTYPE float32 or float64, both if left out; "
    "TILE ROWSxCHANNELS/wWARPS in powers of two)"
)
_LABEL = re.compile(r"(\d+)x(\d+)/w(\d+)((?:/[a-z]+)*)")
_PINS: tuple = ("", {})  # (set_tiles's text, what it parsed to)


def parse_label(label: str, kernel: str | None = None) -> TileConfig:
    """The tile of a label as :meth:`TileConfig.label` writes it (``8x32/w4``): sizes and warps
    powers of two (Triton's ``tl.arange`` needs them). ``kernel``, if given, names the kernel in a
    message."""
    m = _LABEL.fullmatch(label.strip())
    if not m:
        raise ValueError(f"tile {label!r}: expected ROWSxCHANNELS/wWARPS, e.g. 8x32/w4")
    if m.group(4):
        raise ValueError(
            f"tile {label!r}: {m.group(4)} is no tile variant (the conv TP's /defer and /presort "
            "variants are gone: tp_segment always sums once per program over its edges in CSR "
            f"order, tp_edge has one kernel); write {label.strip()[: m.start(4)]}"
            + (f" for {kernel}" if kernel else "")
        )
    rows, cols, warps = (int(v) for v in m.groups()[:3])
    for name, v in (("rows", rows), ("channels", cols), ("warps", warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"tile {label!r}: {name} must be a power of two, got {v}")
    return TileConfig(rows, cols, warps)


def parse_tiles(text: str) -> dict[tuple[str, str | None], TileConfig]:
    """The tiles of ``text``: ``KERNEL[:DTYPE]=TILE`` entries, comma separated
    (:data:`TILES_SYNTAX`), e.g. ``tp_segment=8x32/w8,tp_edge:float64=4x32/w4``.

    Args:
        text: the entries; empty entries are ignored, so ``""`` pins nothing.

    Returns:
        The pinned tile per (kernel, dtype or None for both dtypes).

    Raises:
        ValueError: an entry is malformed or names an unknown kernel, dtype or variant; the
            message names the entry.
    """
    parsed = {}
    for entry in (e.strip() for e in (text or "").split(",")):
        if not entry:
            continue
        key, sep, label = entry.partition("=")
        kernel, _, dtype = key.strip().partition(":")
        try:
            if not sep:
                raise ValueError("expected KERNEL[:DTYPE]=TILE")
            if kernel not in DEFAULTS:
                raise ValueError(f"unknown kernel {kernel!r}; known: {', '.join(sorted(DEFAULTS))}")
            if dtype and dtype not in (_F32, _F64):
                raise ValueError(f"dtype {dtype!r}: float32 or float64")
            parsed[kernel, dtype or None] = parse_label(label, kernel)
        except ValueError as exc:
            raise ValueError(f"entry {entry!r}: {exc}") from None
    return parsed


def set_tiles(text: str | None) -> None:
    """Pin the tiles of :func:`parse_tiles` (``None`` or ``""``: none, the defaults) for every
    later launch in this process; on a bad entry nothing changes (``ValueError``)."""
    global _PINS
    text = (text or "").strip()
    parsed = parse_tiles(text)
    _PINS = (text, parsed)
    if parsed:
        log.info(
            "Triton tiles pinned (fused_tiles): %s",
            ", ".join(f"{k}{':' + d if d else ''}={c.label()}" for (k, d), c in parsed.items()),
        )


def tiles() -> str:
    """The text of the tiles pinned now ("" for none)."""
    return _PINS[0]


def pins() -> dict[tuple[str, str | None], TileConfig]:
    """The tiles pinned now (:func:`set_tiles`): keys (kernel, dtype or None for both)."""
    return dict(_PINS[1])


@contextlib.contextmanager
def override(**configs: TileConfig):
    """Use the given configs (``sc_fwd=TileConfig(4, 8)``, ...) inside the block, also under the
    interpreter: tests make tiles smaller than the problem with it."""
    unknown = set(configs) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown Triton kernels {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    saved = dict(_OVERRIDE)
    _OVERRIDE.update(configs)
    try:
        yield
    finally:
        _OVERRIDE.clear()
        _OVERRIDE.update(saved)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def pick(
    kernel: str,
    dtype_name: str,
    rows: int,
    run=None,
    fit: tuple[int, int] | None = None,
) -> TileConfig:
    """The config of one launch. ``run(config)`` launches the kernel with a config; it is called
    only when autotuning, to time the candidates. ``fit`` (rows and channels of the problem)
    shrinks the interpreter's tile to the next powers of two. In order:

    - inside :func:`override` (tests: small tiles, so that sizes are not multiples of the tiles
      and several programs share one element) the given config;
    - the tile pinned by :func:`set_tiles` (the ``fused`` plugin's ``fused_tiles`` option, or
      :func:`cfm_plugins.ops.configure`): what a tile sweep or an autotuning log found fastest on
      your GPU, without autotuning again in every process;
    - under the Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) the interpreter config:
      few, large tiles, since the interpreter's cost is per program and per operation whatever
      the tile size;
    - otherwise the default, or with autotuning on (:func:`set_autotune`, the ``fused_autotune``
      option) the fastest of the default and its alternatives, timed once per kernel, dtype and
      size class (power-of-two bucket of the rows) in the process."""
    from cfm_plugins.ops.triton._codegen import interpreting

    if kernel in _OVERRIDE:
        return _OVERRIDE[kernel]
    pinned = _PINS[1]
    cfg = pinned.get((kernel, dtype_name)) or pinned.get((kernel, None))
    if cfg is not None:
        return cfg
    if interpreting():
        cap = INTERPRETER[kernel]
        if fit is None:
            return cap
        return TileConfig(
            min(cap.block_rows, _pow2(fit[0])), min(cap.block_c, _pow2(fit[1])), cap.num_warps
        )
    candidates = configs_for(kernel, dtype_name)
    if run is None or len(candidates) == 1 or not _AUTOTUNE[0]:
        return candidates[0]
    key = (kernel, dtype_name, max(1, rows - 1).bit_length())
    best = _TUNED.get(key)
    if best is None:
        from triton.testing import do_bench

        times = [
            (do_bench(lambda c=c: run(c), warmup=5, rep=20), i) for i, c in enumerate(candidates)
        ]
        best = _TUNED[key] = candidates[min(times)[1]]
        log.info(
            "autotuned %s (%s, rows <= %d): %s; picked %s",
            kernel,
            dtype_name,
            1 << key[2],
            ", ".join(f"{c.label()} {t:.3f} ms" for c, (t, _) in zip(candidates, times)),
            best.label(),
        )
    return best


def dtype_name(t) -> str:
    """``"float64"`` or ``"float32"``: the dtype of a launch's floating tensor ``t``, as
    :data:`DEFAULTS` keys it."""
    return "float64" if str(t.dtype) == "torch.float64" else "float32"


def launch(kernel: str, like, rows: int, run, fit: tuple[int, int] | None = None) -> TileConfig:
    """Launch ``run(config)`` with the config :func:`pick` chooses for the dtype of the tensor
    ``like`` (``rows``, ``fit``: as there) and check, at its first launch, that Triton's compiled
    kernel (what ``run`` returns) does not spill (:func:`note_spills`). The config."""
    name = dtype_name(like)
    cfg = pick(kernel, name, rows, run, fit)
    note_spills(kernel, name, cfg, run(cfg))
    return cfg


def run_tile(fn, grid, cfg: TileConfig, args, rows: str, cols: str = "BLOCK_C", **constexprs):
    """``fn[grid](*args)``: the jitted kernel ``fn`` with the tile ``cfg`` as its block-size
    constexprs ``rows`` and ``cols``, its warps and stages, and the further ``constexprs``; what
    every ``run(config)`` of :func:`launch` does. The compiled kernel."""
    blocks = {rows: cfg.block_rows, cols: cfg.block_c}
    return fn[grid](
        *args, **blocks, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.num_stages
    )


def note_spills(kernel: str, dtype_name: str, cfg: TileConfig, compiled) -> None:
    """Warn once per (kernel, dtype, config) in the process where the kernel Triton compiled for
    this GPU spills registers to local memory (``compiled.n_spills``, bytes per thread, set at its
    first launch on a GPU; absent under the interpreter, where nothing is said).

    The default tiles compile without spills with triton 3.6.0, 3.7.1 and 3.9.0 (``make
    triton-check``); with 3.8.0 ``sc_bwd2`` float32 8x32/w4 spills 16 B on sm_90
    (docs/benchmarks.md), and a user's triton may be any of them. On an H100, with triton 3.6.0, the
    same kernel spilled 2 B, where the check here (the same triton, sm_90) finds none. This only
    says so: which tile is faster is the GPU's call (``fused_autotune``)."""
    key = (kernel, dtype_name, cfg)
    if key in _SPILLS_NOTED:
        return
    _SPILLS_NOTED.add(key)
    spills = getattr(compiled, "n_spills", None)
    if not isinstance(spills, int) or spills <= 0:
        return
    import triton  # a compiled kernel came back: triton is imported

    log.warning(
        "Triton kernel %s (%s, tile %s) spills %d bytes per thread to local memory on this GPU "
        "with triton %s: the default tiles were checked for spills with triton 3.6.0, 3.7.1 and "
        "3.9.0. The option fused_autotune=true times its alternative tiles on this GPU, "
        "fused_tiles pins one (docs/gpu.md, 'Tuning').",
        kernel,
        dtype_name,
        cfg.label(),
        spills,
        triton.__version__,
    )
