#!/usr/bin/env bash
# The checks left by the GPU run of 2026-12-01 (benchmarks/results/gpu_h200_2026-12-01/), in one device call of
# ~4-6 minutes: what changed after it, measured on the GPU. Prepared and dry-checked on a CPU; not yet run on a GPU
# (the device tool paused new loans before the session's second call).
#
#   here:   bash benchmarks/gpu_wheels.sh && bash benchmarks/gpu_followup.sh --prepare
#   device: run with carry [".whl", ".gpu_tok"] and command `bash benchmarks/gpu_followup.sh`, timeout_s 560
#
# 1. serve, 16 clients (the gpu-check row: 16 waves of 8 before the linger) and 128 clients (every sample at once:
#    the server's own overhead against in-process);
# 2. --states all into /dev/shm under SCAN_WRITERS 4/2/1 and the NaN count's chunk (benchmarks/states_writers_sweep.py);
# 3. the whole 8B vocabulary twice in one process, each batch timed (where the first batch's extra 0.16 s goes);
# 4. the serve tests' same-bits checks with their models on CUDA (RMFAST_TEST_DEVICE=cuda: the cascade's Triton
#    kernels; SmolLM2's tokenizer from .gpu_tok), and the states' device-side NaN/inf counts (test_gpu.py).
# Steps 2 and 3 also measure what came after 2026-12-01's first run: the states counted on the device (2), each Triton
# kernel's first launch and the allocator's growth in the whole vocabulary's first batch (3). Each step's time limit
# below; 550 s in all.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--prepare" ]; then  # SmolLM2's tokenizer files (the embedded package is too big to carry)
  PY=${PY:-.venv/bin/python}
  rm -rf .gpu_tok
  PYTHONPATH=src "$PY" -c "from rmfast.loading.loader import load; load('smollm2-135m-instruct', device='cpu').tokenizer.save_pretrained('.gpu_tok')" \
    || { echo "gpu_followup: SmolLM2 does not load here: run 'make setup' first" >&2; exit 2; }
  grep -qx "/.gpu_tok/" .git/info/exclude || echo "/.gpu_tok/" >> .git/info/exclude
  echo "gpu_followup: .gpu_tok/ ($(du -sh .gpu_tok | cut -f1)); carry [\".whl\", \".gpu_tok\"]"
  exit 0
fi
R=${OUT:-benchmarks/out/gpu-followup}; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1
M="--random-init llama-3.1-8b --device cuda --dtype bfloat16"
for c in 16 128; do
  timeout 110 python3 -m rmfast bench --workload serve $M --prompt-tokens-list 512 --n-list 16 --prompts 8 --clients $c \
    --out /tmp/s$c >> "$R/serve.log" 2>&1; cp /tmp/s$c/serve_latest.json "$R/serve$c.json"; tail -2 "$R/serve.log"
done
TMPDIR=/dev/shm timeout 100 python3 benchmarks/states_writers_sweep.py --out "$R/states_sweep.json" > "$R/states_sweep.log" 2>&1
tail -6 "$R/states_sweep.log"
timeout 90 python3 benchmarks/scan_setup_profile.py --batches --top 30 > "$R/scan_batches.txt" 2>&1; head -4 "$R/scan_batches.txt"
RMFAST_TEST_DEVICE=cuda RMFAST_TEST_SMOL_TOKENIZER=.gpu_tok timeout 140 python3 -m pytest -q -p no:cacheprovider -rfEs \
  tests/test_serve.py tests/test_gpu.py -k "same_bits or one_prompt_prefill or nonfinite_counts" \
  > "$R/serve_bits.txt" 2>&1; tail -4 "$R/serve_bits.txt"
