#!/usr/bin/env bash
# GPU call 4 (~4 min), at once after call 3: the two fused kernels alone at 4000 and 32000 nodes
# against stock and cuEquivariance, with their profiles, then the Triton tile sweep at 4000 nodes
# (every kernel's alternatives; conv TP first, for its deferred-sum tiles, untimed so far) in the
# time left. First,
# the tiles' registers and spills for sm_90 with the GPU image's triton (triton 3.8.0 spills in two
# default tiles that 3.7.1 does not: docs/benchmarks.md), so the sweep's timings can be read with them.
#   run(command="bash benchmarks/gpu_session/4_kernels_tiles.sh", carry=[".gpu"], timeout_s=270)
set -uo pipefail
BUDGET=${BUDGET:-240}
. benchmarks/gpu_session/lib.sh
step 60 python3 benchmarks/triton_check.py --targets sm_90 --jobs 16 --no-write
step 120 python3 benchmarks/gpu_kernels.py --nodes 4000 32000 --profile --out "$OUT/kernels.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --kernels tp sc --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles.md"
echo "### done at t=$((SECONDS - T0)) s"
