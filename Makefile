# Build and test the KV-cache course (GNU make).
#
#   make book    create .venv if needed, build the book: English into _build/html, Chinese into _build/html/zh
#                (prerequisites: Python >= 3.11 with venv, make, npm; a missing one stops it at once, in one line)
#   make i18n-update  extract the English messages and update book/locale/zh_CN/LC_MESSAGES/*.po (sphinx-intl)
#   make i18n-check   fail, listing them, when a message is untranslated, fuzzy, stale or loses its markup
#   make test    create .venv if needed, run the whole test suite
#   make venv    only create/update .venv from requirements.txt (+ kvref in editable mode); without an NVIDIA GPU
#                torch is the CPU build from PyTorch's index (KVREF_TORCH=default: the plain pin)
#   make js      only fetch the book's pinned JavaScript (MathJax, require.js, ipywidgets manager) into .cache/js,
#                and, where the system has no CJK font, the pinned Noto Sans SC into .cache/fonts
#   make pdf     build the book, then print it into one PDF, $(BUILD_DIR)/_build/book.pdf
#                (prerequisite: headless Chromium, Debian's `chromium`: apt-get install -y chromium)
#   make clean   remove _build
#   make release regenerate the student notebooks notebooks/NN_topic.ipynb from solutions/ (nbgrader)
#   make grade SUBMISSIONS=<dir> OUT=<dir>
#                autograde <dir>/<student>/NN_topic.ipynb into OUT/grades.csv and OUT/feedback/
#   make report OUT=<dir>
#                the class report of a graded (or merged) OUT: OUT/report/index.html and OUT/report/tests.csv
#   make student the student edition: _build/student/ and _build/student.zip
#   make check NB=03_memory
#                run notebooks/03_memory.ipynb as the grader does (visible tests only)

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
HTML_DIR := $(abspath $(BUILD_DIR))/_build/html
# The English build executes every page into this jupyter-cache (emptied first); the Chinese build reads it.
JUPYTER_CACHE := $(abspath $(BUILD_DIR))/_build/.jupyter_cache
ZH_WORK := $(abspath $(BUILD_DIR))/_build/zh-build

PYTEST_ARGS ?=
# `make test` runs the tests in TEST_WORKERS processes (pytest-xdist; groups: tests/conftest.py). 1: one process.
TEST_WORKERS ?= 2

# Recipes (and the tools they start, e.g. nbgrader and the notebook kernel) use the venv.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: venv js book pdf test clean release grade report student check i18n-update i18n-check gpu-check prerequisites

# Checked in seconds, before anything is installed: one line per missing prerequisite, saying what to install.
prerequisites:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found: install Python 3.11 (or run make PYTHON=/path/to/python3.11)" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: $(PYTHON) is Python $$($(PYTHON) -c 'import platform; print(platform.python_version())'); the course needs >= 3.11 (make PYTHON=python3.11)" >&2; exit 1; }
	@$(PYTHON) book/_ext/offline_js.py --prerequisites

venv: $(STAMP)

# Without an NVIDIA GPU, torch comes from PyTorch's CPU index (scripts/torch_cpu.py; KVREF_TORCH=default skips it):
# PyPI's Linux torch is the CUDA build, gigabytes the course never uses. Where that index does not answer within a
# few seconds, the script says so in one line and the plain pins bring torch.
# pip compiles what it installs one file at a time (most of a minute here); --no-compile, then compileall on every
# core, writes the same .pyc files in about half the time. The files that do not compile on this Python (torch
# ships one in 3.12 syntax) are skipped, as pip skips them.
COMPILE = $(PY) -c 'import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path("purelib"), quiet=2, workers=0)'

$(STAMP): requirements.txt pyproject.toml scripts/torch_cpu.py | prerequisites
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) scripts/torch_cpu.py requirements.txt
	$(PY) -m pip install -r requirements.txt --no-compile
	$(PY) -m pip install --no-deps -e .
	$(COMPILE)
	$(PY) -m ipykernel install --user --name kv-course --display-name "Python (kv-course)"
	touch $@

# The pages serve MathJax, require.js and the ipywidgets manager themselves (no CDN, work offline).
# The npm packages are pinned with their sha512 in book/_ext/js.lock.toml; the script fetches the tarballs with
# `npm pack` into .cache/js (gitignored), checks them and unpacks the needed files. Its stamps are the
# per-package .cache/js/static/npm/*/.integrity files: when they match the lock it only re-checks the
# cached tarballs (fast) and needs neither npm nor the network.
js: prerequisites
	$(PYTHON) book/_ext/offline_js.py

