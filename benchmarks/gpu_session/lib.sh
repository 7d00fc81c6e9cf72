# Sourced by the numbered scripts, on the GPU machine, from the project root with .gpu/ carried:
# set-up (skipped when done; SETUP=setup builds the C++ CUDA kernels too, default setup_nocuda; should
# that build fail, the set-up without them, and CUDA_BUILT=0 tells the calling script),
# the environment, and `step TIMEOUT cmd...`, which runs a command with a time limit and logs it.
# Everything printed also goes to $OUT/<script>.log. Each script sets BUDGET (seconds; the caller's
# BUDGET=... wins, for a session with less device time left): `left` is what remains of it, and the
# run call's timeout_s is BUDGET + 30.
: "${BUDGET:?set BUDGET (seconds) in the calling script}"
T0=${T0:-$SECONDS}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$(basename "$0" .sh).log") 2>&1
# at exit, end tee's input and wait for it: $OUT is collected once the script returns
TEE_PID=$!
trap 'exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null' EXIT
echo "### $(basename "$0"): budget $BUDGET s; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | head -1)"
[ -e .gpu/env.sh ] || { echo "no .gpu/: run bash benchmarks/gpu_session/prepare.sh here and carry .gpu"; exit 1; }
t_setup=$SECONDS
SETUP=${SETUP:-setup_nocuda}
CUDA_BUILT=0  # 1 once the C++ CUDA kernels are built: a call that needs them checks it
if bash ".gpu/$SETUP.sh"; then
  [ "$SETUP" = setup ] && CUDA_BUILT=1
elif [ "$SETUP" = setup ]; then  # the C++ CUDA build failed (its log above): the Triton rows still run
  echo "### the set-up with the C++ CUDA kernels failed (above); set-up without them"
  SETUP=setup_nocuda
  bash .gpu/setup_nocuda.sh || { echo "set-up failed"; exit 1; }
else
  echo "set-up failed"; exit 1
fi
echo "### set-up ($SETUP) in $((SECONDS - t_setup)) s"
. .gpu/env.sh
# the set-up copies the checkout to /tmp/proj only when the package's sources changed: a warm
# machine would run the last call's benchmarks and tests, so this call's are copied over them
tar -c benchmarks tests examples | tar -x -C /tmp/proj
cd /tmp/proj
# the versions the figures go with (triton's decides the tiles' registers and spills)
python3 -c 'import torch, triton; print("### torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1
step() {
  local to=$1; shift
  echo; echo "### [t=$((SECONDS - T0)) s] $*"
  local t=$SECONDS
  timeout -k 10 "$to" "$@"; local rc=$?
  echo "### rc=$rc in $((SECONDS - t)) s"
}
left() { local l=$(( BUDGET - (SECONDS - T0) )); echo $(( l > 30 ? l : 30 )); }
