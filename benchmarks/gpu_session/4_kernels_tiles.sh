#!/usr/bin/env bash
# GPU call 4 (~4 min), at once after call 3: the two fused kernels alone at 4000 and 32000 nodes
# against stock and cuEquivariance, with their profiles, then the Triton tile sweep at 4000 nodes
# (every kernel's alternatives, the float64 8-warp conv TP tiles among them) in the time left.
#   run(command="bash benchmarks/gpu_session/4_kernels_tiles.sh", carry=[".gpu"], timeout_s=270)
set -uo pipefail
BUDGET=${BUDGET:-240}
. benchmarks/gpu_session/lib.sh
step 120 python3 benchmarks/gpu_kernels.py --nodes 4000 32000 --profile --out "$OUT/kernels.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles.md"
echo "### done at t=$((SECONDS - T0)) s"