# The notebook kernels draw figures inline (what ipykernel does by default, spelled out because `make test`
# exports Agg, which the book build would inherit): with Agg, plt.show() in a page displayed nothing.
book: export MPLBACKEND := module://matplotlib_inline.backend_inline
# Two editions from one execution: the pages run first, as many at a time as there are CPUs, into an emptied
# jupyter-cache (book/_ext/execute_pages.py; a page that fails there is run again by the build, which reports it);
# the English build reads those runs, and so does the Chinese build (config generated from _config.yml: language
# zh_CN, catalogs in book/locale), whose pages move to _build/html/zh/. book/_ext/lang_switch.py links each page
# to its twin in the other edition.
book: prerequisites $(STAMP) js
	rm -rf $(JUPYTER_CACHE) $(ZH_WORK)
	$(PY) book/_ext/execute_pages.py --cache $(JUPYTER_CACHE)
	$(JUPYTER_BOOK) build . $(BOOK_FLAGS) --all --path-output $(BUILD_DIR)
	$(PY) book/_ext/i18n_tool.py config --cache $(JUPYTER_CACHE) --out $(ZH_WORK)/_config.yml
	$(JUPYTER_BOOK) build . --config $(ZH_WORK)/_config.yml --toc $(ZH_WORK)/_toc.yml $(BOOK_FLAGS) --all --path-output $(ZH_WORK)
	rm -rf $(HTML_DIR)/zh && mv $(ZH_WORK)/_build/html $(HTML_DIR)/zh
	@echo "First chapter: $(FIRST_CHAPTER)"
	@echo "Chinese edition: $(HTML_DIR)/zh/book/01_motivation.html"

# The Chinese catalogs (README: "Updating the Chinese edition"). Both extract the messages with Sphinx's gettext
# builder, pages not executed (seconds): update merges them into the .po files, check compares them.
i18n-update: $(STAMP)
	$(PY) book/_ext/i18n_tool.py update

i18n-check: $(STAMP)
	$(PY) book/_ext/i18n_tool.py check

# One printable PDF per edition (book.pdf, book-zh.pdf): headless Chromium prints each built page (book/_ext/static/print.css), pypdf joins them.
pdf: book
	$(PY) book/_ext/pdf.py --html $(abspath $(BUILD_DIR))/_build/html --out $(abspath $(BUILD_DIR))/_build/book.pdf
	$(PY) book/_ext/pdf.py --html $(abspath $(BUILD_DIR))/_build/html/zh --out $(abspath $(BUILD_DIR))/_build/book-zh.pdf

test: export MPLBACKEND := Agg
# js: the CJK font (fetched where the system has none) before any test draws or prints Chinese; the tests run in
# parallel, so the book build inside them may come later.
test: prerequisites $(STAMP) js
	$(PY) -m pytest $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder) $(PYTEST_ARGS)

# Student notebooks: solutions/NN_topic.ipynb -> notebooks/NN_topic.ipynb (nbgrader generate_assignment).
release: $(STAMP)
	$(PY) -m autograder release

# Autograde a folder of submissions: $(SUBMISSIONS)/<student>/NN_topic.ipynb -> $(OUT)/grades.csv + feedback.
# Optional: WORKERS=N (default: CPU cores), SHARD=K/N, FORCE=1, FORMAT=canvas|moodle|classroom|folders,
# ROSTER=roster.csv, MANUAL=review.csv, GRADE_ARGS="--notebook-timeout 300 ...".
grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" -a -n "$(OUT)" || { echo "usage: make grade SUBMISSIONS=<dir or .zip> OUT=<dir> [WORKERS=N] [SHARD=K/N] [FORCE=1]" >&2; exit 2; }
	$(PY) -m autograder grade "$(SUBMISSIONS)" "$(OUT)" $(if $(WORKERS),--workers $(WORKERS)) $(if $(SHARD),--shard $(SHARD)) $(if $(FORCE),--force) $(if $(FORMAT),--format $(FORMAT)) $(if $(ROSTER),--roster $(ROSTER)) $(if $(MANUAL),--manual $(MANUAL)) $(GRADE_ARGS)

# The class report of a graded (or merged) OUT: $(OUT)/report/index.html and $(OUT)/report/tests.csv.
report: $(STAMP)
	@test -n "$(OUT)" || { echo "usage: make report OUT=<dir>" >&2; exit 2; }
	$(PY) -m autograder report "$(OUT)"

# What a student clones or downloads (no solutions/, no tests/, no hidden tests): see autograder/student.py.
student: $(STAMP)
	$(PY) -m autograder student --dest _build/student

# A student's self-check of one notebook: the grader's sandbox and limits, visible tests only.
check: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make check NB=03_memory" >&2; exit 2; }
	$(PY) -m autograder check notebooks/$(NB).ipynb

# The GPU check: CUDA tests, decode benchmark on CUDA (eager, compiled, CUDA graphs, paged in place, roofline)
# into one markdown report, gpu_report.md. Without a CUDA device it says "no CUDA device" and exits with status 3.
gpu-check: $(STAMP)
	$(PY) -m kvref.bench gpu --out gpu_report.md

clean:
	rm -rf _build
