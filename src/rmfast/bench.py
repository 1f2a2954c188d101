"""``rmfast bench``: rmfast against the plain Hugging Face baselines and the GEMM peak, in one process.

For each model (same prompt, same candidate ids), in one run:

* **naive** — the papers' pipeline: the full templated sequence per candidate, batched
  (:func:`rmfast.reference.reference_scores`); the better of a couple of batch sizes.
* **hf-cache** — the best plain-HF approach: the prompt's K/V computed once with
  ``model(prefix, use_cache=True)``; per batch the ``DynamicCache`` is deep-copied and
  ``batch_repeat_interleave(B)``-ed (HF appends to the cache along the sequence axis, so every
  batch needs its own per-row copy), and candidate + template suffix go through
  ``model(input_ids=..., past_key_values=cache)``. Score head: ``model.model(...)`` hidden state
  at the final position -> ``model.score``. Logprob head: the same log-softmax terms the engine sums.
* **rmfast** — :class:`rmfast.engine.Engine` at ``scan``'s automatic batch size.
* **GEMM peak** — ``torch.matmul`` throughput on the model's own projection shapes
  (q/k/v/o, gate/up/down, and the LM-head chunk for the logprob head) with M = the tokens of one
  rmfast batch, and the candidates/s that peak allows.

Model FLOPs per candidate (the "useful" work, the same number for every method):
``2 * N_gemm * t`` for the score head, ``2 * (N_gemm + V * D) * t`` for the logprob head, where
``N_gemm`` is the decoder's projection parameters (non-embedding, norms excluded), ``t`` the tokens
a candidate row runs through the layers (score: 1 + len(suffix); logprob: len(continuation)),
``V * D`` the LM head. Attention over the prompt (P * D per token per layer) is not counted.

Every method's scores are checked against rmfast's on the timed candidates (rank correlation and
max difference); a disagreement makes the command exit 1 after writing its results.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import platform
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .reference import flat_lm_head  # shared with the plain-HF reference

DEFAULT_PROMPT = "What, in one word, is the greatest thing ever?"
DEFAULT_OUT = os.path.join("benchmarks", "out")
METHODS = ("naive", "hf-cache", "rmfast-eager", "rmfast")


@dataclass(frozen=True)
class BenchModel:
    """One benchmark configuration: which model, which head, which template."""

    name: str
    spec: str
    head: str  # "score" | "logprob" | "auto"
    template: str | None = None  # None: the tokenizer's chat template, else lm.default_template
    random_head_seed: int | None = None
    note: str = ""


BENCH_MODELS = {
    "smollm2-135m-instruct": BenchModel(
        "smollm2-135m-instruct", "smollm2-135m-instruct", "score", None, 0,
        "SmolLM2-135M-Instruct as a 1-output classifier, seeded random head (seed 0); chat template",
    ),
    "gemma3-270m": BenchModel(
        "gemma3-270m", "gemma3-270m", "logprob", None, None,
        "Gemma 3 270M base, logprob head, plain template 'User: {prompt}\\nAssistant: {response}': the suffix is "
        "empty, so a one-token candidate's log-prob is one entry of the prompt pass's log-softmax (no per-row work)",
    ),
    "gemma3-270m@eot": BenchModel(
        "gemma3-270m@eot", "gemma3-270m", "logprob", "User: {prompt}\nAssistant: {response}<end_of_turn>", None,
        "Gemma 3 270M base, logprob head, template ending in <end_of_turn>: per row 1 token through the layers "
        "+ the 262,144-way LM head (log p(response) + log p(<end_of_turn> | response))",
    ),
}
DEFAULT_MODELS = "smollm2-135m-instruct,gemma3-270m,gemma3-270m@eot"


# ----------------------------------------------------------------------------- machine, memory, timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def machine_info(device: torch.device) -> dict:
    """Platform, CPU model, cores, torch threads, GPU name, load average."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = set(line.split(":", 1)[1].split())
                    flags = " ".join(x for x in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if x in fl)
                    break
    except OSError:
        pass
    info = {
        "platform": platform.platform(),
        "cpu_model": cpu,
        "cpu_flags": flags,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "loadavg_start": loadavg(),
    }
    return info


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def versions() -> dict:
    import transformers

    from .version import __version__

    return {"rmfast": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": sys.version.split()[0], "numpy": np.__version__}


class PeakMemory:
    """Peak memory of a code region: CUDA max_memory_allocated, or the process's peak RSS.

    On Linux the RSS high-water mark is reset through /proc/self/clear_refs, so each region gets
    its own peak; elsewhere it is the process-wide getrusage maximum (monotone; stated in `how`).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.how = "cuda.max_memory_allocated" if device.type == "cuda" else "rss"

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.how = "rss (VmHWM, reset per method)"
        except OSError:
            self.how = "rss (getrusage ru_maxrss, process-wide max)"

    def read_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r / 2**20 if sys.platform == "darwin" else r / 1024


def _chunks(ids: np.ndarray, bs: int):
    return [ids[i : i + bs] for i in range(0, ids.size, bs)]


def time_calls(fn, device: torch.device, repeats: int) -> tuple[np.ndarray, list[float]]:
    """Call ``fn() -> list of score tensors`` ``repeats`` times; (scores of the last call, seconds per call)."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        parts = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        out = torch.cat([p.float().cpu() for p in parts]).numpy()
    return out, times


def time_batches(fn, ids: np.ndarray, bs: int, device: torch.device, repeats: int) -> tuple[np.ndarray, list[float]]:
    """Score ``ids`` (one-token responses) in batches of ``bs``, ``repeats`` times; (scores, seconds per pass)."""
    return time_calls(lambda: [fn(torch.from_numpy(c)[:, None]) for c in _chunks(ids, bs)], device, repeats)


def pick_batch(fn, ids: np.ndarray, options, device: torch.device) -> tuple[int, dict | None]:
    """Warm each batch size up on one batch, time one more; the fastest per candidate wins.

    With a single option it only runs the warm-up batch (no probe).
    """
    options = sorted({int(min(b, ids.size)) for b in options})
    if len(options) == 1:
        fn(torch.from_numpy(ids[: options[0]])[:, None])  # warm-up
        _sync(device)
        return options[0], None
    probe = {bs: probe_batch(fn, ids, bs, device) for bs in options}
    return max(probe, key=probe.get), probe


def probe_batch(fn, ids: np.ndarray, bs: int, device: torch.device) -> float:
    """Candidates/s of one batch of ``bs`` after one warm-up batch of the same shape."""
    batch = torch.from_numpy(ids[:bs])[:, None]
    fn(batch)  # warm-up (allocator, oneDNN primitives / CUDA kernels for this shape)
    _sync(device)
    t0 = time.perf_counter()
    fn(batch)
    _sync(device)
    return round(bs / (time.perf_counter() - t0), 2)


# ----------------------------------------------------------------------------- model arithmetic


def model_dims(model, head: str) -> dict:
    """Projection parameter count and LM-head size, read off the engine's architecture spec."""
    from .models.arch import arch_spec

    sp = arch_spec(model)
    if sp is None:
        raise ValueError(f"architecture {model.config.model_type!r} is not on the fast path")
    shapes = []  # (K, N) per token per layer: x (M, K) @ W^T (K, N)
    for L in sp.layers:
        lin = [L.q_proj, L.k_proj, L.v_proj, L.o_proj]
        lin += [m for m in L.mlp.modules() if isinstance(m, torch.nn.Linear)]
        shapes += [(m.in_features, m.out_features) for m in lin]
    n_gemm = sum(k * n for k, n in shapes)
    V, D = (sp.lm_head_weight.shape if sp.lm_head_weight is not None else (None, None))
    return {
        "n_layers": len(sp.layers),
        "hidden": sp.layers[0].q_proj.in_features,
        "n_heads": sp.n_heads,
        "n_kv_heads": sp.n_kv_heads,
        "head_dim": sp.head_dim,
        "gemm_params": n_gemm,
        "lm_head_params": (V * D) if (head == "logprob" and V is not None) else 0,
        "vocab": V,
        "layer_shapes": shapes,
        "total_params": sum(p.numel() for p in model.parameters()),
    }


def engine_gemm_shapes(eng, dims: dict) -> list[tuple[int, int]]:
    """The (K, N) projection GEMMs per token as the engine runs them: fused q|k|v and gate|up where it
    fuses (its CPU default), the model's own Linear shapes otherwise. Same FLOPs either way."""
    fused = getattr(eng, "fused", None)
    if not fused:
        return dims["layer_shapes"]
    shapes = []
    for L, fw in zip(eng.spec.layers, fused):
        if L.q_norm is None:
            shapes.append((fw[0].shape[1], fw[0].shape[0]))  # q|k|v
        else:
            shapes += [(m.in_features, m.out_features) for m in (L.q_proj, L.k_proj, L.v_proj)]
        shapes.append((L.o_proj.in_features, L.o_proj.out_features))
        shapes.append((fw[2].shape[1], fw[2].shape[0]))  # gate|up
        shapes.append((L.mlp.down_proj.in_features, L.mlp.down_proj.out_features))
    return shapes


def flops_per_candidate(dims: dict, tokens_per_row: int) -> float:
    """2 * (projection params [+ LM head for logprob]) * tokens per candidate."""
    return 2.0 * (dims["gemm_params"] + dims["lm_head_params"]) * tokens_per_row


def gemm_peak(dims: dict, M: int, dtype: torch.dtype, device: torch.device, lm_chunk: int = 8192,
              min_time: float = 0.25, shapes: list[tuple[int, int]] | None = None) -> dict:
    """torch.matmul throughput on the model's distinct projection shapes at M rows.

    Each distinct (M, K, N) is timed (best of 3 trials of >= min_time/3 s each); the model-shaped peak
    is total FLOPs / total time over one token pass of every layer (shapes weighted by how often
    they occur), i.e. the rate a perfect engine would run those GEMMs at. The logprob head's LM-head
    GEMM is timed as the engine runs it: M rows × ``lm_chunk`` vocabulary rows, V / lm_chunk times.
    """
    counts: dict[tuple[int, int, int], float] = {}
    for K, N in shapes or dims["layer_shapes"]:
        counts[(M, K, N)] = counts.get((M, K, N), 0) + 1
    if dims["lm_head_params"]:
        V, D = dims["vocab"], dims["hidden"]
        key = (M, D, min(lm_chunk, V))
        counts[key] = counts.get(key, 0) + V / lm_chunk
    per_shape = {}
    tot_flops = tot_time = 0.0
    g = torch.Generator(device="cpu").manual_seed(0)
    for (m, K, N), c in counts.items():
        x = torch.randn(m, K, generator=g).to(device=device, dtype=dtype)
        w = torch.randn(N, K, generator=g).to(device=device, dtype=dtype)
        wt = w.t()  # the Linear layout: x @ W^T
        for _ in range(2):
            torch.matmul(x, wt)
        _sync(device)
        t0 = time.perf_counter()
        torch.matmul(x, wt)
        _sync(device)
        one = max(time.perf_counter() - t0, 1e-6)
        reps = max(1, int(min_time / 3 / one))
        best = float("inf")
        for _ in range(3):
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.matmul(x, wt)
            _sync(device)
            best = min(best, (time.perf_counter() - t0) / reps)
        f = 2.0 * m * K * N
        per_shape[f"{m}x{K}x{N}"] = round(f / best / 1e9, 1)
        tot_flops += f * c
        tot_time += best * c
        del x, w, wt
    return {"M": M, "gflops": tot_flops / tot_time / 1e9, "per_shape_gflops": per_shape}


# ----------------------------------------------------------------------------- GPU cost model

H100_SXM = {"name": "H100 SXM 80GB", "bf16_dense_tflops": 989.4, "hbm_tb_s": 3.35, "mem_gb": 80.0}

# Published configs. suffix = template ids after a one-token response (Llama 3: <|eot_id|>; Gemma 2:
# <end_of_turn>, "\n"); norms = RMSNorms per layer (Gemma 2's sandwich has 4).
COST_MODELS = {
    "llama3-8b-rm": {"label": "8B Llama-3 RM", "layers": 32, "d": 4096, "inter": 14336, "heads": 32, "kv_heads": 8,
                     "head_dim": 128, "vocab": 128256, "suffix": 1, "norms": 2},
    "gemma2-27b-rm": {"label": "27B Gemma-2 RM", "layers": 46, "d": 4608, "inter": 36864, "heads": 32, "kv_heads": 16,
                      "head_dim": 128, "vocab": 256000, "suffix": 2, "norms": 4},
}


def gpu_cost_model(cfg: dict, *, prompt_tokens: int = 50, gemm_frac: float = 0.6, hbm_frac: float = 0.8,
                   gpu: dict = H100_SXM, target_tokens_per_batch: int = 16384) -> dict:
    """Predicted full-vocabulary scan time for a one-output RM on one GPU (see benchmarks/README.md).

    GEMM time = V * 2 * N_proj * t / (gemm_frac * peak). Memory terms at hbm_frac of HBM bandwidth:
    weights re-read once per batch; activation traffic of unfused elementwise ops (an upper bound);
    for hf-cache, the per-row prompt K/V (copied, re-concatenated by the cache update, read by
    attention: 4x the K/V bytes per row), whose size also caps its batch.
    """
    L, d, I = cfg["layers"], cfg["d"], cfg["inter"]
    hq, hkv = cfg["heads"] * cfg["head_dim"], cfg["kv_heads"] * cfg["head_dim"]
    V, P, t = cfg["vocab"], prompt_tokens, 1 + cfg["suffix"]
    n_proj = L * (d * hq + 2 * d * hkv + hq * d + 3 * d * I)
    n_embed = V * d
    peak = gpu["bf16_dense_tflops"] * 1e12 * gemm_frac
    bw = gpu["hbm_tb_s"] * 1e12 * hbm_frac
    flops_gemm = 2 * n_proj * t
    flops_attn = L * t * 4 * (P + t) * hq  # QK^T and PV over the prompt + own suffix
    # bf16 bytes per token per layer through HBM by unfused elementwise ops / GEMM inputs+outputs
    act_elems = 2 * cfg["norms"] * d + 2 * (hq + 2 * hkv) + 2 * (hq + hkv) + 2 * hq + 10 * d + 6 * I
    act_bytes_tok = 2 * L * act_elems
    kv_row = 2 * L * hkv * P * 2  # bytes of the prompt's K and V for one row
    w_bytes = 2 * (n_proj + n_embed)
    free = gpu["mem_gb"] * 1e9 - w_bytes - 4e9  # 4 GB for the allocator, activations of small batches
    act_live_tok = 2 * (3 * I + 6 * d)  # live bytes per token at the MLP (gate, up, act + residuals)
    rows_rm = max(1, min(target_tokens_per_batch // t, int(free / (t * act_live_tok))))
    rows_hf = max(1, min(rows_rm, int(free / (2 * kv_row + t * act_live_tok))))  # copy + cat'ed copy
    out = {"model": cfg["label"], "vocab": V, "prompt_tokens": P, "tokens_per_candidate": t, "proj_params": n_proj,
           "gflop_per_candidate": flops_gemm / 1e9, "attn_gflop_per_candidate": flops_attn / 1e9,
           "act_mb_per_candidate": act_bytes_tok * t / 1e6, "kv_mib_per_row": kv_row / 2**20,
           "weights_gb": w_bytes / 1e9, "gemm_frac": gemm_frac, "hbm_frac": hbm_frac, "gpu": gpu["name"]}
    t_gemm = V * (flops_gemm + flops_attn) / peak
    t_act = V * t * act_bytes_tok / bw
    for name, rows, extra_row_bytes in (("rmfast", rows_rm, 0), ("hf-cache", rows_hf, 4 * kv_row)):
        t_w = -(-V // rows) * 2 * n_proj / bw
        t_kv = V * extra_row_bytes / bw
        out[name] = {"rows_per_batch": rows, "gemm_s": t_gemm, "weights_s": t_w, "activations_s_max": t_act,
                     "kv_copy_s": t_kv, "total_s_min": t_gemm + t_w + t_kv, "total_s_max": t_gemm + t_w + t_kv + t_act}
    tn = P + t  # naive: the whole sequence per candidate
    t_naive = V * (2 * n_proj * tn + L * 4 * tn * tn / 2 * hq) / peak
    out["naive"] = {"tokens_per_candidate": tn, "gemm_s": t_naive, "total_s_min": t_naive,
                    "total_s_max": t_naive + V * tn * act_bytes_tok / bw}
    return out


def format_cost_model(rows: list[dict]) -> str:
    hdr = ("| model | V | t | GFLOP/cand | act. MB/cand (max) | prompt KV MiB/row | rmfast s | hf-cache s | naive s | "
           "rmfast vs hf-cache | rmfast vs naive |")
    out = [hdr, "|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|"]
    for r in rows:
        rm, hf, nv = r["rmfast"], r["hf-cache"], r["naive"]
        out.append(
            f"| {r['model']} | {r['vocab']:,} | {r['tokens_per_candidate']} | {r['gflop_per_candidate']:.1f} | "
            f"{r['act_mb_per_candidate']:.0f} | {r['kv_mib_per_row']:.2f} | {rm['total_s_min']:.1f}–{rm['total_s_max']:.1f} | "
            f"{hf['total_s_min']:.1f}–{hf['total_s_max']:.1f} | {nv['total_s_min']:,.0f}–{nv['total_s_max']:,.0f} | "
            f"{hf['total_s_min'] / rm['total_s_min']:.2f}–{hf['total_s_max'] / rm['total_s_max']:.2f}× | "
            f"{nv['total_s_min'] / rm['total_s_min']:.0f}–{nv['total_s_max'] / rm['total_s_max']:.0f}× |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the hf-cache baseline




class HFCacheScorer:
    """Plain Hugging Face with the prompt's KV cache reused: the strongest baseline without rmfast.

    The prompt runs once (``use_cache=True``). Each batch gets a deep copy of that cache repeated
    per row (``batch_repeat_interleave``), because HF's cache grows along the sequence axis in
    place; the candidate + template suffix then run with ``past_key_values=cache``. The LM head runs
    under :func:`flat_lm_head` (a torch CPU accident, not the method's cost).
    """

    def __init__(self, model, template, *, head: str, head_index: int = 0):
        self.model, self.template, self.head, self.head_index = model, template, head, head_index
        self.device = next(model.parameters()).device
        self.suffix = torch.tensor(template.suffix_ids, dtype=torch.long, device=self.device)
        self.cont = torch.tensor(template.continuation_ids, dtype=torch.long, device=self.device)
        prefix = torch.tensor([template.prefix_ids], dtype=torch.long, device=self.device)
        with torch.no_grad(), flat_lm_head(model):
            if head == "score":
                out = model.model(input_ids=prefix, use_cache=True)
                self.prefix_lp = None
            else:
                out = model(input_ids=prefix, use_cache=True, logits_to_keep=1)
                self.prefix_lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # (V,)
        self.cache = out.past_key_values

    def _cache_for(self, B: int):
        c = copy.deepcopy(self.cache)
        c.batch_repeat_interleave(B)
        return c

    @torch.no_grad()
    def score(self, responses: torch.Tensor) -> torch.Tensor:
        responses = responses.to(self.device)
        B, n = responses.shape
        if self.head == "score":
            ids = torch.cat([responses, self.suffix.expand(B, -1)], dim=1)
            h = self.model.model(input_ids=ids, past_key_values=self._cache_for(B), use_cache=True).last_hidden_state
            return self.model.score(h[:, -1]).float()[:, self.head_index]
        total = self.prefix_lp[responses[:, 0]].clone()
        targets = torch.cat([responses[:, 1:], self.cont.expand(B, -1)], dim=1)
        T = targets.shape[1]
        if T == 0:
            return total
        ids = torch.cat([responses, self.cont[:-1].expand(B, -1)], dim=1)[:, :T]
        with flat_lm_head(self.model):
            logits = self.model(input_ids=ids, past_key_values=self._cache_for(B), use_cache=True, logits_to_keep=T).logits
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]  # (B, T)
        return total + lp.sum(-1)


# ----------------------------------------------------------------------------- agreement


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    r = np.empty(x.size, dtype=np.float64)
    r[order] = np.arange(x.size, dtype=np.float64)
    return r


def agreement(ref: np.ndarray, other: np.ndarray, k: int = 20) -> dict:
    """Spearman rho (tie-free ranks), max |diff|, that relative to the score spread, top-k overlap."""
    ref, other = np.asarray(ref, np.float64), np.asarray(other, np.float64)
    rho = float(np.corrcoef(_ranks(ref), _ranks(other))[0, 1]) if ref.size > 2 else 1.0
    d = np.abs(ref - other)
    spread = float(ref.std()) or 1.0
    kk = min(k, ref.size)
    top = len(set(np.argsort(-ref)[:kk]) & set(np.argsort(-other)[:kk])) / kk
    return {"spearman": round(rho, 6), "max_abs_diff": float(d.max()), "max_diff_over_std": float(d.max() / spread),
            "frac_exact": float(np.mean(d == 0)), f"top{kk}_overlap": top}


def close_ok(ref: np.ndarray, other: np.ndarray, atol: float = 2e-4, rtol: float = 1e-4) -> bool:
    """fp32 exactness: |other - ref| <= atol + rtol * |ref| everywhere (op order differs, the maths does not)."""
    ref, other = np.asarray(ref, np.float64), np.asarray(other, np.float64)
    return bool(np.all(np.abs(other - ref) <= atol + rtol * np.abs(ref)))


def _params_to(model, dtype: torch.dtype) -> None:
    """Cast parameters only (rotary inv_freq and other buffers keep their dtype); bf16 -> fp32 -> bf16 is lossless."""
    for prm in model.parameters():
        prm.data = prm.data.to(dtype)


# ----------------------------------------------------------------------------- one model


def candidate_ids(n_vocab: int, n: int, seed: int = 0) -> np.ndarray:
    """n ids spread over the whole vocabulary (seeded), in random order so any prefix is a fair sample."""
    rng = np.random.default_rng(seed)
    return rng.permutation(n_vocab)[: min(n, n_vocab)].astype(np.int64)


def device_defaults(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"n_candidates": 65536, "n_naive": 4096, "naive_batches": (256, 1024), "hf_batches": (512, 2048),
                "repeats": 3, "check_n": 256}
    return {"n_candidates": 2048, "n_naive": 128, "naive_batches": (32, 64, 128), "hf_batches": (64, 128, 256),
            "repeats": 3, "check_n": 32}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_model(cfg: BenchModel, lm, args, device: torch.device, dflt: dict) -> tuple[list[dict], dict]:
    """All methods on one model configuration; returns (rows, extras)."""
    from .engine import Engine
    from .reference import reference_scores
    from .pipeline import scan
    from .resolve import auto_batch_size, default_head, even_batch
    from .vocab import vocab_size
    from .template import build_template

    model, tok = lm.model, lm.tokenizer
    head = default_head(model) if cfg.head == "auto" else cfg.head
    tmpl_str = cfg.template if cfg.template is not None else lm.default_template
    tmpl = build_template(tok, args.prompt, template=tmpl_str)
    dtype = next(model.parameters()).dtype
    n_vocab = vocab_size(model, tok)
    dims = model_dims(model, head)
    mem = PeakMemory(device)
    n = args.n_candidates or dflt["n_candidates"]
    n_naive = min(args.n_naive or dflt["n_naive"], n)
    reps = args.repeats or dflt["repeats"]
    ids = candidate_ids(n_vocab, n, seed=args.seed)
    n = ids.size
    load_start = loadavg()

    # --- rmfast (compiled CPU layer where it applies) and rmfast-eager (the same engine, not compiled)
    compile_rm = device.type == "cpu" and args.compile != "off"
    mem.reset()
    _sync(device)
    t0 = time.perf_counter()
    eng = Engine(model, tmpl, head=head, compile=compile_rm)
    _sync(device)
    setup_rm = time.perf_counter() - t0
    tpr = eng.tokens_per_row(1)
    # No per-row work (logprob head, empty continuation): every candidate's score is one entry of the
    # prompt pass's log-softmax. Then the prompt pass IS the work: rmfast and hf-cache are timed over the
    # whole vocabulary, prompt pass included (setup_s = 0), and candidates/s is the full-scan rate.
    whole = tpr == 0
    if whole:
        ids = candidate_ids(n_vocab, n_vocab, seed=args.seed)  # same permutation: naive's ids are its first ones
        n = ids.size
    bs_rm = min(args.batch_size or even_batch(n, auto_batch_size(device, max(1, tpr))), n)
    compile_s = None
    t_eg = s_eg = None
    if whole:
        def run_rm():
            e = Engine(model, tmpl, head=head)
            return [e.score(torch.from_numpy(c)[:, None]) for c in _chunks(ids, bs_rm)]

        run_rm()  # warm-up
        s_rm, t_rm = time_calls(run_rm, device, reps)
        setup_rm = 0.0
        compile_rm = False
    else:
        _sync(device)
        t0 = time.perf_counter()
        eng.score(torch.from_numpy(ids[:bs_rm])[:, None])  # warm-up batch (+ the one-off compile)
        _sync(device)
        first = time.perf_counter() - t0
        compile_rm = compile_rm and eng.compile  # False if torch.compile failed here (warned)
        s_rm, t_rm = time_batches(eng.score, ids, bs_rm, device, reps)
        if compile_rm:
            compile_s = max(0.0, first - min(t_rm) * bs_rm / n)  # warm-up batch minus a timed batch
            eager = Engine(model, tmpl, head=head)
            eager.score(torch.from_numpy(ids[:bs_rm])[:, None])
            s_eg, t_eg = time_batches(eager.score, ids, bs_rm, device, reps)
            del eager
    mem_rm = mem.read_mib()
    log(f"  rmfast    batch {bs_rm:5d}: {n / min(t_rm):10.1f} cand/s  (passes {', '.join(f'{t:.2f}' for t in t_rm)} s)"
         + (f"  [compiled; compile {compile_s:.1f} s]" if compile_rm else "")
         + ("  [no per-row work: whole vocabulary, prompt pass included]" if whole else ""))
    if t_eg is not None:
        log(f"  rmfast-eager batch {bs_rm:5d}: {n / min(t_eg):10.1f} cand/s")

    # --- GEMM peak at the rmfast batch's M
    fpc = flops_per_candidate(dims, tpr)
    peak = None
    if tpr > 0 and not args.no_peak:
        from .kernels.cpu_logprob import CHUNK

        peak = gemm_peak(dims, bs_rm * tpr, dtype, device, shapes=engine_gemm_shapes(eng, dims),
                         lm_chunk=CHUNK if device.type == "cpu" else 8192)
        log(f"  GEMM peak M={bs_rm * tpr}: {peak['gflops']:.1f} GFLOP/s -> {peak['gflops'] * 1e9 / fpc:.1f} cand/s")

    # --- hf-cache
    mem.reset()
    _sync(device)
    t0 = time.perf_counter()
    hfc = HFCacheScorer(model, tmpl, head=head)
    _sync(device)
    setup_hf = time.perf_counter() - t0
    if whole:
        bs_hf, probe_hf = n, None

        def run_hf():
            h = HFCacheScorer(model, tmpl, head=head)
            return [h.score(torch.from_numpy(ids)[:, None])]

        run_hf()  # warm-up
        s_hf, t_hf = time_calls(run_hf, device, reps)
        setup_hf = 0.0
    else:
        bs_hf, probe_hf = pick_batch(hfc.score, ids, dflt["hf_batches"] if not args.hf_batch else (args.hf_batch,), device)
        s_hf, t_hf = time_batches(hfc.score, ids, bs_hf, device, reps)
    mem_hf = mem.read_mib()
    log(f"  hf-cache  batch {bs_hf:5d}: {n / min(t_hf):10.1f} cand/s" + (f"  (probe {probe_hf})" if probe_hf else ""))
    del hfc

    # --- naive
    ids_nv = ids[:n_naive]

    def naive_fn(batch_bs):
        def f(b):  # reference_scores batches internally (logprob: at most ~5e7 fp32 logits per batch)
            with flat_lm_head(model):
                return reference_scores(model, tmpl, b.tolist(), head=head, batch_size=batch_bs)

        return f

    mem.reset()
    opts = sorted({min(b, n_naive) for b in (dflt["naive_batches"] if not args.naive_batch else (args.naive_batch,))})
    probe_nv = None
    if len(opts) == 1:
        bs_nv = opts[0]
        naive_fn(bs_nv)(torch.from_numpy(ids_nv[:bs_nv])[:, None])  # warm-up batch
    else:
        probe_nv = {bs: probe_batch(naive_fn(bs), ids_nv, bs, device) for bs in opts}
        bs_nv = max(probe_nv, key=probe_nv.get)
    s_nv, t_nv = time_calls(lambda: [naive_fn(bs_nv)(torch.from_numpy(ids_nv)[:, None])], device, reps)
    if head == "logprob":  # the cap reference_scores applies (same formula), so the table shows the real batch
        bs_nv = max(1, min(bs_nv, int(5e7 // ((1 + len(tmpl.continuation_ids) + 1) * model.config.get_text_config().vocab_size))))
    mem_nv = mem.read_mib()
    log(f"  naive     batch {bs_nv:5d}: {n_naive / min(t_nv):10.1f} cand/s" + (f"  (probe {probe_nv})" if probe_nv else ""))

    # --- agreement with rmfast on the timed candidates (in the benchmark dtype) ...
    agr_hf = agreement(s_rm, s_hf)
    agr_nv = agreement(s_rm[:n_naive], s_nv)
    agr_eg = agreement(s_rm, s_eg) if s_eg is not None else None
    floor = agreement(s_hf[:n_naive], s_nv)  # two plain-HF paths: the dtype's own noise floor
    min_rho = min(0.99, floor["spearman"] - 0.01)
    for a in (agr_hf, agr_nv, agr_eg):
        if a is not None:
            a["ok"] = a["spearman"] >= min_rho
    # ... and exactness in fp32 on the first check_n of them (same weights, parameters cast up and back)
    check_n = min(n_naive, dflt["check_n"] if args.check_n is None else args.check_n)
    exact = None
    if check_n > 0:
        exact = fp32_check(model, tmpl, head, ids[:check_n], device, dtype, compile=compile_rm)
        agr_hf["ok"] = agr_hf["ok"] and exact["hf-cache_ok"]
        agr_nv["ok"] = agr_nv["ok"] and exact["naive_ok"]
        if agr_eg is not None:
            agr_eg["ok"] = agr_eg["ok"] and exact["rmfast-eager_ok"]
        log(f"  fp32 check on {check_n} ids: max |rmfast - hf-cache| {exact['hf-cache_max_abs_diff']:.2e}, "
             f"max |rmfast - naive| {exact['naive_max_abs_diff']:.2e}")

    # --- optional full-vocabulary scan
    full = None
    if args.full:
        mem.reset()
        res = scan(model, tok, args.prompt, head=head, template=tmpl, engine="fast", progress=False,
                   batch_size=args.batch_size or "auto", compile=args.compile)
        full = {"n_candidates": int(res.manifest["n_candidates"]), "wall_s": res.manifest["wall_s"],
                "scan_s": res.manifest["scan_s"], "candidates_per_s": res.manifest["candidates_per_s"],
                "batch_size": res.manifest["batch_size"], "peak_mem_mib": round(mem.read_mib(), 1),
                "compiled": res.manifest.get("compiled"), "first_batch_s": res.manifest.get("first_batch_s")}
        log(f"  rmfast full vocabulary ({full['n_candidates']} ids): {full['wall_s']:.1f} s wall, "
             f"{full['candidates_per_s']} cand/s")

    # --- rows
    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    cand_rm = n / min(t_rm)
    common = {
        "model": cfg.name, "model_spec": cfg.spec, "head": head, "template_kind": tmpl.kind,
        "prefix_tokens": P, "suffix_tokens": S, "tokens_per_candidate": tpr, "vocab": n_vocab,
        "device": str(device), "dtype": str(dtype).replace("torch.", ""),
        "gemm_params": dims["gemm_params"], "lm_head_params": dims["lm_head_params"],
        "flops_per_candidate": fpc if tpr > 0 else None,
        "gemm_peak_gflops": round(peak["gflops"], 1) if peak else None,
        "gemm_peak_M": peak["M"] if peak else None,
        "peak_bound_cand_per_s": round(peak["gflops"] * 1e9 / fpc, 1) if peak else None,
        "mem_how": mem.how, "loadavg_start": load_start, "loadavg_end": loadavg(),
        "whole_vocab_timed": whole,
        "rmfast_compiled": bool(compile_rm), "compile_s": round(compile_s, 2) if compile_s is not None else None,
    }
    rows = []
    methods = [
        ("naive", n_naive, t_nv, bs_nv, 0.0, mem_nv, agr_nv, probe_nv, P + 1 + S),
        ("hf-cache", n, t_hf, bs_hf, setup_hf, mem_hf, agr_hf, probe_hf, tpr),
    ]
    if t_eg is not None:
        methods.append(("rmfast-eager", n, t_eg, bs_rm, setup_rm, mem_rm, agr_eg, None, tpr))
    # rmfast's one-off compile is part of its cost for one scan: est_full_vocab_s includes it
    methods.append(("rmfast", n, t_rm, bs_rm, setup_rm + (compile_s or 0.0), mem_rm, None, None, tpr))
    for method, cnt, times, bs, setup, m, agr, probe, executed in methods:
        cps = cnt / min(times)
        row = dict(common)
        row.update({
            "method": method, "n_timed": cnt, "batch_size": bs, "batch_probe": probe,
            "tokens_executed_per_candidate": executed, "repeats": len(times),
            "pass_s": [round(t, 4) for t in times], "cand_per_s": round(cps, 2),
            "cand_per_s_median": round(cnt / float(np.median(times)), 2),
            "rmfast_speedup": round(cand_rm / cps, 2),
            "useful_gflops": round(fpc * cps / 1e9, 2) if tpr > 0 else None,
            "frac_gemm_peak": round(fpc * cps / 1e9 / peak["gflops"], 4) if peak else None,
            "setup_s": round(setup, 4),
            "est_full_vocab_s": round(setup + n_vocab / cps, 2),
            "peak_mem_mib": round(m, 1),
            "agree_spearman": agr["spearman"] if agr else None,
            "agree_max_abs_diff": agr["max_abs_diff"] if agr else None,
            "agree_max_diff_over_std": agr["max_diff_over_std"] if agr else None,
            "agree_ok": agr["ok"] if agr else None,
            "fp32_max_abs_diff": (exact[f"{method}_max_abs_diff"] if exact and agr else None),
        })
        rows.append(row)
    if full:
        row = dict(common)
        row.update({"method": "rmfast-full", "n_timed": full["n_candidates"], "batch_size": full["batch_size"],
                    "cand_per_s": full["candidates_per_s"], "full_wall_s": full["wall_s"], "full_scan_s": full["scan_s"],
                    "peak_mem_mib": full["peak_mem_mib"],
                    "useful_gflops": round(fpc * full["candidates_per_s"] / 1e9, 2) if tpr > 0 else None})
        rows.append(row)
    extras = {"model": cfg.name, "note": cfg.note, "source": lm.source, "template": tmpl.manifest(),
              "dims": {k: v for k, v in dims.items() if k != "layer_shapes"}, "gemm_peak": peak,
              "agreement": {"hf-cache_vs_rmfast": agr_hf, "naive_vs_rmfast": agr_nv, "naive_vs_hf-cache_floor": floor,
                            "rmfast-eager_vs_rmfast": agr_eg,
                            "min_spearman": min_rho, "fp32_check": exact}, "full": full}
    if args.profile:
        extras["profile"] = profile_engine(eng, ids, bs_rm, device, n_batches=args.profile)
    del eng
    return rows, extras


def fp32_check(model, tmpl, head: str, ids: np.ndarray, device: torch.device, dtype: torch.dtype,
               compile: bool = False) -> dict:
    """All methods on ``ids`` with the model's parameters in fp32: the scores must be equal up to
    fp32 rounding (:func:`close_ok`). The model is cast back to ``dtype`` afterwards. With ``compile``
    rmfast is the compiled engine and the eager engine is checked against it too."""
    from .engine import Engine
    from .reference import reference_scores

    c = torch.from_numpy(ids)[:, None]
    try:
        if dtype != torch.float32:
            _params_to(model, torch.float32)
        rm = Engine(model, tmpl, head=head, compile=compile).score(c).float().cpu().numpy()
        eg = Engine(model, tmpl, head=head).score(c).float().cpu().numpy() if compile else None
        hf = HFCacheScorer(model, tmpl, head=head).score(c).float().cpu().numpy()
        with flat_lm_head(model):
            nv = reference_scores(model, tmpl, c.tolist(), head=head, batch_size=len(ids)).numpy()
    finally:
        if dtype != torch.float32:
            _params_to(model, dtype)
    # CPU: the same fp32 maths in another order. CUDA: also other kernels (cuBLAS/Triton split-K, atomics).
    atol, rtol = (2e-4, 1e-4) if device.type == "cpu" else (1e-3, 1e-3)
    out = {"n": int(ids.size), "atol": atol, "rtol": rtol}
    for name, x in (("hf-cache", hf), ("naive", nv)) + ((("rmfast-eager", eg),) if eg is not None else ()):
        out[f"{name}_max_abs_diff"] = float(np.abs(x.astype(np.float64) - rm).max())
        out[f"{name}_ok"] = close_ok(rm, x, atol=atol, rtol=rtol)
    return out


def profile_engine(eng, ids: np.ndarray, bs: int, device: torch.device, n_batches: int = 3, top: int = 15) -> dict:
    """torch.profiler over a few engine batches: the top ops by self time.

    Without per-row work (tokens_per_row(1) == 0) the prompt pass is the work: each "batch" is then
    a fresh Engine (prompt pass + log-softmax over the vocabulary) scoring ``bs`` ids.
    """
    from torch.profiler import ProfilerActivity, profile

    from .engine import Engine

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    batches = [torch.from_numpy(c)[:, None] for c in _chunks(np.resize(ids, bs * n_batches), bs)][:n_batches]
    whole = eng.tokens_per_row(1) == 0

    def step(b):
        e = Engine(eng.model, eng.template, head=eng.head, head_index=eng.head_index) if whole else eng
        return e.score(b)

    step(batches[0])
    with profile(activities=acts) as prof:
        for b in batches:
            step(b)
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    ka = prof.key_averages()
    total = sum(getattr(e, key, 0) for e in ka) or 1
    rows = []
    for e in sorted(ka, key=lambda e: getattr(e, key), reverse=True)[:top]:
        rows.append({"op": e.key, "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 2),
                     "self_pct": round(100 * getattr(e, key) / total, 1)})
    return {"sort": key, "batch_size": bs, "n_batches": n_batches, "whole_vocab": whole, "top": rows,
            "table": ka.table(sort_by=key, row_limit=top)}


# ----------------------------------------------------------------------------- outputs


CSV_FIELDS = [
    "model", "method", "head", "device", "dtype", "n_timed", "batch_size", "tokens_per_candidate",
    "tokens_executed_per_candidate", "flops_per_candidate", "cand_per_s", "cand_per_s_median", "rmfast_speedup",
    "useful_gflops", "gemm_peak_gflops", "frac_gemm_peak", "peak_bound_cand_per_s", "setup_s", "est_full_vocab_s",
    "full_wall_s", "peak_mem_mib", "agree_spearman", "agree_max_abs_diff", "fp32_max_abs_diff", "agree_ok",
    "prefix_tokens",
    "suffix_tokens", "vocab", "gemm_params", "lm_head_params", "gemm_peak_M", "repeats", "pass_s", "loadavg_start",
    "loadavg_end", "cpu_model", "cpu_count", "torch_threads", "gpu", "platform", "torch", "transformers", "rmfast",
    "timestamp",
]


def write_outputs(rows: list[dict], meta: dict, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = meta["timestamp"].replace(":", "").replace("-", "")
    flat = []
    for r in rows:
        f = dict(r)
        f.update({k: meta["machine"].get(k) for k in ("cpu_model", "cpu_count", "torch_threads", "gpu", "platform")})
        f.update({k: meta["versions"].get(k) for k in ("torch", "transformers", "rmfast")})
        f["timestamp"] = meta["timestamp"]
        flat.append(f)
    paths = {}
    for name in (f"bench_{stamp}", "bench_latest"):
        p = out_dir / f"{name}.csv"
        with open(p, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for f in flat:
                w.writerow({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in f.items()})
        j = out_dir / f"{name}.json"
        j.write_text(json.dumps({**meta, "rows": flat}, indent=1, default=str))
        paths[name] = (p, j)
    return paths


def plot(rows: list[dict], path: Path, title: str) -> Path | None:
    """Bar chart of candidates/s per method per model (log scale) with the GEMM-peak bound."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("note: matplotlib is not installed; skipping the plot (pip install matplotlib)")
        return None
    models = list(dict.fromkeys(r["model"] for r in rows))
    colors = {"naive": "#9e9e9e", "hf-cache": "#4c72b0", "rmfast-eager": "#f0b27a", "rmfast": "#dd8452"}
    fig, ax = plt.subplots(figsize=(2.2 + 3.6 * len(models), 5.2))
    width = 0.2
    ymax = 1.0
    for i, m in enumerate(models):
        by = {r["method"]: r for r in rows if r["model"] == m}
        for j, meth in enumerate(METHODS):
            r = by.get(meth)
            if not r:
                continue
            x = i + (j - 1.5) * width
            v = r["cand_per_s"]
            ymax = max(ymax, v)
            ax.bar(x, v, width * 0.92, color=colors[meth], label=meth if i == 0 else None)
            lab = f"{v:,.0f}" if v >= 10 else f"{v:.1f}"
            if meth != "rmfast":
                x_ = r["rmfast_speedup"]
                lab += f"\n(×{x_:,.0f})" if x_ >= 100 else f"\n(×{x_:.1f})"
            ax.text(x, v * 1.08, lab, ha="center", va="bottom", fontsize=8)
        pk = by.get("rmfast", {}).get("peak_bound_cand_per_s")
        if pk:
            ymax = max(ymax, pk)
            ax.hlines(pk, i - 2.1 * width, i + 2.1 * width, colors="crimson", linestyles="--",
                      label="GEMM-peak bound" if not any(t.get_label() == "GEMM-peak bound" for t in ax.collections) else None)
            ax.text(i + 2.1 * width, pk, f" peak\n {pk:,.0f}", color="crimson", fontsize=8, va="center", ha="left")
    ax.set_yscale("log")
    ax.set_ylim(top=ymax * 12)
    ticks = []
    for m in models:
        r = next(r for r in rows if r["model"] == m)
        sub = ("whole vocab, no per-row work" if r.get("whole_vocab_timed")
               else f"{r['head']} head, {r['tokens_per_candidate']} tok/cand")
        ticks.append(f"{m}\n{sub}")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(ticks, fontsize=9)
    ax.set_xlim(-0.6, len(models) - 0.2)
    ax.set_ylabel("candidates / s (log scale; higher is better)")
    ax.text(0.99, 0.985, "(×N): rmfast is N× faster", transform=ax.transAxes, ha="right", va="top", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles, labels, loc="upper left", fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def format_table(rows: list[dict]) -> str:
    """A Markdown table of the measured rows."""
    head = ("| model | method | batch | cand/s | rmfast × | useful GFLOP/s | % GEMM peak | peak mem MiB | "
            "est. full vocab | agrees with rmfast: bf16 ρ, fp32 max abs diff |")
    out = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for r in rows:
        if r["method"] == "rmfast-full":
            ug = f"{r['useful_gflops']:,.1f}" if r.get("useful_gflops") is not None else "–"
            out.append(f"| {r['model']} | rmfast full vocab ({r['n_timed']:,}) | {r['batch_size']} | "
                       f"{r['cand_per_s']:,.1f} | | {ug} | | {r['peak_mem_mib']:,.0f} | "
                       f"{r['full_wall_s']:.1f} s wall ({r['full_scan_s']:.1f} s scoring) | |")
            continue
        fr = f"{100 * r['frac_gemm_peak']:.1f}%" if r.get("frac_gemm_peak") is not None else "–"
        ug = f"{r['useful_gflops']:,.1f}" if r.get("useful_gflops") is not None else "–"
        est = r["est_full_vocab_s"]
        est_s = f"{est / 3600:.1f} h" if est > 7200 else (f"{est / 60:.1f} min" if est > 120 else f"{est:.1f} s")
        ag = "(reference)" if r.get("agree_ok") is None else (
            f"{'yes' if r['agree_ok'] else 'NO'}: {r['agree_spearman']:.4f}, "
            + (f"{r['fp32_max_abs_diff']:.1e}" if r.get("fp32_max_abs_diff") is not None else "–"))
        out.append(f"| {r['model']} | {r['method']} | {r['batch_size']} | {r['cand_per_s']:,.1f} | "
                   f"{r['rmfast_speedup']:,.1f} | {ug} | {fr} | {r['peak_mem_mib']:,.0f} | {est_s} | {ag} |")
    return "\n".join(out)


# ----------------------------------------------------------------------------- command


def resolve_models(spec: str) -> list[BenchModel]:
    out = []
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        out.append(BENCH_MODELS.get(name) or BenchModel(name, name, "auto", None, None, "user-given model"))
    return out
