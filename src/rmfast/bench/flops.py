"""Model arithmetic of ``rmfast bench``: projection shapes, FLOPs per candidate, the measured GEMM
peak on those shapes, and the analytic GPU cost model (``rmfast bench --cost-model``)."""

from __future__ import annotations

import time

import torch

from ..dims import model_dims as config_dims
from .machine import log, sync


def model_dims(model, head: str) -> dict:
    """Projection parameter count and LM-head size, read off the engine's architecture spec; the
    dimensions are the config's (:func:`rmfast.dims.model_dims`: the same numbers, tests/test_one_definition.py).

    FLOPs are counted on the GEMMs (2 per weight per token). The RMSNorms, q/k norms included
    (Qwen3, Gemma 3: ~4·(H + Hkv)·D per token per layer, < 0.1% of a layer's GEMM FLOPs), RoPE and
    the activations are elementwise work, not counted; ``qk_norm`` says whether a model has them.
    """
    from ..fast.arch import arch_spec

    sp = arch_spec(model)
    if sp is None:
        raise ValueError(f"architecture {model.config.model_type!r} is not on the fast path")
    shapes = []  # (K, N) per token per layer: x (M, K) @ W^T (K, N), each projection as the model stores it
    for L in sp.layers:
        shapes += [(m.in_features, m.out_features) for m in L.linears()]
    n_gemm = sum(k * n for k, n in shapes)
    V, D = (sp.lm_head_weight.shape if sp.lm_head_weight is not None else (None, None))
    dims = config_dims(model.config)
    return {
        "n_layers": dims.layers,
        "hidden": dims.hidden,
        "n_heads": dims.heads,
        "n_kv_heads": dims.kv_heads,
        "head_dim": dims.head_dim,
        "intermediate": dims.intermediate,
        "qk_norm": sp.layers[0].q_norm is not None,
        "gemm_params": n_gemm,
        "lm_head_params": (V * D) if (head == "logprob" and V is not None) else 0,
        "vocab": V,
        "layer_shapes": shapes,
        "windows": [L.window for L in sp.layers],  # per layer: its sliding window, or None (forward_flops' pairs)
        "total_params": sum(p.numel() for p in model.parameters()),
    }


def engine_gemm_shapes(eng, dims: dict) -> list[tuple[int, int]]:
    """The (K, N) projection GEMMs per token as the engine runs them (:func:`rmfast.fast.layer.build_layers`):
    one q|k|v and one gate|up GEMM per layer where it fuses (its CPU default; q/k-norm layers too,
    the norms run on the fused output), the separate ones otherwise. Same FLOPs either way."""
    if eng is None:
        return dims["layer_shapes"]
    shapes = []
    for w, _ in eng.layers:
        for t in (*w.w_qkv, w.w_o, *w.w_gate_up, w.w_down):
            shapes.append((t.shape[1], t.shape[0]))  # weight (N, K)
    return shapes


def narrow_params(dims: dict, q: bool = True) -> int:
    """The last layer's projection weights that only the positions the head reads need: q and o (``D x H*hd``
    each) and the MLP (``3 * D x I``). Keys and values are needed at every position (the head's position attends to
    them), so k and v are not in it. rmfast's engine computes the last layer only where the head reads
    (:mod:`rmfast.fast.engine`), except q where it runs one fused q|k|v GEMM (its CPU default: ``q=False``); a
    plain Hugging Face forward computes it everywhere."""
    D, I, hq = dims["hidden"], dims["intermediate"], dims["n_heads"] * dims["head_dim"]
    return (2 if q else 1) * D * hq + 3 * D * I


def narrowed_tokens(dims: dict, tokens: float, outputs: float) -> float:
    """Tokens whose full projection work equals rmfast's for ``tokens`` run through the layers when its last layer's
    q, o and MLP run at only ``outputs`` of them (the head's positions: one per prompt pass and per row of a score
    head), for FLOP ratios and GEMM fractions counted in tokens.

        >>> narrowed_tokens({"gemm_params": 100, "hidden": 2, "n_heads": 1, "head_dim": 2, "intermediate": 3}, 10, 2)
        7.92
    """
    return tokens - (tokens - outputs) * narrow_params(dims) / dims["gemm_params"]


