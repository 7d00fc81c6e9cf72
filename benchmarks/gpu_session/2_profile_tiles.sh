#!/usr/bin/env bash
# GPU call 2, at once after call 1 on the same warm machine (~4.5 min): why ours misses
# cuEquivariance's float64 train step at 4000 atoms (1.04x on an H100, where float32 wins at
# 0.81x). First both steps profiled in one run (the last such profile predates the segment kernels'
# deferred-sum tiles and the unfilled outputs); then the conv TP and the contraction alone in
# float64 at 4000 nodes against cuEquivariance (only float32 was run alone since: conv TP backward
# 1.09-1.23x cuEquivariance's, the rest faster); then the tile sweep, float64, in the time left: each
# kernel's default, then its alternatives, forward alone and the whole chain (forward, backward, double
# backward). A tile that spills on the GPU says so in the log (a WARNING from
# cfm_plugins.ops.triton).
#   run(command="bash benchmarks/gpu_session/2_profile_tiles.sh", carry=[".gpu"], timeout_s=290)
set -uo pipefail
BUDGET=${BUDGET:-260}
. benchmarks/gpu_session/lib.sh
step 95 python3 benchmarks/gpu_profile.py --backend triton --atoms 4000 --dtypes float64 --ways cueq fused --out "$OUT/profile_4000_f64.md"
step 45 python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 --kernels tp sc --ways cueq fused --out "$OUT/kernels_f64.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 --kernels tp sc --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles_f64.md"
echo "### done at t=$((SECONDS - T0)) s"
