"""A cost model of best-of-N scoring on a GPU: padded Hugging Face batches vs rmfast's cascade form,
FLOPs and bytes per part, a predicted time per part (roofline: the slower of its FLOPs at a fraction of
the tensor-core peak and its bytes at the HBM bandwidth), and the crossover between the Triton
shared-prefix kernel and the cascade (:data:`rmfast.scoring.plan.CASCADE_MIN_ROW_TOKENS`).

Everything here is arithmetic on shapes: PREDICTED figures, to be checked against ``make gpu-check``.
The peaks default to the H100 figures measured on 2026-11-26 (``../shared/gpu/2026-11-26-h100/``: bf16
GEMM ~700 TFLOP/s on Llama-3.1-8B's shapes) and the H100 SXM's HBM3 3.35 TB/s.

Parts of the rows' pass per layer (T row tokens in all, rows of n_i + m tokens, prompts of P_j tokens,
H query heads, Hkv kv heads, head dim D, e bytes per element):

    GEMMs          2 · params_per_layer · T                      weights read once per batch
    prompt part    4 · H · D · sum_rows P · (n_i + m)             q read, each prompt's K/V once per BLOCK_M
                                                                 query rows (from L2), fp32 out + lse written
    response part  4 · H · D · sum_rows (n_i + m)(n_i + m + 1)/2  q, k, v read; fp32 out + lse written
    merge          0                                             two fp32 outs + lses read, e-byte out written
    kv_concat      0 (several prompts: their K/V concatenated per batch and layer, read and written once)

The padded HF forward: every row is prompt + response + suffix, padded to the batch's longest, causal
attention over all of it (SDPA's flash kernel: T(T+1)/2 pairs per row), weights read once per batch.

A layer with a sliding window of w (``m["windows"]``: one entry per layer, None for full attention; Gemma 2/3,
Mistral) counts each query's keys at most w (:func:`rmfast.bench.flops.keys_seen`, HF's window): the prompt part
of a row's token at position q sees min(q + 1, w) keys less its own row's, so prompt keys drop out first.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .flops import keys_seen
from .flops import layer_windows as windows_per_layer

#: the Llama-3.1-8B shapes (the issue's table)
LLAMA_31_8B = dict(n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)


@dataclass(frozen=True)
class Gpu:
    """Peaks and efficiencies a prediction assumes (defaults: one H100 SXM, bf16)."""

    gemm_tflops: float = 700.0  # measured bf16 GEMM peak on the 8B's shapes (2026-11-26)
    hbm_tb_s: float = 3.35  # HBM3
    l2_tb_s: float = 10.0  # L2 read bandwidth, assumed (~3x HBM on Hopper)
    attn_frac: float = 0.5  # flash attention's share of the tensor-core peak (FA2-class kernels on Hopper)
    launch_us: float = 4.0  # one kernel launch, eager
    kernels_per_layer: int = 12  # rmfast's launches per layer besides attention (:data:`LAYER_LAUNCHES`)
    hf_kernels_per_layer: int = 14  # the padded HF forward's eager launches per layer besides attention (assumed)


#: rmfast's launches per decoder layer on the CUDA path, as ``tests/test_prompt_wave.py`` counts them (a layer
#: but a pass's last, which narrows): besides attention, the seven projection GEMMs, the residual add and four
#: Triton kernels (norm in; RoPE of q and k; add + norm; SiLU x up); attention is three in the rows' pass (the
#: prompt part, the response part, the merge) and one in a prompt's pass (the varlen causal kernel).
LAYER_LAUNCHES = {"layer": 12, "rows_attention": 3, "prompt_attention": 1}


def layer_params(m: dict) -> int:
    """Projection weights per layer: q, k, v, o and gate, up, down."""
    Dm, H, Hkv, D, inter = m["hidden"], m["n_heads"], m["n_kv_heads"], m["head_dim"], m["intermediate"]
    return Dm * (H * D + 2 * Hkv * D) + H * D * Dm + 3 * Dm * inter


def layer_windows(m: dict) -> Counter:
    """{window: layers}: each layer's sliding window (None: full attention), from ``m["windows"]`` (absent: all full).

    >>> sorted(layer_windows({"n_layers": 4, "windows": [2, None, 2, None]}).items(), key=str)
    [(2, 2), (None, 2)]
    """
    return Counter(windows_per_layer(m.get("windows"), m["n_layers"]))


def row_pairs(P: int, t: int, w: int | None) -> tuple[int, int]:
    """(prompt-key pairs, own-key pairs) of a row of ``t`` tokens after a prompt of ``P``, in a layer of window ``w``.

    >>> row_pairs(5, 3, None), row_pairs(5, 3, 4), row_pairs(5, 3, 2)
    ((15, 6), (6, 6), (1, 5))
    """
    own = keys_seen(t, w)
    return keys_seen(P + t, w) - keys_seen(P, w) - own, own


def _t(flops: float, bytes_: float, tflops: float, tb_s: float) -> float:
    """Roofline seconds: the slower of compute and memory."""
    return max(flops / (tflops * 1e12), bytes_ / (tb_s * 1e12))


def cascade_parts(m: dict, prompts: list[int], rows: list[list[int]], suffix: int, elt: int = 2, gpu: Gpu = Gpu(),
                  block_m: int = 64) -> dict:
    """Per-part FLOPs, bytes and predicted seconds of ONE rows' pass (all layers) of rmfast's cascade form.

    prompts: P_j per prompt; rows[j]: the response lengths (tokens) of prompt j's rows; suffix: tokens after
    each response. Rows run ragged (no padding: the cascade skips keys after a row's end; the GEMMs see only
    real tokens: rows run packed back to back; ``pad_frac`` of :func:`best_of_n` prices right-padded buckets).
    Returns {part: {"flops", "bytes", "s"}} per layer summed over layers, and "total_s".
    """
    H, Hkv, D = m["n_heads"], m["n_kv_heads"], m["head_dim"]
    G = H // Hkv
    lens = [n + suffix for r in rows for n in r]  # row tokens
    T = sum(lens)
    fp32_part = T * H * (D + 1) * 4  # one part's fp32 output and lse
    out: dict = {}

    def add(k: str, p: dict, layers: int) -> None:
        tf = gpu.gemm_tflops if k == "gemm" else gpu.gemm_tflops * gpu.attn_frac
        s = _t(p["flops"], p["bytes"], tf, gpu.hbm_tb_s)
        if "l2_bytes" in p:
            s = max(s, p["l2_bytes"] / (gpu.l2_tb_s * 1e12))
        o = out.setdefault(k, {"flops": 0.0, "bytes": 0.0, "s": 0.0})
        o["flops"], o["bytes"], o["s"] = o["flops"] + p["flops"] * layers, o["bytes"] + p["bytes"] * layers, o["s"] + s * layers

    L = m["n_layers"]
    # weights once, activations in and out of the seven projections (~8 hidden-wide rows per token)
    add("gemm", dict(flops=2.0 * layer_params(m) * T, bytes=layer_params(m) * elt + T * m["hidden"] * elt * 8), L)
    for w, layers in layer_windows(m).items():  # the attention parts by each layer's window
        pairs = [row_pairs(P, n + suffix, w) for P, r in zip(prompts, rows) for n in r]
        pre_pairs, own_pairs = sum(p for p, _ in pairs), sum(o for _, o in pairs)  # (query, key) pairs per head
        # prompt K/V re-read once per BLOCK_M query rows (each prompt's rows x positions x G heads), from L2; a
        # window reads its last w keys at most
        kv_reads = sum(2 * Hkv * min(P, w or P) * D * elt * -(-(sum(n + suffix for n in r) * G) // block_m)
                       for P, r in zip(prompts, rows))
        add("prompt_part", dict(flops=4.0 * H * D * pre_pairs, bytes=T * H * D * elt + fp32_part, l2_bytes=kv_reads),
            layers)
        add("response_part", dict(flops=4.0 * H * D * own_pairs, bytes=T * (H + 2 * Hkv) * D * elt + fp32_part), layers)
    add("merge", dict(flops=0.0, bytes=2 * fp32_part + T * H * D * elt), L)
    if len(prompts) > 1:  # the wave's prompt K/V concatenated per layer (read and written once)
        add("kv_concat", dict(flops=0.0, bytes=2 * 2 * Hkv * sum(prompts) * D * elt), L)
    out["launches_s"] = L * (gpu.kernels_per_layer + LAYER_LAUNCHES["rows_attention"]) * gpu.launch_us * 1e-6
    out["total_s"] = sum(v["s"] for k, v in out.items() if isinstance(v, dict)) + out["launches_s"]
    return out


def prompt_pass(m: dict, P: int, elt: int = 2, gpu: Gpu = Gpu()) -> dict:
    """One prompt's own pass (batch 1, causal over P tokens): GEMMs weight-read bound for short prompts."""
    L, H, D = m["n_layers"], m["n_heads"], m["head_dim"]
    g = _t(2.0 * layer_params(m) * P, layer_params(m) * elt, gpu.gemm_tflops, gpu.hbm_tb_s)
    lw = layer_windows(m)
    f_a = {w: 4.0 * H * D * keys_seen(P, w) for w in lw}  # per layer, by its window
    a = sum(n * _t(f_a[w], P * (H + 2 * m["n_kv_heads"]) * D * elt * 2, gpu.gemm_tflops * gpu.attn_frac, gpu.hbm_tb_s)
            for w, n in lw.items())
    return {"flops": L * 2.0 * layer_params(m) * P + sum(n * f_a[w] for w, n in lw.items()),
            "s": L * g + a + L * (gpu.kernels_per_layer + LAYER_LAUNCHES["prompt_attention"]) * gpu.launch_us * 1e-6}


