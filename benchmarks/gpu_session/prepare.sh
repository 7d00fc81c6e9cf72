#!/usr/bin/env bash
# Here (no GPU needed), from the project root: fill the git-ignored .gpu/ that a GPU session carries.
#   bash benchmarks/gpu_session/prepare.sh
# - the offline wheels of ../shared/gpu/bundle.sh (mace-torch and what it needs, cuEquivariance);
# - pytest and its dependencies (the CUDA tests run there; the GPU image has no package registry)
#   and setuptools >= 77 (the project's build needs it; the image's may be older);
# - ../shared/gpu/setup.sh and env.sh (only the checkout travels, not ../shared), and
#   setup_nocuda.sh: the same set-up without the C++ CUDA kernels (Triton only; ~1 min less).
# Then on the GPU machine, one call per script, two per session (docs/gpu.md, "A GPU session"):
#   run(command="bash benchmarks/gpu_session/1_layers_edge_tiles.sh", carry=[".gpu"], timeout_s=400)
set -euo pipefail
SHARED=${SHARED:-../shared/gpu}
bash "$SHARED/bundle.sh" .gpu
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps $PLAT -d .gpu/whl pytest pytest-timeout iniconfig pluggy packaging pygments \
    'setuptools>=77'  # the build's (pyproject.toml's SPDX license); /tmp/site shadows the image's
cp "$SHARED/setup.sh" "$SHARED/env.sh" .gpu/
# setup_nocuda.sh: no CFM_PLUGINS_CUDA build; it marks its build so that setup.sh rebuilds with CUDA
sed -e 's/CFM_PLUGINS_CUDA=1 CFM_PLUGINS_CUDA_ARCH=\$ARCH/CFM_PLUGINS_CUDA=0/' \
    -e 's/built with CUDA (sm_\$ARCH)/built without CUDA kernels (Triton backend only)/' \
    -e 's|if \[ "$(cat /tmp/proj/.built 2>/dev/null)" != "$src" \]; then|if [ "$(cat /tmp/proj/.built 2>/dev/null)" != "$src nocuda" ] \&\& [ "$(cat /tmp/proj/.built 2>/dev/null)" != "$src" ]; then|' \
    -e 's|  echo "$src" > /tmp/proj/.built|  echo "$src nocuda" > /tmp/proj/.built|' .gpu/setup.sh > .gpu/setup_nocuda.sh
grep -q 'CFM_PLUGINS_CUDA=0' .gpu/setup_nocuda.sh && grep -q '"$src nocuda" > /tmp/proj/.built' .gpu/setup_nocuda.sh \
  || { echo "prepare.sh: ../shared/gpu/setup.sh changed; setup_nocuda.sh could not be derived from it" >&2; exit 1; }
du -sh .gpu
