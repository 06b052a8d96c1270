# The README's two commands: `make demo` and `make test`. Both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHARED_DATA ?= ../shared/data/openb

.PHONY: demo test lint system-deps bench clean

# The JupyterLab extension's sources: editing one re-runs the install, whose build hook
# (hatch-jupyter-builder: jlpm install + build) rebuilds the panel into the venv.
LAB_SOURCES := labextension/package.json $(wildcard labextension/src/*.ts labextension/style/*)

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

## System packages the tests use for real peers (PostgreSQL, OpenSSH, Chromium).
system-deps:
	bash scripts/system-deps.sh

## Set up, lint and run every test: two pytest sessions (see tests/conftest.py for why).
test: $(STAMP) system-deps
	$(BIN)/ruff check jupyter_gpusched tests bench
	$(BIN)/ruff format --check jupyter_gpusched tests bench
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PY) -m pytest
	PATH="$(CURDIR)/$(BIN):$$PATH" $(PY) -m pytest -p pytest_jupyter.jupyter_server tests/inproc

lint: $(STAMP)
	$(BIN)/ruff check jupyter_gpusched tests bench
	$(BIN)/ruff format --check jupyter_gpusched tests bench

bench: $(STAMP)
	$(PY) bench/packer.py --data $(SHARED_DATA)

clean:
	rm -rf $(VENV) build dist *.egg-info
