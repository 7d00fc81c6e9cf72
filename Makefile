# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the fast tests;
# `make test-all` runs every test). Both create or refresh .venv/ with everything needed; quick when
# it is already up to date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.cfm-installed
SOURCES := pyproject.toml setup.py $(shell find cuda -name '*.cpp' -o -name '*.h' -o -name '*.cu' 2>/dev/null)
TORCH_VERSION ?= 2.13.0
# the triton torch 2.13's CUDA wheels pin (2.14.1: 3.8.0, 2.15.0: 3.9.0; the [test] extra takes any
# >= 3.7); none where it has no wheels
TRITON_VERSION ?= 3.7.1
TRITON_PIN := $(if $(filter Linux,$(shell uname -s)),triton==$(TRITON_VERSION))
# HydraGNN 3.0 shares .venv with mace (no pin conflicts); --no-deps: its metadata asks for
# torch-scatter/torch-sparse, which the stacks we use do not import and which have no torch 2.13 wheels.
HYDRAGNN_VERSION ?= 3.0
# pytest workers (pytest-xdist), each test file on one worker so its module fixtures are built once:
# 2 takes the main suite from about 18.6 to 13.2 min on 2 cores; TEST_JOBS=0 runs in one process
TEST_JOBS ?= 2
# --max-worker-restart=1: a second test stuck past faulthandler_timeout ends the run
# (tests/helpers/stuck_tests.py); --durations=20 lists the slowest tests at the end of each suite
PYTEST_ARGS := -q -rs -n $(TEST_JOBS) --dist loadfile --max-worker-restart=1 --durations=20
# `make test` leaves out what the cost markers mark (set in one table in tests/conftest.py, declared in
# pyproject.toml) but keeps `fast` (one short 2-rank MACE run); `make test-all` leaves out nothing
FAST_TESTS := -m "fast or not (mpi or trainer or compile or interpreter or bench or slow)"
TEST_SELECT ?= $(FAST_TESTS)

.PHONY: venv lint docs-check demo test test-all cuda-check triton-check bench clean venv-nequip test-nequip demo-nequip bench-nequip demo-hydragnn \
	test-hydragnn venv-hydragnn-src test-hydragnn-src bench-hydragnn-src

venv: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	@# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
	$(PIP) install -q torch==$(TORCH_VERSION) $(TRITON_PIN)
	@# --no-build-isolation: the C++ operators build against this torch (its C++ ABI is per release)
	$(PIP) install -q --no-build-isolation -e '.[mace,hydragnn,mpi,test,plot,plan,lint]'
	$(PIP) install -q --no-deps HydraGNN==$(HYDRAGNN_VERSION)
	@touch $@

demo: venv
	$(PY) examples/demo.py

# the wheel as a cluster user installs it (docs/install.md): `python -m build --no-isolation --wheel`
# against .venv's torch, installed with --no-deps into a fresh venv holding only torch and the plain
# dependencies, where one fused kernel runs against plain torch (tools/wheel_check.sh; in .ci/run);
# WHEEL_CUDA=1 also compiles the CUDA kernels into it (sm_80, sm_90) where nvcc is found
WHEEL_CUDA ?=
.PHONY: wheel-check
wheel-check: venv
	PY=$(PY) TORCH_VERSION=$(TORCH_VERSION) CUDA=$(WHEEL_CUDA) bash tools/wheel_check.sh

# ruff's lint and format check over the tree, then the import contracts (layers, no circles, no
# adapter in the core) with import-linter; both configured in pyproject.toml
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

# every command and snippet of README, CONTRIBUTING and docs/ run as a user would (tiny settings, in
# .venv and, where they exist, .venv-nequip and .venv-hydragnn), and every relative link and anchor
docs-check: venv
	$(PY) -m tools.docs_check

# the fast suite in .venv: every module, the kernels' gradchecks at small sizes, one short 2-rank MACE
# run; no other mpirun job, trainer run, compile, whole model in the Triton interpreter or benchmark run
test: venv
	$(PY) -m pytest $(PYTEST_ARGS) $(TEST_SELECT)

