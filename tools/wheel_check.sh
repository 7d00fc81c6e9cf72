#!/usr/bin/env bash
# The wheel as a cluster user installs it (docs/install.md): built with `python -m build
# --no-isolation --wheel` against .venv's torch (the C++ operators compile), then installed with
# --no-deps into a fresh venv that has only torch and the wheel's plain dependencies; there the
# operator library loads and one fused kernel (cfm::conv_tp_fwd, forward and gradients) matches its
# stock counterpart, plain torch's gather, product and index_add. `make wheel-check` runs it (CI:
# .ci/run). PY: the Python that builds (default .venv/bin/python); TORCH_VERSION: the fresh venv's
# torch (default 2.13.0, the Makefile's); KEEP=1 keeps the work folder (printed); CUDA=1 (where nvcc
# is found) also builds the CUDA kernels into the wheel for sm_80 and sm_90 and checks they are in it
# (the CUDA compile check of `make cuda-check`, without compiling the CPU library a second time).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# a compile that fails fails the check (no wheel without its operators)
export CFM_PLUGINS_REQUIRE_BUILD=1
work=$(mktemp -d "${TMPDIR:-/tmp}/cfm-wheel-check.XXXXXX")
if [[ ${KEEP:-} == 1 ]]; then echo "work folder: $work"; else trap 'rm -rf "$work"' EXIT; fi
start=$SECONDS
# a step's output goes to a log, shown when it fails
quiet() { "$@" >>"$work/steps.log" 2>&1 || { tail -40 "$work/steps.log"; return 1; }; }

# the checkout's files (tracked and new ones, not the ignored build/, .so or venvs), so that nothing
# of the editable install or an earlier build goes into the wheel
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [[ -e $f ]]; then printf '%s\0' "$f"; fi; done |
    tar --null -T - -cf - | tar -xf - -C "$work/src"
cuda=0
if [[ ${CUDA:-} == 1 ]]; then
    if command -v nvcc >/dev/null; then cuda=1; else echo "nvcc not found: the wheel has no CUDA kernels"; fi
fi
CFM_PLUGINS_CUDA=$cuda CFM_PLUGINS_CUDA_ARCH="80;90" \
    quiet "$PY" -m build --no-isolation --wheel --outdir "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/cfm_plugins-*.whl)
echo "built $(basename "$wheel") in $((SECONDS - start)) s"
if [[ $cuda == 1 ]]; then
    "$PY" -c 'import sys, zipfile; sys.exit(not any(n.startswith("cfm_plugins/_C_cuda")
                                                for n in zipfile.ZipFile(sys.argv[1]).namelist()))' \
        "$wheel" || { echo "the wheel has no cfm_plugins/_C_cuda library"; exit 1; }
    echo "CUDA kernels compiled for sm_80 and sm_90 and in the wheel"
fi

# a fresh venv of the same Python: torch first, then the wheel without its dependencies and those
"$PY" -m venv "$work/venv" # on the base interpreter, not inside .venv
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check -q)
quiet "${pip[@]}" install "torch==$TORCH_VERSION"
quiet "${pip[@]}" install --no-deps "$wheel"
quiet "${pip[@]}" install numpy pluggy pyyaml
quiet "${pip[@]}" check # the wheel's declared dependencies are all there

cd "$work" # not the checkout: the package is imported from the venv
quiet "$work/venv/bin/cfm-run" --list
"$work/venv/bin/python" - <<'EOF'
import sys

import torch

import cfm_plugins
from cfm_plugins.ops.descriptors import conv_tp

assert cfm_plugins.__file__.startswith(sys.prefix), f"imported from {cfm_plugins.__file__}"
print("operator library:", *cfm_plugins.load_library())
# one channelwise tensor product with its scatter: 8 scalar channels, one weighted uvu path
desc, _ = conv_tp.build([(8, 0)], [(1, 0)], [(8, 0)], [(0, 0, 0, "uvu", True, 1.0)], lambda *_: [[[1.0]]])
tables = [
    [torch.as_tensor(ints, dtype=torch.int32), torch.as_tensor(coef, dtype=torch.float64)]
    for ints, coef in (desc.packed(), desc.transpose().packed())
]
gen = torch.Generator().manual_seed(0)
nodes, edges = 5, 12
sender, receiver = torch.randint(0, nodes, (2, edges), generator=gen)
bounds = torch.arange(nodes + 1)
rperm, sperm = torch.argsort(receiver, stable=True), torch.argsort(sender, stable=True)
graph = [sender, receiver, rperm, torch.searchsorted(receiver[rperm], bounds),
         sperm, torch.searchsorted(sender[sperm], bounds)]  # the operator's edge groupings
x, y, w = (torch.randn(n, c, dtype=torch.float64, generator=gen, requires_grad=True)
           for n, c in ((nodes, 8), (edges, 1), (edges, 8)))
fused = torch.ops.cfm.conv_tp_fwd(x, y, w, graph, *tables, desc.meta())
stock = torch.zeros(nodes, 8, dtype=torch.float64).index_add(0, receiver, x[sender] * y * w)
torch.testing.assert_close(fused, stock)
g = torch.randn(nodes, 8, dtype=torch.float64, generator=gen)
for a, b in zip(torch.autograd.grad(fused, (x, y, w), g), torch.autograd.grad(stock, (x, y, w), g)):
    torch.testing.assert_close(a, b)
print(f"cfm::conv_tp_fwd matches plain torch (forward and gradients), torch {torch.__version__}")
EOF
echo "wheel check passed in $((SECONDS - start)) s"
