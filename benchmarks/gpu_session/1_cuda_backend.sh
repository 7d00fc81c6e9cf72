#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~7 min): set-up with the C++ CUDA kernels (sm_90; about a
# minute more than Triton's alone), the CUDA tests with them (CFM_PLUGINS_GPU_BACKEND=cuda; those
# with the Triton kernels passed on an H100 at b93c0d1: 15 passed in 125 s), then the train step at
# 4000 atoms with every way in one run, float64 first: cuEquivariance, ours on Triton and on the C++
# CUDA kernels, stock (last: the slowest, and the least news). The last H100 run had ours (Triton)
# at 141.3 ms against cuEquivariance's 136.4 in float64 (1.04x; inference 0.64x). The step table
# gives each row its ratios to the other rows of the same run, whichever ran first; each row is
# printed as it finishes, so a group cut by the time left keeps what ran (about 90 s a dtype; the
# set-up with CUDA about 125 s).
# Decides: the C++ CUDA tests, and the table of every backend at the current tiles.
#   run(command="bash benchmarks/gpu_session/1_cuda_backend.sh", carry=[".gpu"], timeout_s=430)
set -uo pipefail
BUDGET=${BUDGET:-400}
SETUP=setup . benchmarks/gpu_session/lib.sh
if [ "$CUDA_BUILT" = 1 ]; then
  CFM_PLUGINS_GPU_BACKEND=cuda step 150 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
  step $(( $(left) - 5 )) python3 benchmarks/gpu_mace.py --atoms 4000 --dtypes float64 float32 --ways cueq fused stock --backend triton cuda --no-epoch --reps 5 --warmup 2
else  # no C++ CUDA kernels (the build's log is above): the step table without their rows
  step $(( $(left) - 5 )) python3 benchmarks/gpu_mace.py --atoms 4000 --dtypes float64 float32 --ways cueq fused stock --backend triton --no-epoch --reps 5 --warmup 2
fi
echo "### done at t=$((SECONDS - T0)) s"
