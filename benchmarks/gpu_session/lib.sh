# Sourced by the numbered scripts, on the GPU machine, from the project root with .gpu/ carried:
# set-up (skipped when done; SETUP=setup builds the C++ CUDA kernels too, default setup_nocuda),
# the environment, and `step TIMEOUT cmd...`, which runs a command with a time limit and logs it.
# Everything printed also goes to $OUT/<script>.log; `left` is what remains of BUDGET seconds.
T0=${T0:-$SECONDS}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$(basename "$0" .sh).log") 2>&1
[ -e .gpu/env.sh ] || { echo "no .gpu/: run bash benchmarks/gpu_session/prepare.sh here and carry .gpu"; exit 1; }
bash ".gpu/${SETUP:-setup_nocuda}.sh" || { echo "set-up failed"; exit 1; }
. .gpu/env.sh
cd /tmp/proj
step() {
  local to=$1; shift
  echo; echo "### [t=$((SECONDS - T0)) s] $*"
  local t=$SECONDS
  timeout -k 10 "$to" "$@"; local rc=$?
  echo "### rc=$rc in $((SECONDS - t)) s"
}
left() { local l=$(( ${BUDGET:-570} - (SECONDS - T0) )); echo $(( l > 30 ? l : 30 )); }
