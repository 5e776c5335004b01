# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The CPU build of torch; a version range would pull the CUDA build and its packages.
TORCH_PIN ?= torch==2.13.0

.PHONY: install sandbox demo test bench clean

$(STAMP): pyproject.toml plugins/genesys-countdown/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[dev]' -e plugins/genesys-countdown
	touch $(STAMP)

install: $(STAMP)

# Code sandboxes: bubblewrap, a Docker daemon and the offline image. Never fails the build; the
# tests that need what could not be set up skip and say why.
sandbox: install
	@bash genesys/sandbox/ci_setup.sh $(PY)

demo: install sandbox
	$(VENV)/bin/genesys plugins
	$(VENV)/bin/genesys verify genesys/tasks/data/sample_rollouts.jsonl -o demo-out/verified.jsonl
	@echo "verified rollouts: demo-out/verified.jsonl"
	$(VENV)/bin/genesys filter demo-out/verified.jsonl -o demo-out/tasks.jsonl --min-pass-rate 0.1 --max-pass-rate 0.9
	$(VENV)/bin/genesys report demo-out/verified.jsonl -o demo-out/report
	@echo "tasks of useful difficulty: demo-out/tasks.jsonl; report: demo-out/report/summary.md"

test: install sandbox
	$(VENV)/bin/pytest -q -ra

bench: install
	$(PY) benchmarks/verify_engine.py
	$(PY) benchmarks/filter_speed.py

clean:
	rm -rf $(VENV) demo-out
