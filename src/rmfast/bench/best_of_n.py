"""Best-of-N scoring: rmfast's RewardScorer vs the way users do it today, side by side in one run
(``rmfast bench --workload best-of-n``, ``benchmarks/best_of_n.py``).

For each (prompt length P, N): ``prompts`` conversations of about P tokens of common words, N responses
each of mixed lengths drawn uniformly from [``min_len``, ``max_len``] tokens.

- ``hf``: the HF ``AutoModelForSequenceClassification`` (the same loaded model) on right-padded batches
  of ``hf_batch`` full conversations (the chat template's text, ``tokenizer(padding=True)``; a plain
  format's text with the tokenizer's BOS), read by HF's own pooling (the last non-pad token);
  tokenization included. Each of ``hf_batch``'s sizes is timed and the fastest counts (``hf_batch``,
  ``hf_batch_probe`` in the row): the batch a user would tune to, not one fixed size.
- ``rmfast``: ``RewardScorer.score`` (each prompt encoded once, responses of similar lengths in ragged
  batches, rows of several prompts in one batch where each has fewer), tokenization included, no plan
  cache between repeats (``cache_prompts=0``).

Both run once untimed on a short conversation before the first configuration (first-call costs: lazy
initialisation, allocator growth); each configuration is then timed ``repeats`` times, the best counted.

Per configuration: responses/s of each, the speed-up, the FLOP ratios it should approach, each
method's projection GFLOP/s as a fraction of the GEMM bound measured on this machine on the model's
projection shapes (:func:`rmfast.bench.flops.gemm_peak`), and the largest score difference between the
two (the exactness check; in float32 it is rounding only).

* ``flop_ratio``: projection FLOPs of the tokens the baseline runs (no padding) / of the tokens rmfast runs
  (prompts once + rows; its last layer's q, o and MLP only at the positions the head reads, one per prompt pass
  and per row: :func:`rmfast.bench.flops.narrow_params`); ``flop_ratio_with_padding``: the same with the
  baseline's pad tokens. Projections only.
* ``flop_ratio_with_attention``: total FLOPs, projections and attention
  (:func:`rmfast.bench.flops.forward_flops`), baseline / rmfast: every position of each padded HF row
  attends to the positions before it in that row; rmfast runs each prompt once, and each row's tokens
  (response + template suffix) attend to the prompt and the row's earlier tokens (its ragged padding is
  not counted). At long prompts attention to the prompt is a large share of the baseline's work, so
  ``speedup_over_flop_ratio_with_attention`` says how much of the reachable gain was reached.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .baselines import agreement, set_attention
from .flops import bound_again, flag_over_bound, forward_flops, gemm_peak, model_dims, narrowed_tokens
from .machine import log, machine_info, sync
from .models import ModelChoice
from .random_init import load_workload_model

WORDS = ("the of and to in is was for on that with as by at from this be it an are or have not which one all "
         "their more time can out about there some would when other into first year only over new most people "
         "river garden careful bright music window answer question simple reason number history water light "
         "mountain city market letter evening morning paper table story friend language science").split()

#: Machine and version fields written into every row.
MACHINE_FIELDS = ("cpu_model", "cpu_id", "cpu_kind", "cpu_count", "torch_threads", "gpu", "platform")
VERSION_FIELDS = ("torch", "transformers", "rmfast", "rmfast_commit")


@dataclass
class BestOfNConfig(ModelChoice):
    """One best-of-N benchmark run (one model). Every field has the default of ``benchmarks/best_of_n.py``.

    Attributes:
        prompt_tokens: prompt lengths in tokens, one configuration each (default (64, 512, 2048)).
        n: responses per prompt, one configuration each per prompt length (default (4, 16, 64)).
        prompts: conversations per configuration, each with its own N responses (default 1).
        min_len, max_len: response lengths in tokens, drawn uniformly (default 20 and 200).
        hf_batch: rows (whole conversations) per padded HF batch, or several: each is timed and the fastest counts,
            as a user would tune it (default (1, 16, 64): one is the best on a CPU at long prompts, where padding
            costs most; the GPU's wide GEMMs want many), capped at a configuration's rows.
        repeats: timed passes per method; the best counts (default 1).
        dtype: model dtype (default "float32": the score difference is then rounding only; `rmfast bench` on CUDA
            passes "auto", the model's dtype: :func:`rmfast.bench.models.workload_dtype`).
        device: "cpu", "cuda" or "auto" (default "cpu").
        threads: torch CPU threads (default None: torch's).
        seed: text and length seed (default 0).
        model, name, random_head_seed, template, random_init, layers, tiny, init_seed, allow_pickle:
            which model (:class:`rmfast.bench.models.ModelChoice`, same defaults).
        peak: measure the GEMM bound (default True; False: the GEMM fractions are None).
        hf_attention: the baseline's attention implementation (default "sdpa", transformers' default and
            so what users run; "eager": HF's reference arithmetic, which rmfast's own loader picks).
    """

    prompt_tokens: tuple[int, ...] = (64, 512, 2048)
    n: tuple[int, ...] = (4, 16, 64)
    prompts: int = 1
    min_len: int = 20
    max_len: int = 200
    hf_batch: tuple[int, ...] = (1, 16, 64)
    repeats: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None
    seed: int = 0
    peak: bool = True
    hf_attention: str = "sdpa"

    #: the workload's name in its messages
    WORKLOAD = "best-of-n"

    def check(self) -> None:
        """One-line UserErrors for values that cannot run."""
        w = self.WORKLOAD
        if not self.prompt_tokens or not self.n or min(self.prompt_tokens) < 1 or min(self.n) < 1:
            raise UserError(f"{w}: prompt lengths and N must be positive integers")
        for k in ("prompts", "min_len", "repeats"):
            if int(getattr(self, k)) < 1:
                raise UserError(f"{w}: --{k.replace('_', '-')} must be >= 1")
        if isinstance(self.hf_batch, int):
            self.hf_batch = (self.hf_batch,)
        if not self.hf_batch or min(self.hf_batch) < 1:
            raise UserError(f"{w}: --hf-batch must be positive integers")
        if self.hf_attention not in ("sdpa", "eager"):
            raise UserError(f"{w}: --hf-attention {self.hf_attention!r}: give sdpa or eager")
        if self.max_len < self.min_len:
            raise UserError(f"{w}: --max-len {self.max_len} is below --min-len {self.min_len}")


def text_of(tok, n_tokens: int, rng: random.Random) -> str:
    """A text of about ``n_tokens`` tokens of common words (trimmed word by word to the count)."""
    def count(ws):
        return len(tok(" ".join(ws), add_special_tokens=False)["input_ids"])

    words = [rng.choice(WORDS) for _ in range(n_tokens)]
    while len(words) > 1 and (c := count(words)) > n_tokens:
        words = words[:-max(1, (c - n_tokens) * len(words) // (2 * c))]  # half the excess, in words
    return " ".join(words).capitalize() + "."


def render(tok, template: str | None, prompt: str, response: str) -> tuple[str, bool]:
    """The full conversation's text as a user would build it, and whether the tokenizer adds its
    special tokens: a plain format (``{prompt}``, ``{response}``) with BOS, as rmfast's template does;
    else the chat template's text (which holds them already)."""
    from ..template import is_plain_format

    if template is not None and is_plain_format(template):
        return template.replace("{system}", "").replace("{prompt}", prompt).replace("{response}", response), True
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False), False


@torch.no_grad()
def hf_padded(model, tok, template, convs, responses, batch: int) -> tuple[np.ndarray, int, list[tuple[int, int]]]:
    """Scores the users' way: full conversations, right-padded batches, HF's pooling.

    Returns (scores, real tokens, [(rows, padded length)] per batch)."""
    texts = [render(tok, template, c, r) for c, rs in zip(convs, responses) for r in rs]
    special = texts[0][1]
    texts = [t for t, _ in texts]
    dev = next(model.parameters()).device
    out, real, shapes = [], 0, []
    old_side, tok.padding_side = tok.padding_side, "right"
    try:
        for s in range(0, len(texts), batch):
            enc = tok(texts[s:s + batch], padding=True, return_tensors="pt", add_special_tokens=special)
            real += int(enc["attention_mask"].sum())
            shapes.append(tuple(enc["input_ids"].shape))
            logits = model(input_ids=enc["input_ids"].to(dev), attention_mask=enc["attention_mask"].to(dev)).logits
            out.append(logits[:, 0].float().cpu())
    finally:
        tok.padding_side = old_side
    return torch.cat(out).numpy(), real, shapes


def rmfast_lengths(tok, template, convs, responses) -> tuple[list[int], list[int]]:
    """(prompt tokens per conversation, tokens per row: response + template suffix) as rmfast runs them."""
    from ..template import build_template, response_ids

    prompts, rows = [], []
    for c, rs in zip(convs, responses):
        t = build_template(tok, c, template=template)
        prompts.append(len(t.prefix_ids))
        rows.append([len(response_ids(tok, t, r)) + len(t.suffix_ids) for r in rs])
    return prompts, rows


def attention_flops_ratio(dims: dict, hf_shapes, prompt_lens, row_lens) -> float:
    """Total FLOPs (projections and attention, :func:`forward_flops`) of the padded HF batches over
    rmfast's: each prompt once, each row after its prompt."""
    hf = sum(rows * forward_flops(dims, T) for rows, T in hf_shapes)
    rm = sum(forward_flops(dims, P, n_out=1) + sum(forward_flops(dims, t, past=P, n_out=1) for t in ts)
             for P, ts in zip(prompt_lens, row_lens))  # the last layer at the head's positions only
    return hf / rm


def run_config(lm, scorer, template, P: int, N: int, cfg: BestOfNConfig, rng: random.Random, dims: dict,
               peak: float | None) -> dict:
    """One (prompt length, N) configuration: both methods timed, the row of figures."""
    tok = lm.tokenizer
    dev = next(lm.model.parameters()).device
    convs = [text_of(tok, P, rng) for _ in range(cfg.prompts)]
    lens = [[rng.randint(cfg.min_len, cfg.max_len) for _ in range(N)] for _ in convs]
    responses = [[text_of(tok, n, rng) for n in ls] for ls in lens]
    times: dict[str, list[float]] = {"hf": [], "rmfast": []}
    sizes = sorted({min(b, cfg.prompts * N) for b in cfg.hf_batch})  # the HF batch sizes tried: the fastest counts
    by_size: dict[int, tuple[float, tuple]] = {}  # rows per batch -> (best seconds, (scores, real, shapes))
    for _ in range(cfg.repeats):
        for b in sizes:
            sync(dev)
            t0 = time.perf_counter()
            got = hf_padded(lm.model, tok, template, convs, responses, b)
            sync(dev)
            dt = time.perf_counter() - t0
            if b not in by_size or dt < by_size[b][0]:
                by_size[b] = (dt, got)
        t0 = time.perf_counter()
        rm = np.array([x for s in scorer.score(convs, responses) for x in s])
        sync(dev)
        times["rmfast"].append(time.perf_counter() - t0)
    hf_b = min(by_size, key=lambda b: by_size[b][0])
    times["hf"], (hf, real, shapes) = [by_size[hf_b][0]], by_size[hf_b][1]
    st = scorer.last_stats
    n = st.n_responses
    padded = sum(r * T for r, T in shapes)
    rm_tokens = st.response_tokens + st.prompt_tokens  # every token rmfast runs through the layers
    rm_work = narrowed_tokens(dims, rm_tokens, len(convs) + st.n_rows)  # the last layer at the head's positions only
    t_hf, t_rm = min(times["hf"]), min(times["rmfast"])
    speedup = t_hf / t_rm
    ratio_attn = attention_flops_ratio(dims, shapes, *rmfast_lengths(tok, template, convs, responses))

    def gemm_fraction(tokens, t):  # projection FLOPs (attention not counted) / time / the bound
        return None if not peak else round(2.0 * dims["gemm_params"] * tokens / t / 1e9 / peak, 3)

    return {
        "prompt_tokens_target": P, "n_responses": N, "n_prompts": cfg.prompts,
        "prompt_tokens": round(st.prompt_tokens / len(convs), 1),
        "response_tokens_mean": round(st.response_tokens / st.n_rows, 1),
        "hf_s": round(t_hf, 4), "rmfast_s": round(t_rm, 4), "hf_batch": hf_b,
        "hf_batch_probe": ", ".join(f"{b}: {by_size[b][0]:.4g} s" for b in sizes),
        "hf_responses_per_s": round(n / t_hf, 2), "rmfast_responses_per_s": round(n / t_rm, 2),
        "speedup": round(speedup, 2),
        "flop_ratio": round(real / rm_work, 2), "flop_ratio_with_padding": round(padded / rm_work, 2),
        "flop_ratio_with_attention": round(ratio_attn, 2),
        "speedup_over_flop_ratio": round(speedup / (real / rm_work), 3),
        "speedup_over_flop_ratio_with_attention": round(speedup / ratio_attn, 3),
        "hf_gemm_fraction": gemm_fraction(padded, t_hf), "rmfast_gemm_fraction": gemm_fraction(rm_work, t_rm),
        "rmfast_batches": st.n_batches, "rmfast_padded_rows": st.padded_rows, "rmfast_padded_tokens": st.padded_tokens,
        "rmfast_packed_batches": st.packed_batches,
        "rmfast_padding_waste": round(st.padding_waste, 4), "rmfast_attention": st.attention,
        "hf_padding_fraction": round(1 - real / padded, 3),
        "max_abs_diff": float(np.abs(hf - rm).max()), "score_std": float(np.std(hf)),
        # rank agreement, the bf16 rows' measure (fp32 rows are checked elementwise: rmfast bench exits 1 past rounding)
        "spearman": agreement(hf, rm)["spearman"],
    }


def load_model(cfg: BestOfNConfig):
    """(LoadedModel, name, template) of the configuration (:func:`rmfast.bench.models.load_workload_model`),
    which must be a reward model (or a backbone with a random head)."""
    lm, name, template = load_workload_model(cfg)
    if lm.kind != "classifier":
        raise UserError(f"best-of-n compares against AutoModelForSequenceClassification: {name} is a {lm.kind} "
                        "(give a reward model, or a backbone with a random head)")
    return lm, name, template


def run_best_of_n(cfg: BestOfNConfig) -> list[dict]:
    """Every (prompt length, N) configuration of ``cfg`` on its model; one row each (figures, model, dtype,
    device, the GEMM bound, the machine and versions)."""
    from ..scoring.scorer import RewardScorer
    from ..cpu import versions

    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    lm, name, template = load_model(cfg)
    attention, note = set_attention(lm.model, cfg.hf_attention)  # the baseline's; rmfast's engine has its own
    if note:
        log(f"{name}: note: {note}")
    scorer = RewardScorer(lm, cache_prompts=0, template=template)
    dev = next(lm.model.parameters()).device
    try:
        dims = model_dims(lm.model, "score")
    except ValueError as e:  # not on the fast path: no dims to count FLOPs from
        raise UserError(f"best-of-n: {name}: {e}") from None
    peak = gemm_peak(dims, 512, next(lm.model.parameters()).dtype, dev)["gflops"] if cfg.peak else None
    info, ver = machine_info(dev), versions()
    log(f"{name}: {info['gpu'] or info['cpu_model']}, {info['torch_threads']} threads"
        + (f"; GEMM bound on the model's shapes (M=512): {peak:.1f} GFLOP/s" if peak else ""))
    # Untimed short passes of each method first: first-call costs (Triton's compiles, cuBLAS's choices) stay out of
    # the first row. Every path a timed row can take: one prompt and two, rows of one length and of several (the
    # packed rows' pass compiles its own kernels; rows of one length run the engine's plain pass). Before this
    # covered only one prompt with equal lengths, the packed path's compiles (~1.5 s) landed in the first timed
    # row on the H100 (benchmarks/results/gpu_h100_2026-11-26_b/README.md).
    warm = random.Random(-1)
    for n_conv, lens in ((1, (4, 4)), (1, (4, 7)), (2, (5, 3))):
        convs = [text_of(lm.tokenizer, 8 + i, warm) for i in range(n_conv)]
        resp = [[text_of(lm.tokenizer, n, warm) for n in lens] for _ in convs]
        for b in cfg.hf_batch:
            hf_padded(lm.model, lm.tokenizer, template, convs, resp, b)
        scorer.score(convs, resp)
    rng, rows = random.Random(cfg.seed), []
    for P in cfg.prompt_tokens:
        for N in cfg.n:
            r = run_config(lm, scorer, template, P, N, cfg, rng, dims, peak)
            rows.append({"model": name, **r, "hf_attention": attention, "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
                         "device": str(dev), "gemm_bound_gflops": round(peak, 1) if peak else None,
                         **{k: info.get(k) for k in MACHINE_FIELDS}, **{k: ver.get(k) for k in VERSION_FIELDS}})
            log(f"P~{P:5d} N={N:3d} x{cfg.prompts}: hf {r['hf_responses_per_s']:8.2f}/s  rmfast "
                f"{r['rmfast_responses_per_s']:8.2f}/s  speed-up {r['speedup']:5.2f}x  FLOP ratio {r['flop_ratio']:5.2f} "
                f"({r['flop_ratio_with_padding']:.2f} padded, {r['flop_ratio_with_attention']:.2f} with attention)  "
                f"max|diff| {r['max_abs_diff']:.2e}")
    bound_again(rows, ("hf_gemm_fraction", "rmfast_gemm_fraction"), peak, dims, next(lm.model.parameters()).dtype, dev)
    for r in rows:
        flag_over_bound([r], {"hf": r["hf_gemm_fraction"], "rmfast": r["rmfast_gemm_fraction"]},
                        f"{name} P~{r['prompt_tokens_target']} N={r['n_responses']}")
    return rows


def write_best_of_n(rows: list[dict], out: str | Path, config: dict, device: str = "cpu") -> tuple[Path, Path]:
    """Rows to ``<out>/best_of_n_<timestamp>.csv`` and ``.json`` (with the machine, versions and config)
    and the same as ``best_of_n_latest``; the timestamped paths."""
    from .output import write_workload_rows

    return write_workload_rows(rows, out, config, workload="best-of-n", stem="best_of_n", device=device)


def config_record(cfg: BestOfNConfig) -> dict:
    """The configuration as the JSON records it."""
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
