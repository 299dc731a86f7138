# Two commands: `make demo` (quick start) and `make test` (whole suite).
# Both create .venv and install everything they need into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
EXTRAS ?= dali,mpich,pfs,test,zarr
STAMP  := $(VENV)/.installed-$(shell echo $(EXTRAS) | tr ',' '-')
# Let mpiexec (and every tool the venv installs) be found first on PATH.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: demo test lint typecheck venv system-deps demo-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

# Optional OS packages, installed only where we are root with apt (each run
# says what it installs and why; elsewhere the features fall back and their
# tests skip with a reason): `demo-deps` is FUSE for the demo's emulated
# parallel filesystem; `system-deps` adds what the suite checks against (fio,
# GlusterFS, the formats' tools, headless Chromium, Slurm). The lists:
# `bash scripts/install-system-deps.sh demo|all --list`.
system-deps:
	@bash scripts/install-system-deps.sh all

demo-deps:
	@bash scripts/install-system-deps.sh demo

demo: venv demo-deps
	bash scripts/demo.sh

# Two passes: most modules in parallel (TEST_JOBS processes, one module per process at a
# time), then the `serial` ones alone (timing-sensitive or evicting the whole page cache;
# tests/conftest.py).
TEST_JOBS ?= 2
test: venv system-deps
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -m serial

lint: venv
	$(BIN)/ruff check .

# mypy --strict over iobench, iobench.generators and iobench.loaders ([tool.mypy] in
# pyproject.toml). generators/ and loaders/ are installed under iobench/ (package-dir),
# which mypy cannot see through the editable install's import hook: links in a scratch
# .venv/typecheck/iobench/ stand in for them (mypy_path), so mypy names their errors
# there, e.g. .venv/typecheck/iobench/loaders/hdf5.py is loaders/hdf5.py.
# Cache: .venv/mypy-cache (on 2 busy cores: cold ~25 s, warm under 1 s).
typecheck: venv
	mkdir -p $(VENV)/typecheck/iobench
	ln -sfn $(CURDIR)/generators $(VENV)/typecheck/iobench/generators
	ln -sfn $(CURDIR)/loaders $(VENV)/typecheck/iobench/loaders
	$(BIN)/mypy

clean:
	rm -rf $(VENV) *.egg-info demo-work
