#!/usr/bin/env bash
# The prepared GPU run, one call: set the machine up, then run the call's commands from /tmp/proj.
# Usage (the device tool's command, from the repository root, with .gpu/ carried):
#   bash tools/gpu_checks/run.sh a        # then, on the warm machine: bash tools/gpu_checks/run.sh b
# .gpu/ holds the bundle (bash ../shared/gpu/bundle.sh .gpu, plus pytest and setuptools>=77) and a
# copy of ../shared/gpu/setup.sh and env.sh (only the checkout travels). Output goes to $OUT/<call>.
set -uo pipefail
call=${1:?usage: run.sh a|b [sm_arch=90]}
arch=${2:-90}
out=${OUT:-$PWD/out/tools/gpu_checks}
mkdir -p "$out"
if [ ! -e .gpu/setup.sh ] || [ ! -e .gpu/env.sh ]; then
  echo "no .gpu/setup.sh and .gpu/env.sh: make the bundle here first (bash ../shared/gpu/bundle.sh .gpu;" \
       "cp ../shared/gpu/setup.sh ../shared/gpu/env.sh .gpu/) and carry .gpu" | tee "$out/setup.log"
  exit 2
fi
t=$SECONDS
bash .gpu/setup.sh "$arch" 2>&1 | tee "$out/setup-$call.log" || exit 1
echo "set-up: $((SECONDS - t)) s" | tee -a "$out/setup-$call.log"
# shellcheck disable=SC1091
. .gpu/env.sh
cd /tmp/proj || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
python3 -m tools.gpu_checks "$call" --out "$out" 2>&1 | tee "$out/run-$call.log"
exit "${PIPESTATUS[0]}"
