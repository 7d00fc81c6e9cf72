#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~7 min): set-up (Triton only), then the whole inference and
# train steps at 500 and 4000 atoms, float32 and float64, in one run: cuEquivariance, ours with the
# default tiles (tp_segment's deferred-sum, presorted tiles since an H100's tile sweep), and ours
# with tp_segment's former default pinned (8x32/w4). It decides whether the new default stays (the
# 4000-atom targets are against cuEquivariance). Then the 4000-atom float64 train step profiled, ours
# only (cuEquivariance's profile is in docs/_fragments/gpu_h100_session2.md).
#   run(command="bash benchmarks/gpu_session/1_step_tiles.sh", carry=[".gpu"], timeout_s=430)
set -uo pipefail
BUDGET=${BUDGET:-400}
. benchmarks/gpu_session/lib.sh
step 300 python3 benchmarks/gpu_mace.py --atoms 500 4000 --ways cueq fused --backend triton --tiles-also tp_segment=8x32/w4 --no-epoch --reps 5 --warmup 2
step $(( $(left) - 5 )) python3 benchmarks/gpu_profile.py --backend triton --atoms 4000 --dtypes float64 --ways fused --out "$OUT/profile_4000_f64.md"
echo "### done at t=$((SECONDS - T0)) s"
