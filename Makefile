# Set-up and everyday commands. `make serve` and `make test` work on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: serve test lint bench-online clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

serve: $(BIN)/.installed  ## install, then start the service on its default model
	$(BIN)/conveyor serve

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(BIN)/.installed lint  ## install, lint, type-check, run every test
	$(BIN)/pytest

bench-online: $(BIN)/.installed
	$(BIN)/python -m bench.online

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
