# tokengate: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install system-deps codex-cli claude-code agents-refresh bench-deps demo test test-fast test-loaded test-unit test-e2e compiled test-compiled lint format docs bench cost-guard cost-budgets clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install tokengate with its dev tools

# `apt-get install` of the Debian packages whose command is missing: $(call apt,cmd:pkg ...)
define apt
	@missing=""; \
	for pair in $(1); do \
	  command -v "$${pair%%:*}" >/dev/null || [ -x "/usr/sbin/$${pair%%:*}" ] || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi; \
	for pair in $(1); do \
	  command -v "$${pair%%:*}" >/dev/null || [ -x "/usr/sbin/$${pair%%:*}" ] || { echo "still missing: $${pair%%:*}"; exit 1; }; \
	done
endef

system-deps: ## install redis-server, redis-sentinel, promtool, chromium, jq and PostgreSQL (Debian packages) when missing
	$(call apt,redis-server:redis-server redis-sentinel:redis-sentinel promtool:prometheus chromium:chromium jq:jq)
	$(call apt,pg_ctlcluster:postgresql)

# The Codex CLI the end-to-end tests drive (tests/e2e/test_codex_cli.py), pinned, kept
# under .cache/ (gitignored) and reused. `make test` fails if it can not be installed (a
# skipped agent test would hide a broken gateway); pytest run by hand skips without it.
CODEX_VERSION := 0.171.0
CODEX := .cache/npm/node_modules/.bin/codex

codex-cli: ## install nodejs/npm (Debian) and the pinned Codex CLI when missing
	$(call apt,node:nodejs npm:npm)
	@$(CODEX) --version 2>/dev/null | grep -q ' $(CODEX_VERSION)$$' || \
	  npm install --prefix .cache/npm --no-audit --no-fund --loglevel=error \
	    @openai/codex@$(CODEX_VERSION)

# Claude Code for its end-to-end test (tests/e2e/test_claude_code.py): pinned, because npm on
# Node 20 silently picks an older release (newer ones declare engines.node >= 22; the CLI is
# a native binary from an optional dependency and does not run on the system Node).
CLAUDE_CODE_VERSION := 2.1.332
CLAUDE_CODE_DIR := .cache/claude-code
CLAUDE_CODE := $(CLAUDE_CODE_DIR)/node_modules/.bin/claude

claude-code: ## install Claude Code (npm, pinned) for its e2e test; Node/npm from Debian when missing
	$(call apt,node:nodejs npm:npm)
	@$(CLAUDE_CODE) --version 2>/dev/null | grep -q '^$(CLAUDE_CODE_VERSION) ' || \
	  npm install --prefix $(CLAUDE_CODE_DIR) --no-audit --no-fund --loglevel=error \
	    @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)

agents-refresh: install codex-cli claude-code ## re-record tests/fixtures/agents/ from the pinned Codex CLI and Claude Code
	$(BIN)/python -m tests.support.agents_record --codex $(CODEX) --claude $(CLAUDE_CODE)

bench-deps: system-deps ## also install nginx, wrk, valgrind, faketime (Debian) and py-spy (pip) when missing
	$(call apt,nginx:nginx wrk:wrk valgrind:valgrind faketime:faketime)
	@test -x $(BIN)/py-spy || $(BIN)/python -m pip install -q py-spy  # tests.bench.profile

PORT ?= 8080
SIM_PORT ?= 9090
demo: install ## the gateway on the shipped config against the simulator (PORT=8080 SIM_PORT=9090)
	$(BIN)/python -m app.commands.demo --port $(PORT) --sim-port $(SIM_PORT)

# Two pytest workers (pytest-xdist), one test file each at a time: most of a test's time is
# spent waiting on the processes it started, so two keep both cores busy without the load
# that more would add (4 was no faster on 2 cores). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
XDIST = -n $(PYTEST_WORKERS) --dist loadfile

