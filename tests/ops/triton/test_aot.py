"""Ahead-of-time compilation (``cfm_plugins.ops.triton.aot``, what ``make triton-check`` runs on the
MACE-MP-medium layer): a small generated kernel compiles for an NVIDIA and an AMD target with
its registers and spills read back, a launch's specialisation is reproduced, and a compile error
is reported, not raised.

The compiles run in a child process: Triton's own jitted helpers are interpreted functions when
triton was first imported under ``TRITON_INTERPRET=1`` (as the interpreter tests of this session
may have done), and ahead-of-time compilation needs the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, clean_env, import_triton

SCRIPT = r"""
import json, torch
import mace  # noqa: F401
from e3nn import o3
from mace.modules.symmetric_contraction import SymmetricContraction
from cfm_plugins.ops.symmetric_contraction import FusedSymmetricContraction
from cfm_plugins.ops.triton import _codegen, aot, symmetric_contraction as tsc

torch.set_default_dtype(torch.float64)
sc = SymmetricContraction(o3.Irreps("4x0e+4x1o"), o3.Irreps("4x0e+4x1o"), 2, num_elements=1)
t = tsc.SCTables.from_descriptor(FusedSymmetricContraction.from_mace(sc).descriptor)
mod = _codegen.load_source("aot_test", tsc.source(t, "bwd", need_gx=True, need_gc=True))
spec = tsc.specimen(t, 4, "float32")
out = {}
for target in ("sm_90", "gfx942"):
    r = aot.compile_kernel(mod.sc_bwd, spec, dict(BLOCK_N=8, BLOCK_C=32), target, 4)
    out[target] = [r.registers, r.spill_bytes, r.error]
bad = aot.compile_kernel(mod.sc_bwd, spec, dict(BLOCK_N=6, BLOCK_C=32), "sm_90", 4)  # tl.arange needs 2^k
out["bad"] = [bad.ok, bad.error]
sig, const, attrs = aot._specialise(aot.jit_function(mod.sc_bwd), spec, dict(BLOCK_N=8, BLOCK_C=32))
out["spec"] = [sig["x_ptr"], sig["s_xl"], const["s_xl"], sig["C"], sig["BLOCK_N"]]
print("RESULT" + json.dumps(out))
"""  # noqa: E501


def compiled_in_a_child(script: str) -> dict:
    """Run ``script`` in a child process without the interpreter; the JSON it prints after
    RESULT."""
    import_triton()
    env = clean_env()
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=570,
    )
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert res.returncode == 0 and line, res.stderr[-3000:]
    return json.loads(line[len("RESULT") :])


def test_a_generated_kernel_compiles_for_nvidia_and_amd_with_its_registers():
    out = compiled_in_a_child(SCRIPT)
    for target in ("sm_90", "gfx942"):
        regs, spills, error = out[target]
        # a small kernel: registers well inside the budget; spills read back, at most a few words
        # (triton 3.7.1's code spills none on sm_90, 3.8.0's one word: 4 B stored, 4 B loaded)
        assert error is None and 0 < regs <= 255 and 0 <= spills <= 16, (target, out[target])
    assert out["bad"][0] is False and "arange" in out["bad"][1]
    # a contiguous launch: pointers typed, the unit stride a constant, sizes 32-bit, tiles constexpr
    assert out["spec"] == ["*fp32", "constexpr", 1, "i32", "constexpr"]


# ptxas -v's report of the kernel above, as triton 3.8.0 (its ptxas 12.9) printed it for sm_90a
PTXAS_LOG_TRITON_3_8 = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'sc_bwd' for 'sm_90a'
ptxas info    : Function properties for sc_bwd
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 8 bytes cumulative stack size
ptxas info    : Compile time = 27.075 ms
"""


def test_the_ptxas_report_gives_registers_and_spill_stores_plus_loads():
    from cfm_plugins.ops.triton import aot

    assert aot._nvidia_usage(PTXAS_LOG_TRITON_3_8) == (72, 8)
    unspilled = PTXAS_LOG_TRITON_3_8.replace(
        "8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads",
        "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
    )
    assert aot._nvidia_usage(unspilled) == (72, 0)
    with pytest.raises(RuntimeError, match="no register count"):
        aot._nvidia_usage("ptxas info    : 0 bytes gmem\n")


