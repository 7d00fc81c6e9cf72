#!/usr/bin/env bash
# GPU call 2: the captured step in float32 (500 and 4000 atoms), MD ms/step at 4000 and 500 atoms
# (stock, cuEquivariance, ours eager and captured), then the Triton tile sweep in the time left.
set -uo pipefail
. benchmarks/gpu_session/lib.sh
step 150 python3 benchmarks/gpu_capture.py --backend triton --atoms 500 4000 --dtypes float32 --out "$OUT/capture_f32.md"
step 260 python3 benchmarks/gpu_md.py --atoms 4000 500 --dtypes float32 float64 --ways stock cueq "fused[triton]" "fused[triton]+capture" --steps 10 --repeats 2 --out "$OUT/md.md"
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 500 --ways fused --modes fwd bwd2 --tiles --out "$OUT/tiles.md"
echo "### done at t=$((SECONDS - T0)) s"