test: install system-deps codex-cli claude-code ## install everything, then run the whole suite
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: install system-deps codex-cli claude-code ## the whole suite but the long scenarios marked `slow`
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# The suite as a slow, busy machine runs it: every process it starts (gateways, sims,
# redis-server, PostgreSQL's clients) pinned to one core, which a CPU hog shares. A test
# that passes on an idle machine and fails here asserts the machine's speed, not the
# gateway's behaviour: fix it (a clock of the test's own, or a bound that holds at any
# speed), never retry or skip it. LOADED_ARGS narrows the run (e.g. LOADED_ARGS=tests/unit).
LOADED_CORE ?= 0
LOADED_ARGS ?=
test-loaded: install system-deps codex-cli claude-code ## the whole suite on one core beside a CPU hog (stress-ng)
	$(call apt,stress-ng:stress-ng)
	@taskset -c $(LOADED_CORE) stress-ng --cpu 1 --timeout 2h --quiet & hog=$$!; \
	  trap 'kill $$hog 2>/dev/null' EXIT; \
	  taskset -c $(LOADED_CORE) $(BIN)/python -m pytest -q $(XDIST) $(LOADED_ARGS)

test-unit: install system-deps ## unit tests only (in-process, plus redis-server for the Lua parity cases)
	$(BIN)/python -m pytest -q tests/unit

test-e2e: install system-deps codex-cli claude-code ## end-to-end tests only (real servers on loopback)
	$(BIN)/python -m pytest -q tests/e2e

# The compiled build (issue #32; setup.py, app/build.py): the request's path as mypyc C
# extensions, as the image ships it. Built into a wheel under build/ and installed into
# build/compiled with `pip install --target`; never compiled in place, so an edit of the
# source is never shadowed by a stale extension.
COMPILED := build/compiled
compiled: install ## build the compiled wheel (mypyc, gcc) and install it into build/compiled
	$(call apt,gcc:gcc)
	@$(BIN)/python -c "import os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
	  || (apt-get update -q && apt-get install -y -q python3-dev)  # Python's headers, for gcc
	$(BIN)/python -m pip install --quiet "setuptools>=77"
	rm -rf build
	TOKENGATE_COMPILE=1 $(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w build/wheel .
	$(BIN)/python -m pip install --quiet --no-deps --target $(COMPILED) build/wheel/tokengate-*.whl
	@$(BIN)/python -c "import sys; sys.path.insert(0, '$(COMPILED)'); from app import build; \
	  print('build/compiled:', build.build_name(), build.compiled_modules())"

# End-to-end tests whose gateways and sims run the compiled build (the test process stays on
# the source): the paths where compiled code could differ from interpreted.
COMPILED_TESTS ?= $(shell grep -v "^#" tests/compiled.txt)
test-compiled: compiled system-deps ## the end-to-end tests of tests/compiled.txt on the compiled build
	TOKENGATE_TEST_BUILD=$(abspath $(COMPILED)) $(BIN)/python -m pytest -q $(XDIST) $(COMPILED_TESTS)

lint: install ## ruff (lint + format check), mypy --strict (app and tests), the import layers (import-linter)
	$(BIN)/ruff check app tests
	$(BIN)/ruff format --check app tests
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix app tests
	$(BIN)/ruff format app tests

docs: install ## regenerate docs/configuration.md's reference from the schema
	$(BIN)/python -c "import pathlib; from app.config.reference import DOC, splice; p = pathlib.Path(DOC); p.write_text(splice(p.read_text()))"

bench: install bench-deps compiled ## side-by-side benchmark of the compiled build (results under tests/bench/results/)
	$(BIN)/python -m tests.bench.run --build $(COMPILED)

# The hot path's cost guard (tests/bench/guard.py): instructions per request under callgrind
# for fixed scenarios, against tests/bench/budgets.toml; `.ci/run` runs it after the suite.
cost-guard: install system-deps compiled ## instructions per request under callgrind (source, compiled build); fails > 3 % over tests/bench/budgets*.toml
	$(call apt,valgrind:valgrind callgrind_control:valgrind faketime:faketime)
	$(BIN)/python -m tests.bench.guard
	$(BIN)/python -m tests.bench.guard --build $(COMPILED) --budgets tests/bench/budgets_compiled.toml

WHY ?=
cost-budgets: install system-deps compiled ## measure and write both budget files (WHY="what bought it": needed to raise one)
	$(call apt,valgrind:valgrind callgrind_control:valgrind faketime:faketime)
	$(BIN)/python -m tests.bench.guard --update --why "$(WHY)"
	$(BIN)/python -m tests.bench.guard --build $(COMPILED) --budgets tests/bench/budgets_compiled.toml --update --why "$(WHY)"

clean: ## remove the venv, caches and local state
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache var tests/bench/results .cache