SEGMENT_SCRIPT = r"""
import json, torch
import mace  # noqa: F401
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.triton import _codegen, aot, conv_tp as ttp
from cfm_plugins.testing import mace_conv_tp

t = ttp.TPTables.from_descriptor(FusedConvTP.from_e3nn(mace_conv_tp("0e+1o", 2, 8, torch.float64)).descriptor)
mod = _codegen.load_source("aot_segment", ttp.source(t, "segment"))
jf = aot.jit_function(mod.tp_segment)
sig, const, attrs = aot._specialise(jf, ttp.specimen(t, "float32"), dict(BLOCK_E=8, BLOCK_C=32))
ttgir = triton.compile(ASTSource(jf, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4, "num_stages": 1}).asm["ttgir"]
depth, inside, after = 0, 0, 0
for line in ttgir.splitlines():
    if "scf.for" in line:
        depth += 1
    if '"tt.reduce"(' in line:
        inside, after = (inside + 1, after) if depth else (inside, after + 1)
    if "scf.yield" in line:
        depth -= 1
print("RESULT" + json.dumps([inside, after, len(t.out_row_mul)]))
"""  # noqa: E501


def test_the_segment_kernel_sums_after_its_loop_once_compiled():
    """Compiled for sm_90, the segment kernel sums each output row once, after its loop over the
    node's edges: no sum inside the loop (one per row and block of edges would cross warps)."""
    inside, after, rows = compiled_in_a_child(SEGMENT_SCRIPT)
    assert rows > 0 and inside == 0 and after == rows


EDGE_COUNT_SCRIPT = r"""
import json, torch
import mace  # noqa: F401
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from cfm_plugins.ops.conv_tp import FusedConvTP
from cfm_plugins.ops.triton import _codegen, aot, conv_tp as ttp
from cfm_plugins.testing import mace_conv_tp

t = ttp.TPTables.from_descriptor(FusedConvTP.from_e3nn(mace_conv_tp("0e+1o", 2, 8, torch.float64)).descriptor)
mod = _codegen.load_source("aot_edges", ttp.source(t, "edge", need_y=True, need_w=True))
loaded = mod.tp_edge_wy
jf = aot.jit_function(loaded)
out = {"loaded": [p.name for p in loaded.params if p.do_not_specialize],
       "aot": [p.name for p in jf.params if p.do_not_specialize]}
for edges in (312_000, 312_001, 1):  # divisible by 16, not, and 1: the three classes Triton tells apart
    sig, const, attrs = aot._specialise(jf, ttp.specimen(t, "float32", edges=edges), dict(BLOCK_E=8, BLOCK_C=32))
    e = jf.arg_names.index("E")
    ptx = triton.compile(ASTSource(jf, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": 4, "num_stages": 1}).asm["ptx"]
    out[str(edges)] = [sig["E"], "E" in const, (e,) in attrs, ptx]
print("RESULT" + json.dumps(out))
"""  # noqa: E501


def test_the_edge_kernels_compile_once_for_every_edge_count():
    """The edge count changes with every batch. Specialised as Triton specialises integers
    (divisible by 16, equal to 1, neither), each edge kernel compiled again for each class a run
    met; marked ``do_not_specialize``, one compile serves every count: an edge count divisible by
    16, one not, and 1 give the same signature and the same PTX."""
    out = compiled_in_a_child(EDGE_COUNT_SCRIPT)
    assert out["loaded"] == ["E"] and out["aot"] == ["E"]
    variants = [out[k] for k in ("312000", "312001", "1")]
    assert all(v[:3] == ["i32", False, False] for v in variants), [v[:3] for v in variants]
    assert (
        variants[0][3] == variants[1][3] == variants[2][3] and ".entry tp_edge_wy" in variants[0][3]
    )


SKIP_SCRIPT = r"""
import json
from cfm_plugins.ops.triton import aot, skip_tp as tsk
from cfm_plugins.ops.triton.configs import configs_for
out = {}
for kernel in tsk.KERNELS:
    fn, (rows, cols), _ = tsk.kernel_function(kernel)
    for dtype in ("float32", "float64"):
        cfg = configs_for(kernel, dtype)[0]
        for target in ("sm_90", "gfx942"):
            blocks = dict(tsk.aot_constants(kernel, dtype, target))
            blocks.update({rows: cfg.block_rows, cols: cfg.block_c})
            r = aot.compile_kernel(fn, tsk.specimen(kernel, dtype), blocks, target, cfg.num_warps)
            out[f"{kernel} {dtype} {target}"] = [r.registers, r.spill_bytes, r.error]
print("RESULT" + json.dumps(out))
"""


def test_the_skip_connection_kernels_compile_without_spills_in_their_default_tiles():
    """skip_apply and skip_wgrad (MACE-MP-medium's 128x0e+128x1o, 89 elements) for an NVIDIA and
    an AMD target in both dtypes; float64 on AMD takes the rank-1 path (triton 3.7.1's float64
    tl.dot fails to lower to MFMA on gfx942)."""
    out = compiled_in_a_child(SKIP_SCRIPT)
    assert len(out) == 8
    for name, (registers, spills, error) in out.items():
        assert error is None and registers > 0 and spills == 0, (name, error, spills)
