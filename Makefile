# tokengate: `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := redis-server prometheus

.DEFAULT_GOAL := help
.PHONY: help install system-deps demo test test-unit test-e2e lint format docs bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install tokengate with its dev tools

system-deps: ## install redis-server and promtool (Debian packages) when missing
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@command -v redis-server >/dev/null && command -v promtool >/dev/null

demo: install ## run the simulated upstream + the gateway on the shipped config, print a snippet
	$(BIN)/python -m app.demo

test: install system-deps ## install everything, then run the whole suite
	$(BIN)/python -m pytest -q

test-unit: install ## unit tests only (no servers)
	$(BIN)/python -m pytest -q tests/unit

lint: install ## ruff (lint + format check) and mypy --strict
	$(BIN)/ruff check app tests
	$(BIN)/ruff format --check app tests
	$(BIN)/mypy

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix app tests
	$(BIN)/ruff format app tests

docs: install ## regenerate the README's configuration reference from the schema
	$(BIN)/python -c "import pathlib; from app.config.reference import splice; p = pathlib.Path('README.md'); p.write_text(splice(p.read_text()))"

bench: install system-deps ## side-by-side benchmark (results under tests/bench/results/)
	$(BIN)/python -m tests.bench.run

clean: ## remove the venv, caches and local state
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache var tests/bench/results
