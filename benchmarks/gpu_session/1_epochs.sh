#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~7 min): set-up (Triton only), then mace_run_train epochs in
# one run: stock, ours (binpack + fused), ours captured (static + compile=reduce-overhead) and
# cuEquivariance, 300 CuNi structures, float32, two epochs each, the second one timed. An H100 call
# had 113 s for all four and timed none (stock's first epoch took 18.2 s with 600 structures): each
# run now has its own limit, the captured one (which compiles first) the rest of the call. Their
# logs come back. Decides: capture on by default in training on CUDA; the epoch target.
#   run(command="bash benchmarks/gpu_session/1_epochs.sh", carry=[".gpu"], timeout_s=430)
set -uo pipefail
BUDGET=${BUDGET:-400}
. benchmarks/gpu_session/lib.sh
L=$(( $(left) - 10 ))
T=$(( L - 55 - 50 - 55 - 25 ))  # the captured run: what the others and the data set leave
step $L python3 benchmarks/gpu_mace.py --device cuda --no-steps --backend triton --epoch-structures 300 --epoch-ways stock fused fused+capture cueq --epoch-timeout 55 50 $T 55 --out /tmp/epochs
for d in /tmp/epochs/*/; do
  [ -e "$d/train.log" ] || continue
  n=$(basename "$d"); cp "$d/train.log" "$OUT/epoch_$n.log"
  echo "== $n"; grep -E "INFO: (Initial|Epoch)|Error|error" "$d/train.log" | tail -6
done
echo "### done at t=$((SECONDS - T0)) s"