# everything: the main suite whole (in .venv the NequIP and HydraGNN-from-source tests skip, saying so),
# the NequIP suite in .venv-nequip, the HydraGNN-from-source suite in .venv-hydragnn (when
# ../shared/deps is there) and the docs check (what .ci/run runs)
test-all: venv
	$(MAKE) test TEST_SELECT=
	$(MAKE) test-nequip
	$(MAKE) test-hydragnn-src
	$(MAKE) docs-check

# the HydraGNN tests: the adapter, the structural finder on a HydraGNN model, the example's data set
# and demo (`make test-all` runs them too: HydraGNN lives in .venv)
test-hydragnn: venv
	$(PY) -m pytest $(PYTEST_ARGS) tests/adapters/hydragnn tests/ops/test_patching.py tests/datasets/test_clusters.py \
	    tests/examples/hydragnn

# HydraGNN on 2 MPI ranks with and without binpack: LIF of both from HydraGNN's step timings, PNG
demo-hydragnn: venv
	$(PY) examples/hydragnn/demo.py

# CUDA kernels compile for sm_80 and sm_90 with the machine's nvcc (nothing runs without a GPU).
cuda-check: venv
	@command -v nvcc >/dev/null || { echo "nvcc not found: skipping the CUDA compile check"; exit 0; }; \
	CFM_PLUGINS_CUDA=1 CFM_PLUGINS_CUDA_ARCH="80;90" $(PY) setup.py -q build_ext \
	    --build-lib build/cuda-check --build-temp build/cuda-check-tmp && \
	ls build/cuda-check/cfm_plugins/ | grep -q _C_cuda && echo "CUDA kernels compiled and registered for sm_80 and sm_90"

# Triton kernels compile ahead of time (no GPU needed) for sm_80, sm_90, gfx90a and gfx942: every generated
# kernel of the MACE-MP-medium layer in every tile config, registers and spills printed; fails on a compile
# error or on spills in a default config. Writes out/tools/triton_check.md (~20 min on 2 busy cores).
triton-check: venv
	$(PY) -m tools.triton_check --jobs 2

# the [bench] extra (cuEquivariance, the kernels' peer) of the checkout installed in .venv, without rebuilding it
BENCH_STAMP := $(VENV)/.cfm-bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q 'cfm-plugins[bench]'
	@touch $@

