# Trainyard: the two README commands (run, test) plus lint and bench.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed

.PHONY: run test lint bench install clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/trainyard train examples/mnist1d_cnn.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
