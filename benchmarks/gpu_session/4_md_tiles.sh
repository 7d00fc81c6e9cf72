#!/usr/bin/env bash
# GPU call 4, at once after call 3 on the same warm machine (~5 min): MD at 4000 atoms, float32, the
# neighbour list kept: cuEquivariance's calculator, ours eager and ours captured, best of 2 x 10
# steps, in one run. An H100 had ours captured at 59.4 ms a step (0.16x cuEquivariance's) and an
# H200 its first call, the compile, at 57.4 s (one run of 10 steps there is no steady state: it held
# a rebuild of the list); this gives both on one GPU, which the log line of a CUDA calculator quotes.
# Then the Triton tile sweep at 4000 nodes in the time left: float64 first, conv TP first, each
# kernel's default then its alternatives. A tile that spills on the GPU says so in the log (a
# WARNING from cfm_plugins.ops.triton).
#   run(command="bash benchmarks/gpu_session/4_md_tiles.sh", carry=[".gpu"], timeout_s=330)
set -uo pipefail
BUDGET=${BUDGET:-300}
. benchmarks/gpu_session/lib.sh
step 140 python3 benchmarks/gpu_md.py --atoms 4000 --dtypes float32 --ways cueq "fused[triton]" "fused[triton]+capture" --skin 1.0 --skin-only --steps 10 --repeats 2 --out "$OUT/md_4000.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 float32 --kernels tp sc --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles.md"
echo "### done at t=$((SECONDS - T0)) s"
