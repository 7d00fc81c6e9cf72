# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the tests).
# Both create or refresh .venv/ with everything needed; quick when it is already up to date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.cfm-installed
SOURCES := pyproject.toml setup.py $(shell find cuda -name '*.cpp' -o -name '*.h' -o -name '*.cu' 2>/dev/null)
TORCH_VERSION ?= 2.13.0
# HydraGNN 3.0 shares .venv with mace (no pin conflicts); --no-deps: its metadata asks for
# torch-scatter/torch-sparse, which the stacks we use do not import and which have no torch 2.13 wheels.
HYDRAGNN_VERSION ?= 3.0

.PHONY: venv demo test cuda-check bench clean venv-nequip test-nequip demo-nequip bench-nequip demo-hydragnn test-hydragnn

venv: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	@# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
	$(PIP) install -q torch==$(TORCH_VERSION)
	@# --no-build-isolation: the C++ operators build against this torch (its C++ ABI is per release)
	$(PIP) install -q --no-build-isolation -e '.[mace,hydragnn,mpi,test,plot]'
	$(PIP) install -q --no-deps HydraGNN==$(HYDRAGNN_VERSION)
	@touch $@

demo: venv
	$(PY) examples/demo.py

# the main suite in .venv (the NequIP tests skip there, saying so), then the NequIP suite in .venv-nequip
test: venv
	$(PY) -m pytest -q -rs
	$(MAKE) test-nequip

# the HydraGNN tests: the adapter, the structural finder on a HydraGNN model, the example's data set
# and demo (they also run in `make test`: HydraGNN lives in .venv)
test-hydragnn: venv
	$(PY) -m pytest -q -rs tests/adapters/hydragnn tests/ops/test_patching.py tests/datasets/test_clusters.py \
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

# the [bench] extra (cuEquivariance, the kernels' peer) of the checkout installed in .venv, without rebuilding it
BENCH_STAMP := $(VENV)/.cfm-bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q 'cfm-plugins[bench]'
	@touch $@

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
	$(PIP_NEQUIP) install -q torch==$(TORCH_VERSION)
	$(PIP_NEQUIP) install -q --no-build-isolation -e '.[nequip,mpi,test]'
	@touch $@

# the NequIP tests (real nequip-train under real mpirun -np 2); `make test` runs them too
test-nequip: venv-nequip
	$(PY_NEQUIP) -m pytest -q -rs tests/adapters/nequip tests/datasets/test_nequip_config.py

demo-nequip: venv-nequip
	$(PY_NEQUIP) examples/demo_nequip.py

bench-nequip: venv-nequip
	OMP_NUM_THREADS=1 $(PY_NEQUIP) -m benchmarks.nequip_train

clean:
	rm -rf build examples/out *.egg-info cfm_plugins/*.so
