# The README's two commands: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHARED_DATA ?= ../shared/data/openb

.PHONY: demo test lint openapi system-deps bench clean

# The JupyterLab extension's sources: editing one re-runs the install, whose build hook
# (hatch-jupyter-builder: jlpm install + build) rebuilds the panel into the venv. The panel's
# TypeScript types are generated from the OpenAPI file, so it counts as a source.
LAB_SOURCES := labextension/package.json jupyter_gpusched/server/openapi.yaml \
	$(filter-out labextension/src/openapi.ts,$(wildcard labextension/src/*.ts labextension/style/*))

$(STAMP): pyproject.toml $(LAB_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	rm -rf jupyter_gpusched/labextension
	# [test] includes [server] (the Jupyter host's dependencies) and what the tests build with
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

## Start the embedded simulated cluster and run a short workload end to end.
demo: $(STAMP)
	$(BIN)/jupyter-gpusched demo

## What the tests use for real peers: PostgreSQL, OpenSSH, Chromium, configurable-http-proxy.
system-deps:
	bash scripts/system-deps.sh

# pytest-xdist workers per session. Most tests wait on subprocesses, sockets and kernels, so
# more workers than cores pay. Whole modules go to a worker (their fixtures start once), the
# longest first (tests/conftest.py orders them). TEST_WORKERS=0 runs a session in one process.
TEST_WORKERS ?= 4
PYTEST_XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

## Set up, lint and run every test: two pytest sessions (see tests/conftest.py for why).
test: $(STAMP) system-deps
	$(BIN)/ruff check jupyter_gpusched tests bench
	$(BIN)/ruff format --check jupyter_gpusched tests bench
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PY) -m pytest $(PYTEST_XDIST) --durations=25
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PY) -m pytest $(PYTEST_XDIST) --durations=10 \
		-p pytest_jupyter.jupyter_server tests/inproc

## Regenerate the OpenAPI file from the API's pydantic models (a test fails while it is stale).
openapi: $(STAMP)
	$(PY) -m jupyter_gpusched.server.openapi > jupyter_gpusched/server/openapi.yaml

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpusched tests bench
	$(BIN)/ruff format --check jupyter_gpusched tests bench

bench: $(STAMP)
	$(PY) bench/packer.py --data $(SHARED_DATA)

clean:
	rm -rf $(VENV) build dist *.egg-info
