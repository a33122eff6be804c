# Two entry points (see README): `make quickstart` and `make test`. Each creates .venv and installs
# what it needs; the CPU build of torch 2.13.0 is installed first so that no CUDA build is pulled.
# Bytecode is compiled at install, but by compileall on every core rather than by pip on one: 47 s of
# install + 37 s of compiling instead of pip's 102 s on 2 cores (2026-12-03). Without compiled
# bytecode the suite's first Ray runs compiled torch/transformers/ray at once in every process and
# missed their deadlines on 2 cores. (compileall's exit status is not checked: like pip, it leaves
# a file that does not compile as it is, e.g. torch's Python 3.12 test helper under 3.11.)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile torch==2.13.0
	$(PY) -m pip install -q --no-compile -e '.[test]'
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $@

.PHONY: install quickstart test
install: $(VENV)/.installed

quickstart: $(VENV)/.installed
	$(VENV)/bin/rayft train examples/quickstart.yaml

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -n 2 --durations=15
