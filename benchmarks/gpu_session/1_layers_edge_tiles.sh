#!/usr/bin/env bash
# GPU call 1 of a 15-minute session (~6.5 min): where ours loses cuEquivariance's float64 train step
# at 4000 atoms (1.12-1.25x on an H200, 1.04x on an H100; float32 wins, 0.75x). The kernels alone
# win in the modes timed so far (layer 1's conv TP, layer 0's product block), except the conv TP's
# backward (1.15x), whose weight-and-attribute gradient kernel (tp_edge_wy) is the step's largest;
# the step also has layer 0's conv TP and layer 1's product block, and differentiates the forces
# through the per-edge weights as well, which no micro-benchmark timed. So, in this order:
# 1. both layers' kernels alone, float64, against cuEquivariance, fwd / bwd / train (the step's chain);
# 2. the edge kernel's tiles in both layers and dtypes, with its new /presort tiles (the edges in the
#    receivers' order, untimed), bwd and train; the fastest written to /tmp/cfm_session for call 2;
# 3. the new CUDA test that every edge tile, compiled, gives the default tile's gradients.
#   run(command="bash benchmarks/gpu_session/1_layers_edge_tiles.sh", carry=[".gpu"], timeout_s=400)
set -uo pipefail
BUDGET=${BUDGET:-370}
. benchmarks/gpu_session/lib.sh
mkdir -p /tmp/cfm_session
step 95 python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 --layers 0 1 --modes fwd bwd train --ways cueq fused --reps 5 --warmup 2 --out "$OUT/layers_f64.md"
step $(( $(left) - 85 )) python3 benchmarks/gpu_kernels.py --nodes 4000 --dtypes float64 float32 --kernels tp --layers 0 1 --modes bwd train --ways fused --tiles --tile-kernels tp_edge --reps 5 --warmup 2 --out "$OUT/edge_tiles.md"
cp "$OUT/edge_tiles.md" /tmp/cfm_session/ 2>/dev/null
CFM_PLUGINS_GPU_BACKEND=triton step $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -k "edge_tiles" tests/ops/test_conv_tp.py -rs
echo "### done at t=$((SECONDS - T0)) s"
