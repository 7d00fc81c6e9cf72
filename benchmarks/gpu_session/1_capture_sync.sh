#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~7 min): set-up (Triton only), then the captured static step at
# 500 atoms: float32 against stock's eager step (target <= 0.5x; stock's own captured step is timed
# too), and float64 (exact to 1e-10 against the uncaptured step). Both run the sync check, which
# lists every synchronizing call with its stack (on an H200 the captured step still waited for the
# device, before the symmetric contraction's traced chunking stopped sizing tensors by values).
#   run(command="bash benchmarks/gpu_session/1_capture_sync.sh", carry=[".gpu"], timeout_s=430)
set -uo pipefail
BUDGET=${BUDGET:-400}
. benchmarks/gpu_session/lib.sh
step 230 python3 benchmarks/gpu_capture.py --backend triton --atoms 500 --dtypes float32 --reps 5 --warmup 2 --out "$OUT/capture_f32.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_capture.py --backend triton --atoms 500 --dtypes float64 --no-stock --reps 5 --warmup 2 --out "$OUT/capture_f64.md"
echo "### done at t=$((SECONDS - T0)) s"
