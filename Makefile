# Build and test the KV-cache course (GNU make).
#
#   make book    create .venv if needed, build the book into _build/html
#   make test    create .venv if needed, run the whole test suite
#   make venv    only create/update .venv from requirements.txt (+ kvref in editable mode)
#   make clean   remove _build
#
# Coming later (not implemented yet): make grade SUBMISSIONS=... OUT=...

SHELL := /bin/bash
.DEFAULT_GOAL := book

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python

# Where the book goes: $(BUILD_DIR)/_build/html. tests/test_setup.py overrides
# BUILD_DIR and JUPYTER_BOOK so that it builds exactly what `make book` builds.
BUILD_DIR ?= .
JUPYTER_BOOK ?= $(VENV)/bin/jupyter-book
BOOK_FLAGS := -W -n --keep-going --builder html
FIRST_CHAPTER := $(abspath $(BUILD_DIR))/_build/html/book/01_motivation.html

PYTEST_ARGS ?=

# Recipes (and the tools they start, e.g. nbgrader and the notebook kernel) use the venv.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv book test clean

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: $(PYTHON) must be Python >= 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps -e .
	touch $@

book: export MPLBACKEND := Agg
book: $(STAMP)
	$(JUPYTER_BOOK) build . $(BOOK_FLAGS) --path-output $(BUILD_DIR)
	@echo "First chapter: $(FIRST_CHAPTER)"

test: export MPLBACKEND := Agg
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf _build
