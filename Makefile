# Two entry points (see README): `make quickstart` and `make test`. Each creates .venv and installs
# what it needs; the CPU build of torch 2.13.0 is installed first so that no CUDA build is pulled.
# Bytecode: pip installs without compiling (--no-compile), and Python writes the bytecode of what is
# imported, once, into the venv's __pycache__ folders (PYTHONDONTWRITEBYTECODE, which this machine's
# environment sets, is cleared for our own venv's commands). The modules every Ray worker, driver and
# test process imports are compiled at install by warm-up imports side by side. Before (2026-12-03):
# compileall over the whole venv (27,000 files, 91 CPU-s, 37 s on 2 cores) for the 8,900 that a
# whole `make test` imports (counted after one). Without any bytecode, every process compiled
# torch, transformers and ray afresh, and the suite's first Ray runs missed their deadlines on 2 cores.
# The install: pip takes torch (its CPU build lies on this machine's disk, where uv does not look) and uv,
# then uv the rest: 14 s against pip's 61 s for the same 210 packages (2026-12-04, 2 cores, the same
# versions installed either way). uv reads only its own settings: the machine's pip ones (extra indexes,
# find-links, an index mirror) are passed on, and like pip it takes the best match over all indexes.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
PIP_CONF = $$($(PY) -m pip config get global.$(1) 2>/dev/null)
PIP_SETTINGS_FOR_UV = UV_DEFAULT_INDEX="$(call PIP_CONF,index-url)" UV_EXTRA_INDEX_URL="$(call PIP_CONF,extra-index-url)" UV_FIND_LINKS="$(call PIP_CONF,find-links)"
# our venv's commands with bytecode writing on (see above)
RUN := env -u PYTHONDONTWRITEBYTECODE
# what the warm-up imports: the worker and driver side, and the Ray daemons and test services; Ray's runtime-env
# agent alone in a process: importing it puts Ray's bundled aiohttp first on sys.path for what follows
WARM_AGENT := ray._private.runtime_env.agent.main
WARM_A := rayft.train.loop, rayft.train.driver, rayft.cli, ray.train.torch, ray.data, ray._private.workers.default_worker
WARM_B := ray.dashboard.agent, ray.dashboard.dashboard, ray._private.log_monitor, ray.autoscaler._private.monitor, ray.dashboard.modules.job.job_head, ray.dashboard.modules.reporter.reporter_agent, ray.job_submission, mlflow, lm_eval, moto.server, datasets, tensorboard, wandb, matplotlib.pyplot

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile torch==2.13.0 uv==0.13.9
	$(PIP_SETTINGS_FOR_UV) UV_INDEX_STRATEGY=unsafe-best-match $(VENV)/bin/uv pip install -q --python $(PY) -e '.[test]'
	{ $(RUN) $(PY) -c 'import $(WARM_A)' && $(RUN) $(PY) -c 'import $(WARM_AGENT)'; } & $(RUN) $(PY) -c 'import $(WARM_B)'; s=$$?; wait $$! && exit $$s
	touch $@

.PHONY: install quickstart test
install: $(VENV)/.installed

quickstart: $(VENV)/.installed
	$(RUN) $(VENV)/bin/rayft train examples/quickstart.yaml

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(RUN) $(PY) -m pytest -q -n 2 --durations=15