def wave_prompt_pass(m: dict, prompts: list[int], elt: int = 2, gpu: Gpu = Gpu()) -> dict:
    """The prompts of a wave in ONE packed pass (:func:`rmfast.fast.wave.encode_prompts`): GEMMs over all
    T = sum P_i tokens with the weights read once, each prompt's causal attention by the varlen response part
    on the packed q/k/v (one launch per layer for the wave; no padding, no scatter or gather: a pass's
    launches and bytes are one prompt pass's over T tokens). Compare with ``sum(prompt_pass(m, P))``: the
    saving is the per-prompt launches and weight reads of short prompts."""
    L, H, Hkv, D = m["n_layers"], m["n_heads"], m["n_kv_heads"], m["head_dim"]
    T = sum(prompts)
    g = _t(2.0 * layer_params(m) * T, layer_params(m) * elt + T * m["hidden"] * elt * 8, gpu.gemm_tflops, gpu.hbm_tb_s)
    lw = layer_windows(m)
    f_a = {w: 4.0 * H * D * sum(keys_seen(P, w) for P in prompts) for w in lw}  # per layer, by its window
    a = sum(n * _t(f_a[w], T * (H + 2 * Hkv) * D * elt * 2, gpu.gemm_tflops * gpu.attn_frac, gpu.hbm_tb_s)
            for w, n in lw.items())
    launches = L * (gpu.kernels_per_layer + LAYER_LAUNCHES["prompt_attention"]) * gpu.launch_us * 1e-6
    return {"flops": L * 2.0 * layer_params(m) * T + sum(n * f_a[w] for w, n in lw.items()),
            "s": L * g + a + launches, "launches_s": launches}


