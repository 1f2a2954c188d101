"""The kit's plan: which models and workloads run on a GPU (and in the dry run), their sizes and time estimates,
what comes back from a device machine. One place; the steps read it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
DEFAULT_OUT = REPO / "benchmarks" / "out" / "gpu-check"
#: the kit's own script: its steps that run in a process of their own (the probe, the profile) start it again
SCRIPT = REPO / "benchmarks" / "gpu_check.py"

# Per model on the GPU, in the order they run: timed candidates (rmfast, hf-cache), naive's, the baselines'
# nominal batch options (lowered to what the bench's memory guard allows on the card at hand: plan_batches),
# a wall-time estimate in seconds (build, GEMM peak, all methods, fp32 check) used to skip a model the
# budget cannot hold (measured on the H100, 2026-11-26: 8B with --full + 27B 112 s, 9B 37 s, 2B 29 s),
# whether the full vocabulary is also timed, and whether the model runs after the workloads (only when
# the budget allows).
GPU_PLAN = [
    {"name": "llama-3.1-8b", "n": 8192, "n_naive": 512, "hf_batch": "512,2048", "naive_batch": "128,256", "est_s": 100,
     "full": True, "compile": True},
    # compiled beside eager on the 8B only: the 27B's compile would push the best-of-N workloads past the budget
    {"name": "gemma-2-27b", "n": 4096, "n_naive": 256, "hf_batch": "128,512", "naive_batch": "64,128", "est_s": 60},
    {"name": "gemma-2-9b", "n": 8192, "n_naive": 512, "hf_batch": "256,1024", "naive_batch": "64,128", "est_s": 45,
     "late": True},
    {"name": "gemma-2-2b", "n": 32768, "n_naive": 1024, "hf_batch": "512,2048", "naive_batch": "128,256", "est_s": 40,
     "late": True},
]
GPU_TESTS = ["tests/test_kernels.py", "tests/test_gpu.py", "tests/test_cascade.py", "tests/test_scan_launches.py",
             "tests/test_elementwise_kernels.py"]  # those that exist
# The workloads on the GPU (8B, bf16): best-of-N (prompt 512 and 2,048 x N 16 and 64; 16 prompts x 4), one
# best-of-N call under torch.profiler (prompt 2,048, N 64), the states overhead (last_prenorm, all).
WORKLOAD_MODEL = "llama-3.1-8b"
# best of 2 timed calls per row (HF's too): the first timed call of a process at 512 x 16 ran at 65% of the steady
# state's speed on the H100 (gpu_h100_2026-11-26_d), after the untimed warm-up of small shapes
BEST_OF_N_RUNS = {"single": ["--prompt-tokens-list", "512,2048", "--n-list", "16,64", "--repeats", "2"],
                  "prompts16": ["--prompt-tokens-list", "512", "--n-list", "4", "--prompts", "16", "--repeats", "2"]}
PROFILE_SHAPES = {"gpu": ((2048, 64), (2048, 16), (512, 16)), "dry": ((24, 4), (16, 3))}  # (prompt tokens, N): the kernel
# table of the first; every one also by phase (host span vs device time: where the GPU waits for the host)
# /sync: the reference. Batches of 1,024: the writer overlaps only the batches after the first (at scan's auto
# batch of 16,384 the 4,096 candidates were ONE batch on the H100, so `all` could not overlap anything).
STATES_ARGS = ["--n-candidates", "8192", "--batch-size", "1024", "--repeats", "3", "--states-modes",
               "last_prenorm,all,all/sync"]
WORKLOAD_EST_S = {"best-of-n": 60, "profile": 100, "states": 60, "states-ram": 40, "serve": 90}
# rmfast serve (issue 49): G 8 x N 16, 512-token prompts, 16 clients sending one sample per request, against the
# same samples in-process and a per-request HF server; needs FastAPI, uvicorn and httpx (skipped, said, without)
SERVE_ARGS = ["--prompt-tokens-list", "512", "--n-list", "16", "--prompts", "8", "--clients", "16"]
# The states again with their folder in RAM (tmpfs): the overhead where the "disk" keeps up (issue 33's states target is
# <= 1.5x plain there); run where /dev/shm has room for the rounds' folders (GPU: 3 x 2.3 GB of `all` states).
STATES_RAM = {"dir": "/dev/shm", "gpu_bytes": 16 << 30, "dry_bytes": 64 << 20}
# The dry run: two families (Llama 3, Gemma 2), shrunk; the tests of the same files that run on a CPU.
DRY_MODELS = "llama-3.2-1b,gemma-2-27b"
DRY_TESTS_K = "generated_tokenizer or smoke or test_triton_norm_head_fp16"
EXPORT = ("summary.md", "summary.json", "tests.csv", "bench.csv", "cost_model.csv", "best_of_n.csv", "states.csv",
          "gpu-check.tar.gz")  # at most 8 files come back from a device machine
#: what a CUDA process holds beside the weights when the bench's guard reads the free memory (context,
#: allocator): 0.6-0.7 GiB measured on the H100 (64.5 GiB free after the 8B's 14.0 GiB of weights); planned at 2 GiB
CUDA_RESERVE = 2 * 2**30
#: the kit's batches stay this far under the guard's limit (its free memory is planned, not measured)
GUARD_MARGIN = 0.9
RESERVE_S = 20  # kept for collecting and writing the results

#: kernel names (or, on a CPU, op names) counted as the GEMMs: cuBLAS/cuBLASLt (sm90_xmma, nvjet), CUTLASS, aten's
GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma|cutlass|aten::(mm|addmm|bmm|linear|matmul)$", re.IGNORECASE)

#: the configuration sweeps' shapes: the scan's batch (the plan's auto rows; the dry run: a few) and a best-of-N wave's
#: packed rows against one prompt (GPU: prompt 2,048 x 64 rows of ~110 tokens, the profile's first call)
TUNE = {"gpu": {"scan_rows": None, "bon": (64, 110, 2048), "tries": None},
        "dry": {"scan_rows": 6, "bon": (3, 5, 24), "tries": 1}}  # the dry run: the plan's and one other (interpreter)

#: the crossover's row lengths (tokens a row feeds the layers: response + suffix) and tokens per timed batch
CROSSOVER = {"gpu": {"row_tokens": (2, 4, 8, 12, 16, 24, 32, 64), "tokens": 8192},
             "dry": {"row_tokens": (2, 8, 32), "tokens": 256}}
