#!/usr/bin/env bash
# GPU call 2 of a 15-minute session (~4.5 min), at once after call 1 on the same warm machine (its
# set-up is then skipped): MD at 4000 atoms, float32, cuEquivariance's calculator against ours,
# eager and captured (an H100 call ran out of time in the captured one's compile), each of ours
# also with the neighbour list kept between steps (CFMCalculator(skin=1.0)). The eager ones took
# 313 and 304 ms a step there, most of it on the host: the "graph ms" column says how much is
# mace's neighbour list and data conversion.
#   run(command="bash benchmarks/gpu_session/2_md_capture.sh", carry=[".gpu"], timeout_s=290)
set -uo pipefail
BUDGET=${BUDGET:-260}
. benchmarks/gpu_session/lib.sh
step $(( $(left) - 5 )) python3 benchmarks/gpu_md.py --atoms 4000 --dtypes float32 --ways cueq "fused[triton]" "fused[triton]+capture" --skin 1.0 --steps 10 --repeats 2 --out "$OUT/md.md"
echo "### done at t=$((SECONDS - T0)) s"