def prompt_waves(m: dict, prompts: list[int], elt: int = 2) -> list[list[int]]:
    """The scorer's waves of these prompts (:meth:`rmfast.scoring.scorer.RewardScorer._waves`' caps: at most
    ``WAVE_PROMPTS`` conversations and ``WAVE_KV_BYTES`` of prompt K/V each; its row-token cap is not reached
    by the best-of-N rows here): each wave's prompts run as one packed pass."""
    from ..scoring.scorer import WAVE_KV_BYTES, WAVE_PROMPTS

    kv_per_token = m["n_layers"] * 2 * m["n_kv_heads"] * m["head_dim"] * elt
    waves: list[list[int]] = []
    cur: list[int] = []
    for P in prompts:
        if cur and (len(cur) >= WAVE_PROMPTS or (sum(cur) + P) * kv_per_token > WAVE_KV_BYTES):
            waves.append(cur)
            cur = []
        cur.append(P)
    return waves + [cur] if cur else waves


def padded_hf(m: dict, prompts: list[int], rows: list[list[int]], suffix: int, elt: int = 2, gpu: Gpu = Gpu(),
              rows_per_batch: int | None = None) -> dict:
    """The padded HF forward of every whole sequence: batches of ``rows_per_batch`` rows (None: all rows at once),
    each padded to its longest (prompt + response + suffix). Returns {"flops", "s", "tokens"}."""
    seqs = [P + n + suffix for P, r in zip(prompts, rows) for n in r]
    b = rows_per_batch or len(seqs)
    L, H, D = m["n_layers"], m["n_heads"], m["head_dim"]
    flops = s = tokens = 0.0
    for i in range(0, len(seqs), b):
        batch = seqs[i : i + b]
        T = max(batch) * len(batch)
        f_g = 2.0 * layer_params(m) * T
        s += L * _t(f_g, layer_params(m) * elt, gpu.gemm_tflops, gpu.hbm_tb_s)
        for w, n in layer_windows(m).items():  # a padded row of max(batch) tokens, causal (a window: w keys at most)
            f_a = 4.0 * H * D * len(batch) * keys_seen(max(batch), w)
            s += n * _t(f_a, T * (H + 2 * m["n_kv_heads"]) * D * elt * 2, gpu.gemm_tflops * gpu.attn_frac, gpu.hbm_tb_s)
            flops += n * f_a
        s += L * (gpu.hf_kernels_per_layer + 1) * gpu.launch_us * 1e-6
        flops += L * f_g
        tokens += T
    return {"flops": flops, "s": s, "tokens": tokens}


def response_lengths(n: int, lo: int = 20, hi: int = 200) -> list[int]:
    """n response lengths spread evenly over lo..hi tokens (the best-of-N workload's 20-200)."""
    return [lo + round(i * (hi - lo) / max(1, n - 1)) for i in range(n)]


def best_of_n(m: dict, prompt: int, n: int, n_prompts: int = 1, suffix: int = 1, elt: int = 2, gpu: Gpu = Gpu(),
              pad_frac: float = 0.0) -> dict:
    """One row of the issue's best-of-N table, predicted: n responses (20-200 tokens) to each of
    ``n_prompts`` prompts of ``prompt`` tokens. rmfast: the prompts' passes (one packed pass per wave,
    :func:`prompt_waves`; a lone prompt its own pass), then ONE rows' pass of the
    cascade for all rows, packed back to back (no pad token; ``pad_frac``: GEMM tokens added by padding, for
    the right-padded length buckets that windowed models fall back to: 6-11% measured on the H100 before
    rows were packed, benchmarks/results/gpu_h100_2026-11-26_b/best_of_n.csv). Padded HF: all rows in one
    batch. Returns the row as a dict."""
    prompts = [prompt] * n_prompts
    rows = [response_lengths(n)] * n_prompts
    casc = cascade_parts(m, prompts, rows, suffix, elt, gpu)
    passes_s = sum(wave_prompt_pass(m, w, elt, gpu)["s"] if len(w) > 1 else prompt_pass(m, w[0], elt, gpu)["s"]
                   for w in prompt_waves(m, prompts, elt))
    rm_s = casc["total_s"] + casc["gemm"]["s"] * pad_frac + passes_s  # bucket padding: GEMM tokens only
    hf = padded_hf(m, prompts, rows, suffix, elt, gpu)
    useful = sum(prompt_pass(m, P, elt, gpu)["flops"] for P in prompts) + sum(
        casc[k]["flops"] for k in ("gemm", "prompt_part", "response_part"))
    n_resp = n * n_prompts
    gemm_bound_s = useful / (gpu.gemm_tflops * 1e12)
    return {
        "prompt": prompt, "n": n, "n_prompts": n_prompts,
        "hf_resp_s": n_resp / hf["s"], "rmfast_resp_s": n_resp / rm_s, "speedup": hf["s"] / rm_s,
        "flop_ratio": hf["flops"] / useful, "rmfast_of_gemm_bound": gemm_bound_s / rm_s,
        "rmfast_s": rm_s, "hf_s": hf["s"],
        "parts_ms": {k: 1e3 * v["s"] for k, v in casc.items() if isinstance(v, dict)}
        | {"prompt_passes": 1e3 * passes_s, "launches": 1e3 * casc["launches_s"]},
    }


#: the issue's best-of-N rows: (prompt tokens, responses per prompt, prompts)
ISSUE_ROWS = [(512, 16, 1), (512, 64, 1), (2048, 16, 1), (2048, 64, 1), (512, 4, 16)]


def crossover_row_tokens(D: int, elt: int = 2, gpu: Gpu = Gpu()) -> float:
    """Row tokens above which the cascade beats the Triton shared-prefix kernel's own-key phase, per query
    head: that phase loads each own key and value row per query (D·elt bytes each, from L2, on CUDA
    cores: no tensor-core tile), S times; the cascade adds two fp32 part outputs written and read back
    (4·4·D bytes) less the one output the single kernel writes (elt·D), at HBM bandwidth."""
    per_key = 2 * D * elt / (gpu.l2_tb_s * 1e12)  # its K row and its V row
    extra = (4 * 4 * D + 4 * 4 - elt * D) / (gpu.hbm_tb_s * 1e12)
    return extra / per_key


def format_table(rows: list[dict]) -> str:
    """The predicted rows as a markdown table."""
    head = ("| prompt | N | prompts | HF resp/s | rmfast resp/s | speed-up | FLOP ratio | rmfast % of GEMM bound | "
            "rows' pass ms: GEMMs / prompt part / response part / merge / launches | prompt passes ms |\n"
            "|---|---|---|---|---|---|---|---|---|---|")
    out = [head]
    for r in rows:
        p = r["parts_ms"]
        out.append(f"| {r['prompt']:,} | {r['n']} | {r['n_prompts']} | {r['hf_resp_s']:.1f} | {r['rmfast_resp_s']:.1f} | "
                   f"{r['speedup']:.2f}x | {r['flop_ratio']:.1f} | {100 * r['rmfast_of_gemm_bound']:.0f}% | "
                   f"{p['gemm']:.1f} / {p['prompt_part']:.2f} / {p['response_part']:.2f} / {p['merge']:.2f} / "
                   f"{p['launches']:.2f} | {p['prompt_passes']:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":  # python -m rmfast.bench.cascade_cost: the predicted table of docs/backend.md
    print(format_table([best_of_n(LLAMA_31_8B, P, n, k) for P, n, k in ISSUE_ROWS]))
    print(f"\ncrossover (shared-prefix Triton vs cascade), D=128 bf16: {crossover_row_tokens(128):.1f} row tokens")
    for P, k in ((512, 16), (64, 16), (512, 64)):  # one pass per prompt vs the wave's one packed pass
        alone = sum(prompt_pass(LLAMA_31_8B, P)["s"] for _ in range(k))
        wave = wave_prompt_pass(LLAMA_31_8B, [P] * k)["s"]
        print(f"prompt passes, {k} prompts of {P} tokens: {1e3 * alone:.1f} ms one per prompt, {1e3 * wave:.1f} ms "
              f"as one packed wave (predicted)")
