#!/usr/bin/env bash
# GPU call 3 (the next session a GPU is lent for; ~6 min): the CUDA tests with the Triton kernels
# compiled for real (CFMCalculator on cuda included; 12 passed on an H200 before the traced chunking
# changed), then mace_run_train epochs (stock, ours captured, ours eager, cuEquivariance) in the
# time left, each stopped at half of it; their logs come back.
#   run(command="bash benchmarks/gpu_session/3_tests_epochs.sh", carry=[".gpu"], timeout_s=390)
set -uo pipefail
BUDGET=${BUDGET:-360}
. benchmarks/gpu_session/lib.sh
CFM_PLUGINS_GPU_BACKEND=triton step 120 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
L=$(( $(left) - 15 ))
step $L python3 benchmarks/gpu_mace.py --device cuda --no-steps --backend triton --epoch-ways stock fused+capture fused cueq --epoch-timeout $(( L / 2 )) --out /tmp/epochs
for d in /tmp/epochs/*/; do
  [ -e "$d/train.log" ] || continue
  n=$(basename "$d"); cp "$d/train.log" "$OUT/epoch_$n.log"
  echo "== $n"; grep -E "INFO: (Initial|Epoch)|Error|error" "$d/train.log" | tail -6
done
echo "### done at t=$((SECONDS - T0)) s"
