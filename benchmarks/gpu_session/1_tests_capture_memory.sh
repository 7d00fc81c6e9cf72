#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (the first a GPU is lent for; ~6 min): set-up (Triton only), the
# CUDA tests with the Triton kernels compiled for real (CFMCalculator on cuda included), the
# captured step in float64 (exact to 1e-10 against the uncaptured one, no host sync), then the
# 4000-atom train-step memory peak, ours against cuEquivariance (predicted 8.2 vs 9.1 GiB).
#   run(command="bash benchmarks/gpu_session/1_tests_capture_memory.sh", carry=[".gpu"], timeout_s=390)
set -uo pipefail
BUDGET=${BUDGET:-360}
. benchmarks/gpu_session/lib.sh
CFM_PLUGINS_GPU_BACKEND=triton step 120 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
step 110 python3 benchmarks/gpu_capture.py --backend triton --atoms 500 --dtypes float64 --no-stock --reps 5 --warmup 2 --out "$OUT/capture_f64.md"
step $(( $(left) - 5 )) python3 benchmarks/memory_peak.py --device cuda --atoms 4000 --ways cueq fused --out "$OUT/memory.md"
echo "### done at t=$((SECONDS - T0)) s"
