#!/usr/bin/env bash
# GPU call 4 (~4 min), at once after call 3: the two fused kernels alone at 4000 and 32000 nodes
# against stock and cuEquivariance, with their profiles (stock's conv TP ran out of an H100's memory
# at 32000 nodes: its rows say OOM), then the Triton tile sweep at 4000 nodes in the time left:
# float64 first (an H100 call timed float32's, and float64's tp_segment), conv TP first, each
# kernel's default then its alternatives. A tile that spills on the GPU says so in the log (a
# WARNING from cfm_plugins.ops.triton).
#   run(command="bash benchmarks/gpu_session/4_kernels_tiles.sh", carry=[".gpu"], timeout_s=270)
set -uo pipefail
BUDGET=${BUDGET:-240}
. benchmarks/gpu_session/lib.sh
step 110 python3 benchmarks/gpu_kernels.py --nodes 4000 32000 --profile --out "$OUT/kernels.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 float32 --kernels tp sc --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles.md"
echo "### done at t=$((SECONDS - T0)) s"
