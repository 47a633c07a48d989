# The two set-up commands of the README: `make demo` and `make test`.
# Each creates its own virtual environment and installs everything it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[langgraph,serve,plot,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/agentclaims demo

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check agentclaims tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/agentclaims bench engine

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
