#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~7 min): set-up (Triton only), then mace_run_train epochs in
# one run: stock, ours (binpack + fused) and cuEquivariance, 300 CuNi structures, float32, two
# epochs each, the second one timed. Two H200 calls had each way's epoch from a different run:
# stock's second epoch 5.39 s in one session and 8.23 s in the next, ours 2.81 s with Triton's
# cache empty (its first epoch pays the compiles: 14.2 s) and 2.76 s with it full; stock was cut at
# 40 s in its second epoch and cuEquivariance at 85 s in its first (11 s to its first validation,
# then compiles). Each now has room: stock 55 s (it needs ~45), ours 75 (cold, ~45), cuEquivariance
# the rest (~155). Captured epochs are not run (capture stays off in training). The logs come back.
# Decides: the epoch target, against stock and cuEquivariance in one run.
#   run(command="bash benchmarks/gpu_session/1_epochs.sh", carry=[".gpu"], timeout_s=430)
set -uo pipefail
BUDGET=${BUDGET:-400}
. benchmarks/gpu_session/lib.sh
logs() {  # the runs' logs back, named by $1, and their milestones
  for d in /tmp/epochs/*/; do
    [ -e "$d/train.log" ] || continue
    n=$1_$(basename "$d"); cp "$d/train.log" "$OUT/$n.log"
    echo "== $n"; grep -E "INFO: (Started|Initial|Epoch)|Error|error" "$d/train.log" | tail -6
    rm "$d/train.log"
  done
}
CUEQ=$(( $(left) - 10 - 40 - 55 - 75 ))  # what making the data (40 s), stock and ours leave
step $(( $(left) - 5 )) python3 benchmarks/gpu_mace.py --device cuda --no-steps --backend triton --epoch-structures 300 --epoch-ways stock fused cueq --epoch-timeout 55 75 $CUEQ --out /tmp/epochs
logs epochs
echo "### done at t=$((SECONDS - T0)) s"
