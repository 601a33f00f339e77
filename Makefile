# Parley — developer entry points. Each target creates .venv on first use.
#   make run    set up and start the app (a demo checkpoint is generated when no real one is configured)
#   make test   set up everything the tests need and run them: ruff, mypy (strict: app/, engine/ and ui/), pytest (what CI runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q
RUN_STAMP := $(VENV)/.stamp-run
TEST_STAMP := $(VENV)/.stamp-test

.PHONY: run test lint bundle clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# On Linux with a usable NVIDIA GPU and driver, MLX's CUDA 13 build (the cuda extra); otherwise the CPU build,
# with one line saying why (app/cuda_check.py).
$(RUN_STAMP): pyproject.toml app/cuda_check.py | $(BIN)/python
	packaging/system-deps.sh run
	$(PIP) install -e "$$($(BIN)/python app/cuda_check.py --pip-target)"
	touch $@

$(TEST_STAMP): $(RUN_STAMP) tests/requirements-parity.txt tests/requirements-parity-deps.txt
	packaging/system-deps.sh test
	$(PIP) install -e ".[test,bundle]"
	$(PIP) install --no-deps -r tests/requirements-parity.txt
	$(PIP) install -r tests/requirements-parity-deps.txt
	touch $@

run: $(RUN_STAMP)
	$(BIN)/parley

test: $(TEST_STAMP)
	$(BIN)/ruff check app engine ui tests
	$(BIN)/mypy
	$(BIN)/python -m pytest

# Linux: dist/Parley/ (run dist/Parley/parley); macOS: dist/Parley.app. See packaging/README.md.
bundle: $(RUN_STAMP)
	$(PIP) install -e ".[bundle]"
	$(BIN)/python -m PyInstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build packaging/parley.spec

lint: $(TEST_STAMP)
	$(BIN)/ruff check app engine ui tests
	$(BIN)/ruff format --check app engine ui tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache
