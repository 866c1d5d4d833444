# Trainyard: the two README commands (run, test) plus lint and bench.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed

.PHONY: run test check lint bench install clean web types wheelhouse gpu-check

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; set PYTHON=/path/to/python3.11"; exit 1; }
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The whole service on this machine; trains the example through it, then serves until Ctrl-C.
run: $(STAMP)
	$(BIN)/trainyard up --submit examples/mnist1d_cnn.yaml

# The browser tests (tests/web) need Debian's Chromium, the Spark tests a Java runtime: installed
# here when missing and allowed. Two pytest-xdist workers, each file whole on one of them and
# the heaviest first (tests/conftest.py's docstring); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	bash scripts/ensure-apt.sh /usr/bin/chromium "chromium fonts-liberation" "The browser tests (tests/web)"
	bash scripts/ensure-apt.sh java default-jre-headless "The Spark tests (tests/trainyard/test_spark.py)"
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The fast tier, for the edit loop: the unit tests, without a stack, a cluster, several training
# processes, a browser or test hosts (every test marked slow, e2e, hosts or gpu is left out;
# tests/conftest.py marks those that start a stack). `make test` runs everything.
check: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not slow and not e2e and not hosts and not gpu"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/submit_latency.py
	$(BIN)/python bench/api_load.py

# Wheels for the lent GPU machines (Python 3.12, no package registry there): what their image
# lacks (bench/gpu_wheels.txt), carried with the tree (64 MiB in all) by the run of
# bench/gpu_check.sh. Pinned to this environment's versions.
WHEELHOUSE := .wheelhouse
wheelhouse: $(STAMP)
	rm -rf $(WHEELHOUSE)
	$(BIN)/python scripts/gpu_wheel_pins.py bench/gpu_wheels.txt > $(VENV)/gpu-wheels.pinned
	$(PIP) download --quiet --no-deps --dest $(WHEELHOUSE) --python-version 3.12 \
		--implementation cp --only-binary=:all: --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
		-r $(VENV)/gpu-wheels.pinned
	@du -sh $(WHEELHOUSE)

# On a lent GPU machine: the GPU tests and figures (bench/gpu_check.sh; --dry-run here).
gpu-check:
	bash bench/gpu_check.sh

# Regenerate the clients' types (trainyard/models.py, web/src/types.gen.ts) from the API's schemas.
types: $(STAMP)
	$(BIN)/python scripts/gen_types.py

# Rebuild the dashboard's committed assets (web/dist) from web/src; needs node and npm.
web:
	cd web && npm ci && npm run build

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
