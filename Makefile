# ferrodyn — `make help` lists the targets. Set-up is idempotent: a second run does no work.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PY311 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.11.*/bin/python3.11) $(shell command -v python3.11))
PY312 ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12.*/bin/python3.12) $(shell command -v python3.12))
VENV := .venv
VENV312 := .venv312
PY := $(VENV)/bin/python
PYLIB := $(shell $(PY311) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))' 2>/dev/null)
# The extension is built in place (python/ferrodyn/_C.<abi>.so); tests import python/ first.
RUN := PYTHONPATH=$(CURDIR)/python
PYTEST_ARGS ?=

.PHONY: help venv build build312 demo test test-rust test-py test-py312 bench wheel lint clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

$(VENV)/.stamp: requirements-dev.txt
	@test -n "$(PY311)" || { echo "CPython 3.11 not found (install it with pyenv)"; exit 1; }
	$(PY311) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.stamp ## create .venv (CPython 3.11) with the pinned dependencies

build: venv ## build the extension in release mode, in place, for CPython 3.11
	VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  $(VENV)/bin/maturin develop --release --skip-install -q

$(VENV312)/.stamp: requirements-dev.txt
	$(PY312) -m venv $(VENV312)
	$(VENV312)/bin/python -m pip install -q --upgrade pip
	$(VENV312)/bin/python -m pip install -q -r requirements-dev.txt
	touch $@

build312: $(VENV312)/.stamp ## build the extension in place for CPython 3.12 (when installed)
	VIRTUAL_ENV=$(CURDIR)/$(VENV312) PATH=$(CURDIR)/$(VENV312)/bin:$$PATH CARGO_TARGET_DIR=target/py312 \
	  $(VENV312)/bin/maturin develop --release --skip-install -q

demo: build ## set up, build, and run a short example of the hook, a guard tree and a cache hit
	$(RUN) $(PY) examples/demo.py

test-rust: venv ## Rust unit tests (no interpreter needed for the core logic)
	PYO3_PYTHON=$(CURDIR)/$(PY) LD_LIBRARY_PATH=$(PYLIB) cargo test --release -q

test-py: build ## the Python test suite on CPython 3.11
	$(RUN) $(PY) -m pytest -q $(PYTEST_ARGS)

test-py312: ## the Python test suite on CPython 3.12, when it is installed
	@if [ -n "$(PY312)" ]; then $(MAKE) build312 && $(RUN) $(VENV312)/bin/python -m pytest -q $(PYTEST_ARGS); \
	 else echo "CPython 3.12 not installed: skipping the 3.12 run"; fi

test: test-rust test-py test-py312 ## set up, then cargo test and pytest (3.11, and 3.12 where installed)

bench: build ## benchmarks against torch.compile / torch.utils.weak / torch's make_fx, as ratios
	$(RUN) $(PY) benches/run.py

wheel: venv ## release wheels for CPython 3.11 and 3.12 into dist/
	$(VENV)/bin/maturin build --release --out dist -i $(PY311)
	$(if $(PY312),CARGO_TARGET_DIR=target/py312 $(VENV)/bin/maturin build --release --out dist -i $(PY312))

lint: venv ## rustfmt and clippy (warnings are errors)
	cargo fmt --check
	PYO3_PYTHON=$(CURDIR)/$(PY) cargo clippy --release -q -- -D warnings

clean: ## remove build outputs (keeps the virtual environments)
	cargo clean
	rm -rf dist python/ferrodyn/*.so
