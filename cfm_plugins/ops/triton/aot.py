"""Ahead-of-time compilation of the generated Triton kernels for GPUs this machine does not have.

:func:`compile_kernel` runs Triton's whole pipeline (``triton.compile(ASTSource(...),
target=GPUTarget(...))``: TTIR, TTGIR, LLVM, PTX and ``ptxas`` to a cubin for NVIDIA; AMDGCN and
an hsaco for AMD) without a driver, for a target of :data:`TARGETS`. What it catches that the
interpreter cannot: compile errors of the real code generator, and the register budget
(registers and spill bytes per kernel, in a :class:`CompileReport`). A kernel is compiled as a
launch would specialise it, with the argument values of a *specimen*
(:func:`cfm_plugins.ops.triton.symmetric_contraction.specimen`,
:func:`cfm_plugins.ops.triton.conv_tp.specimen`: the sizes and strides of a typical launch).

Used by ``make triton-check`` (``python -m tools.triton_check``, the MACE-MP-medium layer)
and by a test (one small kernel). Nothing here imports a trainer.
"""

from __future__ import annotations

import contextlib
import io
import re
import time
from dataclasses import dataclass

__all__ = ["TARGETS", "CompileReport", "compile_kernel", "jit_function"]

#: name -> (backend, arch, warp size), the GPUs the check compiles for
TARGETS = {
    "sm_80": ("cuda", 80, 32),  # A100
    "sm_90": ("cuda", 90, 32),  # H100, H200
    "gfx90a": ("hip", "gfx90a", 64),  # MI250X (Frontier)
    "gfx942": ("hip", "gfx942", 64),  # MI300
}


@dataclass
class CompileReport:
    """One compiled variant: registers per thread (VGPRs on AMD), spill bytes to memory (stores +
    loads on NVIDIA, spilled VGPRs x 4 bytes on AMD), scratch bytes, SGPRs spilled into VGPR lanes
    (AMD), compile seconds, or the error."""

    kernel: str
    target: str
    config: str
    dtype: str
    registers: int | None = None
    spill_bytes: int | None = None
    scratch_bytes: int | None = None
    sgpr_spills: int = 0
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def jit_function(fn):
    """A compiled-mode ``JITFunction`` of ``fn`` (a plain function, or the ``.fn`` of a jitted one),
    whatever ``TRITON_INTERPRET`` says: ahead-of-time compilation needs the real front end."""
    from triton.runtime.jit import JITFunction

    unspecialised = [
        p.num for p in getattr(fn, "params", ()) if getattr(p, "do_not_specialize", False)
    ]
    fn = getattr(fn, "fn", fn)
    return JITFunction(fn, do_not_specialize=unspecialised)


def _specialise(fn, specimen: dict, blocks: dict):
    """(signature, constexprs, attrs) of a launch with these argument values: integer arguments
    equal to 1 (unit strides of contiguous tensors) become constants, pointers and integers
    divisible by 16 carry Triton's divisibility hint, except the integers the kernel marks
    ``do_not_specialize`` (the edge count)."""
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in blocks:
            signature[name] = "constexpr"
            constexprs[name] = blocks[name]
            continue
        if name not in specimen:
            raise KeyError(f"{fn.__name__}: no specimen value for argument {name!r}")
        value = specimen[name]
        if isinstance(value, str):  # a pointer type such as "*fp32"
            signature[name] = value
            attrs[(i,)] = [["tt.divisibility", 16]]
            continue
        specialised = not fn.params[i].do_not_specialize  # not: a launch passes the type only
        if specialised and value == 1:
            signature[name] = "constexpr"
            constexprs[name] = 1
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if specialised and value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _nvidia_usage(log: str) -> tuple[int, int]:
    """(registers, spill bytes stored plus loaded) from ``ptxas -v`` (bundled with triton)."""
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if not regs:
        raise RuntimeError(f"no register count in the ptxas log:\n{log}")
    return int(regs[-1]), sum(int(a) + int(b) for a, b in spills[-1:])


def _amd_usage(asm: str) -> tuple[int, int, int, int]:
    """(VGPRs, VGPR spill bytes, scratch bytes, SGPRs spilled into VGPR lanes) of an AMDGCN
    listing (its metadata ``.vgpr_count``, ``.vgpr_spill_count`` and the scratch size).

    On AMD only VGPR spills go to memory (scratch); SGPR spills go to lanes of a VGPR
    (``v_writelane``), cost a few instructions and no memory traffic: they are counted apart
    (``sgpr_spills``) and are not spills in the budget's sense."""

    def field(name):
        m = re.findall(rf"\.{name}:\s+(\d+)", asm)
        return int(m[-1]) if m else 0

    scratch = re.findall(r"ScratchSize:\s+(\d+)", asm)
    return (
        field("vgpr_count"),
        4 * field("vgpr_spill_count"),
        int(scratch[-1]) if scratch else 0,
        field("sgpr_spill_count"),
    )


def _one_line(exc: Exception) -> str:
    """A compile error on one line: Triton's ``CompilationError`` text is the position, the source
    excerpt and, last, the message; keep the position and the message."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if len(lines) < 2 else f"{lines[0]} {lines[-1]}"
    return f"{type(exc).__name__}: {text}"


def compile_kernel(
    fn,
    specimen: dict,
    blocks: dict,
    target: str,
    num_warps: int,
    num_stages: int = 1,
    kernel: str = "",
    config: str = "",
    dtype: str = "",
) -> CompileReport:
    """Compile ``fn`` for ``target`` (a key of :data:`TARGETS`); never raises for a compile
    error (it is in the report)."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    report = CompileReport(kernel or fn.__name__, target, config, dtype)
    backend, arch, warp = TARGETS[target]
    jf = jit_function(fn)
    t0 = time.perf_counter()
    try:
        signature, constexprs, attrs = _specialise(jf, specimen, blocks)
        src = ASTSource(jf, signature, constexprs, attrs)
        options = {"num_warps": num_warps, "num_stages": num_stages}
        if backend == "cuda":
            log = io.StringIO()
            with contextlib.redirect_stdout(log), knobs.nvidia.scope(), knobs.compilation.scope():
                knobs.nvidia.dump_ptxas_log = True
                knobs.compilation.always_compile = True  # a cached cubin would print no ptxas log
                triton.compile(src, target=GPUTarget(backend, arch, warp), options=options)
            report.registers, report.spill_bytes = _nvidia_usage(log.getvalue())
            report.scratch_bytes = report.spill_bytes
        else:
            compiled = triton.compile(src, target=GPUTarget(backend, arch, warp), options=options)
            (report.registers, report.spill_bytes, report.scratch_bytes, report.sgpr_spills) = (
                _amd_usage(compiled.asm["amdgcn"])
            )
    except Exception as exc:  # the report carries it; the caller decides
        report.error = _one_line(exc)
    report.seconds = time.perf_counter() - t0
    return report