def flops_per_candidate(dims: dict, tokens_per_row: int, n_out: int | None = None, q: bool = True) -> float:
    """Projection FLOPs of one candidate row: ``2 * (params [+ LM head for logprob]) * tokens``; with ``n_out``, the
    last layer's q, o and MLP only at the final ``n_out`` positions (:func:`narrow_params`: what the score needs, and
    what rmfast runs, its q at every position where ``q`` is False; a score head reads one position). None: every
    position (a plain forward; the logprob head, which reads every row position).

        >>> d = {"gemm_params": 100, "lm_head_params": 0, "hidden": 2, "n_heads": 1, "head_dim": 2, "intermediate": 3}
        >>> flops_per_candidate(d, 2), flops_per_candidate(d, 2, n_out=1)    # narrow = 2*2*2 + 3*2*3 = 26
        (400.0, 348.0)
    """
    cut = 0 if n_out is None else (tokens_per_row - n_out) * narrow_params(dims, q)
    return 2.0 * ((dims["gemm_params"] + dims["lm_head_params"]) * tokens_per_row - cut)


def proj_params(dims: dict) -> int:
    """Projection weights of the decoder, from its dims: ``L * (2*D*H*hd + 2*D*Hkv*hd + 3*D*I)``.

    q and o are D x H*hd each, k and v D x Hkv*hd each, gate, up and down D x I each (``L`` layers,
    ``D`` hidden, ``H`` / ``Hkv`` query / key-value heads of ``hd`` dims, ``I`` intermediate). Biases,
    norms and embeddings are not counted. Equals :func:`model_dims`' ``gemm_params`` for the
    Llama / Gemma / Qwen layouts (fused q|k|v or gate|up store the same weights).
    """
    D, I = dims["hidden"], dims["intermediate"]
    hq, hkv = dims["n_heads"] * dims["head_dim"], dims["n_kv_heads"] * dims["head_dim"]
    return dims["n_layers"] * (2 * D * hq + 2 * D * hkv + 3 * D * I)