# the CPU benchmarks; each prints its tables and writes its record to out/benchmarks/ (benchmarks/record.py)
bench: $(BENCH_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.sampler
	$(PY) -m benchmarks.kernels
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.mace_train

# NequIP needs e3nn 0.6 and mace-torch pins 0.4.4: NequIP gets its own environment, .venv-nequip/
# (torch pinned first, then the [nequip] extra, which does not pull mace; the CPU kernels build there too).
VENV_NEQUIP := .venv-nequip
PY_NEQUIP := $(VENV_NEQUIP)/bin/python
PIP_NEQUIP := $(PY_NEQUIP) -m pip --disable-pip-version-check
STAMP_NEQUIP := $(VENV_NEQUIP)/.cfm-installed

venv-nequip: $(STAMP_NEQUIP)

$(STAMP_NEQUIP): $(SOURCES)
	@test -x $(PY_NEQUIP) || $(PYTHON) -m venv $(VENV_NEQUIP)
	$(PIP_NEQUIP) install -q --upgrade pip setuptools wheel
	$(PIP_NEQUIP) install -q torch==$(TORCH_VERSION) $(TRITON_PIN)
	CFM_PLUGINS_REUSE_LIBRARY=1 $(PIP_NEQUIP) install -q --no-build-isolation -e '.[nequip,mpi,test]'
	@touch $@

# the NequIP tests (real nequip-train under real mpirun -np 2); `make test-all` runs them too
test-nequip: venv-nequip
	$(PY_NEQUIP) -m pytest $(PYTEST_ARGS) tests/adapters/nequip tests/datasets/test_nequip_config.py

demo-nequip: venv-nequip
	$(PY_NEQUIP) examples/demo_nequip.py

bench-nequip: venv-nequip
	OMP_NUM_THREADS=1 $(PY_NEQUIP) -m benchmarks.nequip_train

# HydraGNN from source (its MACE stack, MACEStack): .venv-hydragnn/, beside .venv/ where HydraGNN 3.0 lives
# (the two cannot share the name `hydragnn`). Made from what no registry serves, in $(HYDRAGNN_DEPS)
# (../shared/deps beside the checkout, as in CI): HydraGNN's source tarball, unpacked and put on the path
# with a .pth file (its setup.py leaves subpackages out of a wheel), and a torch-scatter wheel built for
# torch $(TORCH_VERSION)+cpu / CPython 3.11. Then e3nn 0.5.1 (HydraGNN's pin; mace is not installed
# here) and vesin from the index. Without $(HYDRAGNN_DEPS) the targets say so and do nothing.
HYDRAGNN_DEPS ?= ../shared/deps
HYDRAGNN_TARBALL = $(firstword $(wildcard $(HYDRAGNN_DEPS)/HydraGNN-*.tar.gz))
TORCH_SCATTER_WHEEL = $(firstword $(wildcard $(HYDRAGNN_DEPS)/torch_scatter-*.whl))
HYDRAGNN_E3NN ?= 0.5.1
VENV_HG := .venv-hydragnn
PY_HG := $(VENV_HG)/bin/python
PIP_HG := $(PY_HG) -m pip --disable-pip-version-check
STAMP_HG := $(VENV_HG)/.cfm-installed
# the HydraGNN-from-source tests (the MACE stack fused, trained under mpirun, its benchmark's plumbing)
HG_SRC_TESTS := tests/adapters/hydragnn/test_interaction.py tests/adapters/hydragnn/test_adapter_mace.py tests/adapters/hydragnn/test_loader.py \
    tests/adapters/hydragnn/test_node_budget.py tests/benchmarks/test_hydragnn_samplers.py \
    tests/plan/test_peer_samplers_hydragnn.py

ifeq ($(HYDRAGNN_TARBALL),)
venv-hydragnn-src test-hydragnn-src bench-hydragnn-src:
	@echo "$(HYDRAGNN_DEPS) has no HydraGNN-*.tar.gz: HydraGNN from source (MACEStack) is not installed and its tests"
	@echo "are skipped (set HYDRAGNN_DEPS=DIR to a folder holding the tarball and the torch-scatter wheel)"
else
venv-hydragnn-src: $(STAMP_HG)

$(STAMP_HG): $(SOURCES) $(HYDRAGNN_TARBALL) $(TORCH_SCATTER_WHEEL)
	@test -n "$(TORCH_SCATTER_WHEEL)" || { echo "$(HYDRAGNN_DEPS) has no torch_scatter-*.whl"; exit 1; }
	@test -x $(PY_HG) || $(PYTHON) -m venv $(VENV_HG)
	$(PIP_HG) install -q --upgrade pip setuptools wheel
	$(PIP_HG) install -q torch==$(TORCH_VERSION) $(TRITON_PIN)
	CFM_PLUGINS_REUSE_LIBRARY=1 $(PIP_HG) install -q --no-build-isolation -e '.[hydragnn,mpi,test]'
	$(PIP_HG) install -q $(TORCH_SCATTER_WHEEL) vesin e3nn==$(HYDRAGNN_E3NN)
	rm -rf $(VENV_HG)/src && mkdir -p $(VENV_HG)/src && tar -xzf $(HYDRAGNN_TARBALL) -C $(VENV_HG)/src
	@src=$$(cd $(VENV_HG)/src/* && pwd); site=$$($(PY_HG) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	    echo "$$src" > "$$site/hydragnn-source.pth" && echo "HydraGNN source on the path: $$src"
	$(PY_HG) -c 'import hydragnn.models.MACEStack, torch_scatter, vesin'
	@touch $@

test-hydragnn-src: venv-hydragnn-src
	$(PY_HG) -m pytest $(PYTEST_ARGS) $(HG_SRC_TESTS)

# HydraGNN's MACE stack, epoch time on 2 ranks: stock, binpack, fused, both; then HydraGNN's
# node-budget sampler against binpack (under the benchmark lock)
bench-hydragnn-src: venv-hydragnn-src
	flock /tmp/cfm-bench.lock env OMP_NUM_THREADS=1 $(PY_HG) -m benchmarks.hydragnn_mace
	flock /tmp/cfm-bench.lock env OMP_NUM_THREADS=1 $(PY_HG) -m benchmarks.hydragnn_samplers
endif

clean:
	rm -rf build examples/out *.egg-info cfm_plugins/*.so
