#!/usr/bin/env bash
# GPU call 1 (a fresh machine: set-up ~2 min): the captured step's exactness (float64), where the
# train step's time goes (4000 atoms: cuEquivariance vs ours; 500 atoms: stock too), then the two
# kernels alone with their profiles in the time left.
set -uo pipefail
. benchmarks/gpu_session/lib.sh
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
step 120 python3 benchmarks/gpu_capture.py --backend triton --atoms 500 --dtypes float64 --out "$OUT/capture_f64.md"
step 150 python3 benchmarks/gpu_profile.py --backend triton --atoms 4000 --dtypes float32 float64 --ways cueq fused --out "$OUT/profile_4000.md"
step 70 python3 benchmarks/gpu_profile.py --backend triton --atoms 500 --dtypes float32 --ways stock cueq fused --out "$OUT/profile_500.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 500 32000 --profile --out "$OUT/kernels.md"
echo "### done at t=$((SECONDS - T0)) s"
