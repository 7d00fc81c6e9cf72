#!/usr/bin/env bash
# GPU call 2 (~4 min), at once after call 1 on the same warm machine (its set-up is then skipped):
# the captured float32 step at 500 atoms against stock's eager step (target <= 0.5x), then where the
# 4000-atom train step's time goes, cuEquivariance against ours (float32 117 vs 104 ms, float64
# 205 vs 123 ms on an H100), in the time left.
#   run(command="bash benchmarks/gpu_session/2_capture_profile.sh", carry=[".gpu"], timeout_s=270)
set -uo pipefail
BUDGET=${BUDGET:-240}
. benchmarks/gpu_session/lib.sh
step 120 python3 benchmarks/gpu_capture.py --backend triton --atoms 500 --dtypes float32 --reps 5 --warmup 2 --out "$OUT/capture_f32.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_profile.py --backend triton --atoms 4000 --dtypes float32 float64 --ways cueq fused --out "$OUT/profile_4000.md"
echo "### done at t=$((SECONDS - T0)) s"
