#!/usr/bin/env bash
# GPU call 2, at once after call 1 on the same warm machine (~4.5 min): the whole train step at 4000
# atoms, float64 and float32, ours with the default tiles and with the edge tiles call 1's sweep found
# fastest (/tmp/cfm_session/edge_tiles.md; without it, the presorted default-sized tile), against
# cuEquivariance, in one run; a tile becomes a default where the step is faster by well over the
# spread (docs/gpu.md). Then the float64 step at 1000 and 2000 atoms against cuEquivariance: binpack's
# float64 batches on a GPU hold 400..2000 atoms by default, where ours won at 500 (0.87x, H100), and
# where it starts to lose decides whether that range needs a word or a change.
#   run(command="bash benchmarks/gpu_session/2_step_sizes.sh", carry=[".gpu"], timeout_s=290)
set -uo pipefail
BUDGET=${BUDGET:-260}
. benchmarks/gpu_session/lib.sh
PIN=$(sed -n 's/.*`CFM_PLUGINS_TRITON_TILES=\([^`]*\)`.*/\1/p' /tmp/cfm_session/edge_tiles.md 2>/dev/null | tail -1)
echo "### the edge tiles of call 1's sweep: ${PIN:-none found, the presorted tiles instead}"
step 160 python3 benchmarks/gpu_mace.py --atoms 4000 --dtypes float64 float32 --ways cueq fused --backend triton --tiles-also "${PIN:-tp_edge:float64=8x32/w4/presort,tp_edge:float32=8x32/w4/presort}" --no-epoch --reps 5 --warmup 2
step $(( $(left) - 5 )) python3 benchmarks/gpu_mace.py --atoms 1000 2000 --dtypes float64 --ways cueq fused --backend triton --no-epoch --reps 5 --warmup 2
echo "### done at t=$((SECONDS - T0)) s"
