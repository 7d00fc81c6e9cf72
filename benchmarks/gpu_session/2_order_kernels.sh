#!/usr/bin/env bash
# GPU call 2, at once after call 1 on the same warm machine (~4.5 min): first the 500-atom steps,
# ours only, with the default tiles, tp_segment's former tile pinned, and the default tiles pinned
# as a third row. An H100 run had the former tile 8-12 ms faster at 500 atoms, where the host sets
# the step and the tile's kernels take a few ms: if the pinned default matches the former tile,
# the gap was the rows' order, not the tile. Then the float64 step at 4000 atoms (where ours missed
# cuEquivariance's by 3 %) with the conv TP's outputs zero-filled (the default) and left unfilled
# (CFM_PLUGINS_TRITON_UNFILLED=1, opt-in until timed): the unfilled row's win, if any, decides its
# default. Then the two fused kernels alone at 4000 and 32000 nodes against stock and
# cuEquivariance, with their profiles (stock's conv TP ran out of an H100's memory at 32000 nodes:
# its rows say OOM). The tile sweep is call 4's.
#   run(command="bash benchmarks/gpu_session/2_order_kernels.sh", carry=[".gpu"], timeout_s=290)
set -uo pipefail
BUDGET=${BUDGET:-260}
. benchmarks/gpu_session/lib.sh
step 80 python3 benchmarks/gpu_mace.py --atoms 500 --ways fused --backend triton --tiles-also tp_segment=8x32/w4 tp_segment:float32=8x32/w4/defer/presort,tp_segment:float64=4x32/w4/defer/presort --no-epoch --reps 5 --warmup 2
step 60 python3 benchmarks/gpu_mace.py --atoms 4000 --dtypes float64 --ways fused --backend triton --unfilled-also --no-epoch --reps 5 --warmup 2
step $(( $(left) - 5 )) python3 benchmarks/gpu_kernels.py --nodes 4000 32000 --profile --out "$OUT/kernels.md"
echo "### done at t=$((SECONDS - T0)) s"
