#!/usr/bin/env bash
# GPU call 2 (~3.5 min), at once after call 1 on the same warm machine (its set-up is then skipped):
# where the 4000-atom float64 train step's time goes, cuEquivariance against ours (205 vs 123 ms on
# an H100; float32 was profiled on an H200: docs/benchmarks.md), then MD at 4000 atoms, float32
# (cuEquivariance's MACECalculator against CFMCalculator eager and captured; target <= 0.5x).
#   run(command="bash benchmarks/gpu_session/2_profile_md.sh", carry=[".gpu"], timeout_s=230)
set -uo pipefail
BUDGET=${BUDGET:-200}
. benchmarks/gpu_session/lib.sh
step 100 python3 benchmarks/gpu_profile.py --backend triton --atoms 4000 --dtypes float64 --ways cueq fused --out "$OUT/profile_4000_f64.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_md.py --atoms 4000 --dtypes float32 --ways cueq "fused[triton]" "fused[triton]+capture" --steps 10 --repeats 2 --out "$OUT/md.md"
echo "### done at t=$((SECONDS - T0)) s"
