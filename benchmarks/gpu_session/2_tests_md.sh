#!/usr/bin/env bash
# GPU call 2 of a 15-minute session (~4.5 min), at once after call 1 on the same warm machine (its
# set-up is then skipped): the CUDA tests with the Triton kernels compiled for real (12 passed on
# an H100, CFMCalculator on cuda among them; pytest reported 99 s there and the step still reached
# its 120 s limit: start-up and exit), then MD at 4000 atoms, float32, with the step captured and
# the neighbour list kept (59.4 ms a step on that H100, 0.16x cuEquivariance's calculator): its
# "first call s" is the compile a calculator pays before its first step. Decides: capture on by
# default in CFMCalculator.
#   run(command="bash benchmarks/gpu_session/2_tests_md.sh", carry=[".gpu"], timeout_s=290)
set -uo pipefail
BUDGET=${BUDGET:-260}
. benchmarks/gpu_session/lib.sh
CFM_PLUGINS_GPU_BACKEND=triton step 150 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
step $(( $(left) - 5 )) python3 benchmarks/gpu_md.py --atoms 4000 --dtypes float32 --ways "fused[triton]+capture" --skin 1.0 --skin-only --steps 10 --repeats 1 --out "$OUT/md_first_call.md"
echo "### done at t=$((SECONDS - T0)) s"
