# Two commands on a fresh machine:  `make demo` (the main job)  and  `make test` (the tests).
# Both create or refresh .venv/ with everything needed; quick when it is already up to date.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.cfm-installed
SOURCES := pyproject.toml setup.py $(shell find cuda -name '*.cpp' -o -name '*.h' -o -name '*.cuh' -o -name '*.cu' 2>/dev/null)
TORCH_VERSION ?= 2.13.0

.PHONY: venv demo test test-fast cuda-check bench clean

venv: $(STAMP)

$(STAMP): $(SOURCES)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	@# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build
	$(PIP) install -q torch==$(TORCH_VERSION)
	@# --no-build-isolation: the C++ operators build against this torch (its C++ ABI is per release)
	$(PIP) install -q --no-build-isolation -e '.[mace,mpi,test,plot]'
	@touch $@

demo: venv
	$(PY) examples/demo.py

test: venv
	$(PY) -m pytest -q -rs

# CUDA kernels compile for sm_80 and sm_90 with the machine's nvcc (nothing runs without a GPU).
cuda-check: venv
	@command -v nvcc >/dev/null || { echo "nvcc not found: skipping the CUDA compile check"; exit 0; }; \
	CFM_PLUGINS_CUDA=1 CFM_PLUGINS_CUDA_ARCH="80;90" $(PY) setup.py -q build_ext \
	    --build-lib build/cuda-check --build-temp build/cuda-check-tmp && \
	ls build/cuda-check/cfm_plugins/ | grep -q _C_cuda && echo "CUDA kernels compiled and registered for sm_80 and sm_90"

bench: venv
	$(PIP) install -q cuequivariance-torch==0.13.0 cuequivariance==0.13.0
	OMP_NUM_THREADS=1 $(PY) benchmarks/sampler.py
	$(PY) benchmarks/kernels.py
	OMP_NUM_THREADS=1 $(PY) benchmarks/mace_train.py

clean:
	rm -rf build examples/out *.egg-info cfm_plugins/*.so
