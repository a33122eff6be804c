# Two entry points (see README): `make quickstart` and `make test`. Each creates .venv and installs
# what it needs; the CPU build of torch 2.13.0 is installed first so that no CUDA build is pulled.
# Bytecode is compiled at install (pip's default): with --no-compile the install took 61 s instead
# of 143, but the suite's first Ray runs then compiled torch/transformers/ray at once in every
# process and missed their deadlines on 2 cores.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

.PHONY: install quickstart test
install: $(VENV)/.installed

quickstart: $(VENV)/.installed
	$(VENV)/bin/rayft train examples/quickstart.yaml

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -n 2 --durations=15
