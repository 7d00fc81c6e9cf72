#!/usr/bin/env bash
# GPU call 3: rebuild with the C++ CUDA kernels (sm_90), the CUDA tests with each GPU backend, the
# 4000-atom memory peak, then mace_run_train epochs (stock, ours captured, ours eager,
# cuEquivariance) in the time left, each stopped at half of it; their logs come back.
set -uo pipefail
SETUP=setup . benchmarks/gpu_session/lib.sh
for b in triton cuda; do
  CFM_PLUGINS_GPU_BACKEND=$b step 150 python3 -m pytest -q -p no:cacheprovider -k "cuda or gpu" tests/ops tests/calculators -rs
done
step 120 python3 benchmarks/memory_peak.py --device cuda --atoms 4000 --ways cueq fused --out "$OUT/memory.md"
L=$(( $(left) - 15 ))
step $L python3 benchmarks/gpu_mace.py --device cuda --no-steps --backend triton --epoch-ways stock fused+capture fused cueq --epoch-timeout $(( L / 2 )) --out /tmp/epochs
for d in /tmp/epochs/*/; do
  [ -e "$d/train.log" ] || continue
  n=$(basename "$d"); cp "$d/train.log" "$OUT/epoch_$n.log"
  echo "== $n"; grep -E "INFO: (Initial|Epoch)|Error|error" "$d/train.log" | tail -6
done
echo "### done at t=$((SECONDS - T0)) s"