def keys_seen(n: int, window: int | None) -> int:
    """(query, key) pairs of the first ``n`` positions of a causal sequence: position j sees j + 1 keys, at most
    ``window`` (a sliding window; None: all)."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def layer_windows(windows, n_layers: int) -> list:
    """Each layer's sliding window (None: full attention) from ``windows`` (None or empty: every layer full), refusing
    a list of another length (a short list would drop layers' attention without a word).

    >>> layer_windows(None, 2), layer_windows([4, None], 2)
    ([None, None], [4, None])
    """
    if not windows:
        return [None] * n_layers
    if len(windows) != n_layers:
        raise ValueError(f"windows: {len(windows)} entries for {n_layers} layers")
    return list(windows)


def forward_flops(dims: dict, tokens: int, past: int = 0, n_out: int | None = None) -> float:
    """FLOPs of one causal forward of ``tokens`` positions after ``past`` already-encoded positions
    (a cached prompt), projections and attention:

    ``2 * proj_params(dims) * tokens + 4 * H * hd * sum over layers of pairs``, ``pairs = tokens * past +
    tokens * (tokens + 1) / 2`` (a layer with a sliding window of w, ``dims["windows"]``: each query's keys at most w)

    With ``n_out`` (rmfast's engine, :func:`narrow_params`), the last layer runs its q, o and MLP, and attends, only
    at the final ``n_out`` positions; None: every position (a plain forward).

    Position ``i`` (0-based) of the new ones attends to the ``past`` positions and to itself and the
    ``i`` before it (causal mask); each (query, key) pair costs ``2 * hd`` for ``q . k`` and ``2 * hd``
    for the weighted sum of ``v``, per query head and layer (grouped K/V heads do not change that: they
    save projection FLOPs, counted in :func:`proj_params`). Masked-out pairs (outside the causal mask or a layer's
    window), softmax, norms, RoPE and the activation are not counted. A right-padded row of length ``T`` counts as
    ``tokens=T`` (its pad positions run the projections and attend like the others).

        >>> d = {"n_layers": 1, "hidden": 4, "n_heads": 1, "n_kv_heads": 1, "head_dim": 4, "intermediate": 8}
        >>> forward_flops(d, 2, past=3)    # 2*(32+32+96)*2 + 4*1*1*4*(2*3 + 3)
        784.0
        >>> forward_flops({**d, "windows": [2]}, 2, past=3)    # each of the 2 queries sees 2 keys: 4 pairs, not 9
        704.0
    """
    L, per_pair = dims["n_layers"], 4.0 * dims["n_heads"] * dims["head_dim"]
    windows = layer_windows(dims.get("windows"), L)
    k = 0 if n_out is None else tokens - n_out  # positions the last layer skips: its queries 0..k-1

    def pairs(w: int | None, skip: int = 0) -> int:  # the queries past+skip .. past+tokens-1, in a layer of window w
        return keys_seen(past + tokens, w) - keys_seen(past + skip, w)

    attn = sum(pairs(w) for w in windows[:-1]) + pairs(windows[-1], k)
    if n_out is None:
        return 2.0 * proj_params(dims) * tokens + per_pair * attn
    return 2.0 * (proj_params(dims) * tokens - k * narrow_params(dims)) + per_pair * attn


def over_bound(fractions: dict, where: str) -> str | None:
    """One line where a method's GEMM work ran faster than the GEMM bound measured for it (a fraction over 1): the
    bound was measured low (a busy machine: :func:`gemm_peak` times one short window; or GEMMs too small to time),
    so no fraction of it means anything. None where every fraction is at most 1.

    >>> over_bound({"rmfast": 2.55, "hf-cache": 0.8}, "gemma3-270m")
    'note: gemma3-270m: rmfast at 255% of the measured GEMM bound: the bound was measured low (a busy machine, or GEMMs too small to time), so its fractions mean nothing here: rerun on an idle machine (or with --threads 1)'
    """
    over = {k: v for k, v in fractions.items() if v is not None and v > 1.0}
    if not over:
        return None
    return (f"note: {where}: {', '.join(f'{k} at {v:.0%}' for k, v in over.items())} of the measured GEMM bound: the "
            "bound was measured low (a busy machine, or GEMMs too small to time), so its fractions mean nothing here: "
            "rerun on an idle machine (or with --threads 1)")


def flag_over_bound(rows: list[dict], fractions: dict, where: str, indent: str = "") -> None:
    """:func:`over_bound`'s line, where there is one: said, and kept in each of ``rows`` as ``bound_note``."""
    note = over_bound(fractions, where)
    if note:
        log(indent + note)
        for r in rows:
            r["bound_note"] = note


def bound_again(rows: list[dict], fractions: tuple[str, ...], peak: float | None, dims: dict, dtype: torch.dtype,
                device: torch.device, M: int = 512) -> None:
    """On CPU, the workloads' GEMM bound (``peak``, :func:`gemm_peak` at ``M`` rows, timed before the methods) timed
    again once they have run; the larger window is the bound: ``rows``' ``fractions`` columns are taken against
    it, their ``gemm_bound_gflops`` is it, and ``gemm_bound_windows`` keeps both (one short window on a busy
    machine read low, and fractions of it came out over 1). On CUDA, or without a bound, nothing changes: one
    window is steady there. (The scan's own bound has its dtype choice: :func:`rmfast.bench.run.second_window`.)"""
    if not peak or device.type != "cpu" or not rows:
        return
    again = gemm_peak(dims, M, dtype, device)["gflops"]
    bound = max(peak, again)
    log(f"GEMM bound again after the methods: {again:.1f} GFLOP/s (before them {peak:.1f}); the bound is the larger")
    for r in rows:
        for k in fractions:
            if r.get(k) is not None:
                r[k] = round(r[k] * peak / bound, 3)
        r["gemm_bound_gflops"] = round(bound, 1)
        r["gemm_bound_windows"] = f"before {peak:.1f}, after {again:.1f}"


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
        counts[key] = counts.get(key, 0) + V / min(lm_chunk, V)  # V / chunk chunks; one GEMM where V is under one
    per_shape = {}
    tot_flops = tot_time = 0.0
    g = torch.Generator(device=device).manual_seed(0)  # operands drawn on the device: no host copy of GBs
    for (m, K, N), c in counts.items():
        x = torch.randn(m, K, generator=g, device=device, dtype=dtype)
        w = torch.randn(N, K, generator=g, device=device, dtype=dtype)
        wt = w.t()  # the Linear layout: x @ W^T
        for _ in range(2):
            torch.matmul(x, wt)
        sync(device)
        t0 = time.perf_counter()
        torch.matmul(x, wt)
        sync(device)
        one = max(time.perf_counter() - t0, 1e-6)
        reps = max(1, int(min_time / 3 / one))
        best = float("inf")
        for _ in range(3):
            sync(device)
            t0 = time.perf_counter()
            for _ in range(reps):
                torch.matmul(x, wt)
            sync(device)
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
    # QK^T and PV of the t row tokens over the prompt + their own, per layer by its sliding window (cfg["windows"],
    # one entry a layer: random_init.cost_model_config sets it; absent, as in COST_MODELS: full attention)
    windows = layer_windows(cfg.get("windows"), L)
    flops_attn = sum(4 * hq * (keys_seen(P + t, w) - keys_seen(P, w)) for w in windows)
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
    t_naive = V * (2 * n_proj * tn + sum(4 * hq * keys_seen(tn, w) for w in windows)) / peak
    out["naive"] = {"tokens_per_candidate": tn, "gemm_s": t_naive, "total_s_min": t_naive,
                    "total_s_max": t_naive + V * tn * act_bytes_tok / bw}
    return out


def format_cost_model(rows: list[dict]) -> str:
    """A Markdown table of :func:`gpu_cost_model` rows: predicted seconds per method and the ratios."""
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


# ----------------------------------------------------------------------------- the cost model beside a measurement

def cost_rows(rows: list[dict], cost_configs: dict | None = None, *, hbm_tb_s: float | None = None,
              gpu_name: str | None = None, mem_gb: float | None = None) -> list[dict]:
    """One cost-model row per measured row of ``rmfast bench`` (naive, hf-cache, rmfast-eager, rmfast).

    At the GEMM peak measured in the same run (on the model's own shapes, M = one rmfast batch):

    * ``predicted_s``: the timed candidates' useful FLOPs (``flops_per_candidate``: what the score needs, the same
      for every method) at that peak; ``measured_s``: the best pass; ``fraction`` = predicted / measured
      (= ``frac_gemm_peak``).
    * ``executed_*``: the same with the FLOPs the method really runs per candidate (the row's
      ``executed_flops_per_candidate``: naive the whole sequence, P + 1 + S, and the baselines the last layer at
      every position; rows from before that column: useful x tokens executed / tokens), i.e. how close each
      method's own work comes to the peak.
    * ``predicted_full_vocab_s`` = V x useful FLOPs / peak, beside ``estimated_full_vocab_s`` (the row's
      ``est_full_vocab_s``: its set-up, compile included, + V / its rate: an extrapolation from the timed
      candidates, not a measured whole scan; ``rmfast bench --full`` measures one, its ``rmfast-full`` row).
    * With ``cost_configs[model]`` (:data:`COST_MODELS`' form) the analytic model
      (:func:`gpu_cost_model`) at the measured peak (``gemm_frac`` 1) and, when given, the measured
      memory bandwidth ``hbm_tb_s`` (``hbm_frac`` 1; else the H100's 3.35 TB/s at 80 %): its
      full-vocabulary range for the method (``analytic_full_vocab_s_min``/``_max``).

    Rows without a measured peak (``--no-peak``, no per-row work) get ``None`` predictions.
    """
    out = []
    analytic: dict = {}
    for r in rows:
        if r.get("method") not in ("naive", "hf-cache", "rmfast-eager", "rmfast"):
            continue
        peak = (r.get("bound_gflops") or r.get("gemm_peak_gflops") or 0) * 1e9  # the faster dtype's (rmfast bench)
        fpc, t, e = r.get("flops_per_candidate"), r.get("tokens_per_candidate") or 0, r.get("tokens_executed_per_candidate")
        n, cps = r["n_timed"], r["cand_per_s"]
        measured = n / cps if cps else None
        row = {"model": r["model"], "method": r["method"], "n_timed": n, "tokens_per_candidate": t,
               "tokens_executed_per_candidate": e, "flops_per_candidate": fpc,
               "executed_flops_per_candidate": r.get("executed_flops_per_candidate")
               or ((fpc * e / t) if (fpc and t and e) else None),
               "gemm_peak_gflops": r.get("gemm_peak_gflops"), "measured_s": measured,
               "predicted_s": None, "fraction": None, "executed_predicted_s": None, "executed_fraction": None,
               "predicted_full_vocab_s": None, "estimated_full_vocab_s": r.get("est_full_vocab_s"),
               "analytic_full_vocab_s_min": None, "analytic_full_vocab_s_max": None}
        if peak and fpc and measured:
            row["predicted_s"] = n * fpc / peak
            row["fraction"] = row["predicted_s"] / measured
            row["predicted_full_vocab_s"] = r["vocab"] * fpc / peak
            if row["executed_flops_per_candidate"]:
                row["executed_predicted_s"] = n * row["executed_flops_per_candidate"] / peak
                row["executed_fraction"] = row["executed_predicted_s"] / measured
        cfg = (cost_configs or {}).get(r["model"])
        if cfg is not None and peak:
            if r["model"] not in analytic:
                gpu = {"name": gpu_name or r.get("gpu") or r.get("device"), "bf16_dense_tflops": peak / 1e12,
                       "hbm_tb_s": hbm_tb_s or H100_SXM["hbm_tb_s"], "mem_gb": mem_gb or H100_SXM["mem_gb"]}
                analytic[r["model"]] = gpu_cost_model(cfg, prompt_tokens=r["prefix_tokens"], gemm_frac=1.0,
                                                      hbm_frac=1.0 if hbm_tb_s else 0.8, gpu=gpu)
            a = analytic[r["model"]]["rmfast" if r["method"].startswith("rmfast") else r["method"]]
            row["analytic_full_vocab_s_min"], row["analytic_full_vocab_s_max"] = a["total_s_min"], a["total_s_max"]
        out.append(row)
    return out


def format_cost_rows(rows: list[dict]) -> str:
    """A Markdown table of :func:`cost_rows`: FLOPs per candidate, predicted vs measured time, the fraction."""
    def s(x, fmt="{:.3g}"):
        return "–" if x is None else fmt.format(x)

    hdr = ("| model | method | GFLOP/cand (executed) | predicted s at peak | measured s | fraction (executed) | "
           "full vocab s: at peak / analytic / estimated (set-up + V / rate) |")
    out = [hdr, "|" + "|".join(["---"] * (hdr.count("|") - 1)) + "|"]
    for r in rows:
        gf = s(r["flops_per_candidate"] and r["flops_per_candidate"] / 1e9)
        ex = s(r["executed_flops_per_candidate"] and r["executed_flops_per_candidate"] / 1e9)
        an = ("–" if r["analytic_full_vocab_s_min"] is None
              else f"{r['analytic_full_vocab_s_min']:.3g}–{r['analytic_full_vocab_s_max']:.3g}")
        out.append(f"| {r['model']} | {r['method']} | {gf} ({ex}) | {s(r['predicted_s'])} | {s(r['measured_s'])} | "
                   f"{s(r['fraction'], '{:.1%}')} ({s(r['executed_fraction'], '{:.1%}')}) | "
                   f"{s(r['predicted_full_vocab_s'])} / {an} / {s(r['estimated_full_vocab_s'])} |")
    return "\n".join(out)
