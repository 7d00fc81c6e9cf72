#!/usr/bin/env bash
# GPU call 3 (the session after calls 1 and 2; ~6.5 min): rebuild with the C++ CUDA kernels (sm_90), the CUDA tests
# with them (CFM_PLUGINS_GPU_BACKEND=cuda), then MD at 500 atoms, float32 and float64, every way
# (stock, cuEquivariance, ours eager with each backend and captured with Triton), in the time left.
#   run(command="bash benchmarks/gpu_session/3_cuda_backend.sh", carry=[".gpu"], timeout_s=390)
set -uo pipefail
BUDGET=${BUDGET:-360}
SETUP=setup . benchmarks/gpu_session/lib.sh
CFM_PLUGINS_GPU_BACKEND=cuda step 150 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
step $(( $(left) - 5 )) python3 benchmarks/gpu_md.py --atoms 500 --dtypes float32 float64 --ways stock cueq "fused[triton]" "fused[triton]+capture" "fused[cuda]" --steps 10 --repeats 2 --out "$OUT/md_500.md"
echo "### done at t=$((SECONDS - T0)) s"
