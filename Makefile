# ferrodyn — `make help` lists the targets. Set-up is idempotent: a second run does no work.
.DEFAULT_GOAL := help
SHELL := /bin/bash

# CPython interpreters: pyenv's first, then PATH. Free-threaded builds (3.13t) are not used.
find-python = $(firstword $(filter-out %t/bin/python$(1),$(wildcard $(HOME)/.pyenv/versions/$(1).*/bin/python$(1))) $(shell command -v python$(1)))
PY311 ?= $(call find-python,3.11)
PY312 ?= $(call find-python,3.12)
PY313 ?= $(call find-python,3.13)
VENV := .venv
VENV312 := .venv312
VENV313 := .venv313
PY := $(VENV)/bin/python
PYLIB := $(shell $(PY311) -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))' 2>/dev/null)
# The extension is built in place (python/ferrodyn/_C.<abi>.so); tests import python/ first.
RUN := PYTHONPATH=$(CURDIR)/python
PYTEST_ARGS ?=
# Release wheels: linked with zig (ziglang, pinned in requirements-dev.txt) against glibc 2.28,
# the baseline torch's own Linux wheels need, so they install wherever torch does.
WHEEL_FLAGS := --release --zig --compatibility manylinux_2_28 --out dist

.PHONY: help venv build build312 build313 demo test test-fast test-rust test-py test-py312 \
        test-py313 bench wheel lint clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

# $(call make-venv,DIR,PYTHON): a virtual environment with the pinned dependencies.
define make-venv
	$(2) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -r requirements-dev.txt
	touch $(1)/.stamp
endef

$(VENV)/.stamp: requirements-dev.txt
	@test -n "$(PY311)" || { echo "CPython 3.11 not found (install it with pyenv)"; exit 1; }
	$(call make-venv,$(VENV),$(PY311))

venv: $(VENV)/.stamp ## create .venv (CPython 3.11) with the pinned dependencies

# `maturin develop` builds the extension into python/ferrodyn/ and installs the package into
# .venv in editable mode (a .pth file pointing at python/), so `.venv/bin/python` imports the
# current source from any directory; every build keeps it current.
build: venv ## build the extension (release) in place and install it, editable, into .venv
	VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  $(VENV)/bin/maturin develop --release -q

$(VENV312)/.stamp: requirements-dev.txt
	$(call make-venv,$(VENV312),$(PY312))

build312: $(VENV312)/.stamp ## build the extension in place for CPython 3.12 (when installed)
	VIRTUAL_ENV=$(CURDIR)/$(VENV312) PATH=$(CURDIR)/$(VENV312)/bin:$$PATH CARGO_TARGET_DIR=target/py312 \
	  $(VENV312)/bin/maturin develop --release --skip-install -q

$(VENV313)/.stamp: requirements-dev.txt
	$(call make-venv,$(VENV313),$(PY313))

build313: $(VENV313)/.stamp ## build the extension in place for CPython 3.13 (when installed)
	VIRTUAL_ENV=$(CURDIR)/$(VENV313) PATH=$(CURDIR)/$(VENV313)/bin:$$PATH CARGO_TARGET_DIR=target/py313 \
	  $(VENV313)/bin/maturin develop --release --skip-install -q

demo: build ## set up, build, and run a short example of the hook, a guard tree and a cache hit
	$(PY) examples/demo.py

test-rust: venv ## Rust unit tests (no interpreter needed for the core logic)
	PYO3_PYTHON=$(CURDIR)/$(PY) LD_LIBRARY_PATH=$(PYLIB) cargo test --release -q

test-py: build ## the Python test suite on CPython 3.11
	$(RUN) $(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: build ## the edit loop: the Python suite on CPython 3.11 without the slow tests
	$(RUN) $(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-py312: ## the Python test suite on CPython 3.12, when it is installed
	@if [ -n "$(PY312)" ]; then $(MAKE) build312 && $(RUN) $(VENV312)/bin/python -m pytest -q $(PYTEST_ARGS); \
	 else echo "CPython 3.12 not installed: skipping the 3.12 run"; fi

test-py313: ## the Python test suite on CPython 3.13, when it is installed
	@if [ -n "$(PY313)" ]; then $(MAKE) build313 && $(RUN) $(VENV313)/bin/python -m pytest -q $(PYTEST_ARGS); \
	 else echo "CPython 3.13 not installed: skipping the 3.13 run"; fi

test: test-rust test-py test-py312 test-py313 ## set up, then cargo test and pytest on 3.11 (and 3.12, 3.13 where installed)

bench: build ## benchmarks against torch.compile / torch.utils.weak / torch's make_fx, as ratios
	$(RUN) $(PY) benches/run.py

# One cargo target directory per minor (pyo3 is configured per interpreter).
wheel: venv ## manylinux_2_28 release wheels for the installed CPython 3.11-3.13, and the sdist, into dist/
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH CARGO_TARGET_DIR=target/wheel-py311 $(VENV)/bin/maturin build $(WHEEL_FLAGS) -i $(PY311)
	$(if $(PY312),PATH=$(CURDIR)/$(VENV)/bin:$$PATH CARGO_TARGET_DIR=target/wheel-py312 $(VENV)/bin/maturin build $(WHEEL_FLAGS) -i $(PY312))
	$(if $(PY313),PATH=$(CURDIR)/$(VENV)/bin:$$PATH CARGO_TARGET_DIR=target/wheel-py313 $(VENV)/bin/maturin build $(WHEEL_FLAGS) -i $(PY313))
	$(VENV)/bin/maturin sdist --out dist

lint: venv ## rustfmt and clippy (warnings are errors)
	cargo fmt --check
	PYO3_PYTHON=$(CURDIR)/$(PY) cargo clippy --release -q -- -D warnings

clean: ## remove build outputs (keeps the virtual environments)
	cargo clean
	rm -rf dist python/ferrodyn/*.so
