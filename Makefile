# connector-push — the two commands: `make dev` runs the product, `make test` passes the tests.
# `make dev DEV_ARGS=--demo` loads the demo pack and records again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: dev test check lint fmt pytest bench bench-scale chaos clean-dev venv bytecode lock wheel

# Every package the venv holds, the installer, the build backend and the dev tools among
# them, is pinned with its hashes in requirements.lock, written by `make lock` from the
# ranges in pyproject.toml. (Re)install when the venv is missing or either file is newer
# than the last install: first the lock (pip refuses any file whose hash it does not
# list), then the project itself, editable, with nothing more and no build environment
# of its own (its setuptools is the locked one), and beside it the sandbox remote, a
# distribution of its own (sandbox-dist/) that the product's wheel leaves out.
LOCK := requirements.lock
$(STAMP): pyproject.toml sandbox-dist/pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e . -e ./sandbox-dist
	@touch $(STAMP)

venv: $(STAMP)

# The wheel a user installs (docs/deployment.md, "The wheel"), into dist/: built offline
# with the venv's locked setuptools. `python -m build --wheel` makes the same one where
# the `build` package is installed.
wheel: $(STAMP)
	rm -rf build  # setuptools would pack a previous build's leftovers too
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir dist .

# Refresh requirements.lock after an edit of pyproject.toml's dependencies: uv resolves
# for CPython 3.11 on x86_64 Linux (glibc 2.28 or newer), whatever machine runs it, and
# keeps every pin that still fits its range. LOCK_ARGS='--upgrade-package NAME' moves one
# package (and what it needs) to its newest release in range, LOCK_ARGS=--upgrade all
# of them (docs/testing-and-benchmarks.md, "Upgrading a dependency").
LOCK_FOR := --python-version 3.11 --python-platform x86_64-manylinux_2_28
lock: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --extra dev $(LOCK_FOR) --generate-hashes \
	  --custom-compile-command 'make lock ($(LOCK_FOR))' --quiet --output-file $(LOCK) $(LOCK_ARGS)

# Bytecode for our own packages, as a non-editable `pip install` would write. The workflow
# sandbox re-imports each workflow module for every new workflow instance; with no
# bytecode cache (an editable install compiles nothing, and PYTHONDONTWRITEBYTECODE=1,
# common in containers and set on our machines, keeps Python from writing one) each
# re-import compiled the source again: 13% of the worker's busy time in the create
# benchmark (P1). Incremental: only changed modules are compiled again.
PACKAGES := protocol workflows activities services db worker ingress cli sandbox connector_push_client bench
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q $(PACKAGES)

dev: bytecode
	$(BIN)/connector-push dev $(DEV_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Four test processes, each with its own Postgres, Temporal dev server, sandbox and CLI
# fork server (the session fixtures): once the CLI tests stopped paying ~3 s of imports per
# command, most of the suite waits on timers and servers rather than the CPU,
# so more processes than cores overlap the waits; the long tests start first
# (tests/fixtures/schedule.py). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 4
pytest: bytecode
	$(BIN)/pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

# Lint beside the tests, not before them: the suite leaves a core idle between its waits
# and lint's half-minute of CPU fits there. Either failing fails `make test`.
test:
	$(MAKE) --no-print-directory -j2 lint pytest

# The inner loop before each commit (about a minute): lint, types, import contracts, every test
# that needs no server (the pure rules in tests/unit, and tests/replay, which replays the
# recorded histories without one), and the LinkWorkflow's control flow on stub activities
# (the time-skipping server, ~0.3 s to start; a few seconds in all: STYLE rule 20). Under a
# minute here; `make test` runs everything.
CONTROL_FLOW_TESTS := tests/workflows/test_link_control_flow.py tests/workflows/test_link_continue_as_new.py tests/workflows/test_link_stub_names.py
check: lint
	$(BIN)/pytest -q -n 2 tests/unit tests/replay $(CONTROL_FLOW_TESTS)

# ONLY=P4 (or P1,P5 ...) runs those parts alone; see bench/__main__.py.
bench: bytecode
	$(BIN)/python -m bench $(if $(ONLY),--only $(ONLY))

# NF-7: N = 100,000 and 1,000,000 on a stock Postgres (bench/scale); parts alone
# with ONLY=listing,revalidation,push,backfill, one size with N=100000.
bench-scale: bytecode
	$(BIN)/python -m bench.scale $(if $(N),--n $(N)) $(if $(ONLY),--only $(ONLY))

# Seeded fault campaign (NF-4): CHAOS_SEED (default 1), CHAOS_SECONDS (default 600).
chaos: bytecode
	$(BIN)/python -m bench.chaos

clean-dev:
	rm -rf .dev-data
