# LeakGym: `make demo` and `make test` bootstrap .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint bench docs docs-pages clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[dev]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/leakgym demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check leakgym envs agents tests examples

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-pages: $(STAMP)
	$(BIN)/python -m leakgym.docgen docs

bench: $(STAMP)
	$(BIN)/leakgym bench attacks --json docs/results/bench_attacks.json

clean-venv:
	rm -rf $(VENV)
