"""``rmfast bench --workload serve``: one sample per request, as RL frameworks send them, to three servers of one
model in one run:

(a) ``rmfast serve`` (:mod:`rmfast.serve`): prompts shared across requests, batch-invariant rows;
(b) the same samples in-process through :class:`rmfast.scoring.scorer.RewardScorer` (one call: the bound (a)'s
    HTTP and scheduling overhead is measured against);
(c) a per-request padded HF server like OpenRLHF's ``serve_rm``: each request tokenized and run through
    ``AutoModelForSequenceClassification`` whole (its prompt recomputed for every sample), one at a time.

G groups x N responses (a GRPO step: N samples of one prompt each), prompt and response lengths as best-of-N's,
sent by C concurrent clients in random order, every group's samples interleaved with the others', from a process of
their own (the servers' interpreter lock is theirs alone, as in a deployment). Rows: responses/s,
p50/p99 latency, the prompt tokens (a) did not encode again, the FLOP ratio (c)'s tokens / (a)'s (its last
layer counted only at the positions the head reads), the GEMM fraction, max |diff| against (c), machine and versions.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..errors import UserError
from .baselines import set_attention
from .best_of_n import BestOfNConfig, load_model, text_of
from .flops import bound_again, flag_over_bound, gemm_peak, model_dims, narrowed_tokens
from .machine import loadavg, log, machine_info


@dataclass
class ServeBenchConfig(BestOfNConfig):
    """The serve workload: ``groups`` prompts x ``n[0]`` responses of ``prompt_tokens[0]``-token prompts, sent by
    ``clients`` concurrent clients (the rest as :class:`rmfast.bench.best_of_n.BestOfNConfig`)."""

    WORKLOAD = "serve bench"
    groups: int = 8
    clients: int = 16
    prompt_tokens: tuple[int, ...] = (512,)
    n: tuple[int, ...] = (16,)

    def check(self) -> None:
        super().check()
        if self.groups < 1 or self.clients < 1:
            raise UserError("serve bench: --prompts (groups) and --clients must be >= 1")


def _baseline_app(model, tok, lock: threading.Lock):
    """(c): OpenRLHF's ``serve_rm`` shape: ``/get_reward`` tokenizes its queries (no added special tokens, padded)
    and runs the whole sequences through the HF model, one request at a time."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    dev = next(model.parameters()).device

    async def get_reward(request):  # a plain Starlette route: the body read as serve_rm reads it
        data = await request.json()
        with lock, torch.inference_mode():  # serve_rm runs the model inside the handler: one request at a time
            enc = tok(data["query"], return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
            r = model(**enc).logits[:, 0].float().cpu().tolist()
        return JSONResponse({"rewards": r, "scores": r, "extra_logs": {}})

    app.router.add_route("/get_reward", get_reward, methods=["POST"])
    return app


async def _load(url: str, samples: list[dict], clients: int) -> tuple[float, list[float], dict]:
    """Send each sample as its own request from ``clients`` concurrent clients; (wall s, latencies, scores by index)."""
    import httpx

    queue: asyncio.Queue = asyncio.Queue()
    for s in samples:
        queue.put_nowait(s)
    lat, scores = [], {}

    async def client(c):
        while not queue.empty():
            s = queue.get_nowait()
            t0 = time.perf_counter()
            r = await c.post(f"{url}/get_reward", json={"query": [s["text"]], "prompts": [s["prompt"]], "labels": [None]})
            r.raise_for_status()
            lat.append(time.perf_counter() - t0)
            scores[s["k"]] = r.json()["rewards"][0]

    # one connection per client, made before the clock starts (a client's set-up is not the server's time)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for _ in range(clients)))
    return time.perf_counter() - t0, lat, scores


def _load_sync(url: str, samples: list[dict], clients: int) -> tuple[float, list[float], dict]:
    return asyncio.run(_load(url, samples, clients))


def _load_apart(url: str, samples: list[dict], clients: int) -> tuple[float, list[float], dict]:
    """:func:`_load` from a process of its own, as an RL job's clients are: in the server's process the clients'
    Python would share its interpreter lock with the server's (a cost no deployment pays)."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_load_sync, (url, samples, clients))


def _samples(tok, template, cfg: ServeBenchConfig, rng: random.Random) -> tuple[list, list, list[dict]]:
    """(prompts, responses per prompt, the samples as chat-templated texts, shuffled across groups)."""
    P, N = cfg.prompt_tokens[0], cfg.n[0]
    prompts = [text_of(tok, P, rng) for _ in range(cfg.groups)]
    responses = [[text_of(tok, rng.randint(cfg.min_len, cfg.max_len), rng) for _ in range(N)] for _ in prompts]
    out = []
    for g, (p, rs) in enumerate(zip(prompts, responses)):
        msgs = [{"role": "user", "content": p}]
        head = tok.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=True)
        for r in rs:
            text = tok.apply_chat_template(msgs + [{"role": "assistant", "content": r}], chat_template=template,
                                           tokenize=False)
            out.append({"k": len(out), "group": g, "prompt": head, "text": text})
    rng.shuffle(out)
    return prompts, responses, out


def run_serve_bench(cfg: ServeBenchConfig) -> list[dict]:
    """The three servers on one load (module doc); one row."""
    from ..cpu import versions
    from ..scoring.options import ScoringOptions
    from ..scoring.scorer import RewardScorer
    from ..serve.core import ServeCore
    from ..serve.metrics import parse
    from ..serve.server import ServeOptions, make_app, serving
    from .best_of_n import MACHINE_FIELDS, VERSION_FIELDS

    import httpx

    cfg.check()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    lm, name, template = load_model(cfg)
    if template is not None and "{" in template and "{%" not in template:
        raise UserError("serve bench: a plain-format template; give a model with a chat template")
    attention, note = set_attention(lm.model, cfg.hf_attention)  # the HF server's; rmfast's engine has its own
    if note:
        log(f"{name}: note: {note}")
    dev, dtype = next(lm.model.parameters()).device, next(lm.model.parameters()).dtype
    dims = model_dims(lm.model, "score")
    peak = gemm_peak(dims, 512, dtype, dev)["gflops"] if cfg.peak else None
    info, ver = machine_info(dev), versions()
    rng = random.Random(cfg.seed)
    prompts, responses, samples = _samples(lm.tokenizer, template, cfg, rng)
    tokens_c = sum(len(lm.tokenizer(s["text"], add_special_tokens=False)["input_ids"]) for s in samples)
    core = ServeCore(lm.model, lm.tokenizer, ScoringOptions(dtype=str(dtype).removeprefix("torch.")),
                     template=template, name=name)
    app, _ = make_app(core, ServeOptions(max_queue=10**6), name=name)

    warm = samples[: min(4, len(samples))]
    with serving(app) as url:
        asyncio.run(_load(url, warm, 2))  # first-call costs (the GEMM probe ran at start) out of the timed run
        before = parse(httpx.get(f"{url}/metrics").text)
        t_a, lat_a, got_a = _load_apart(url, samples, cfg.clients)
        after = parse(httpx.get(f"{url}/metrics").text)
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    scorer = RewardScorer(lm, template=template, cache_prompts=0)
    scorer.score(prompts[:1], [responses[0][:2]])  # its first-call costs
    t0 = time.perf_counter()
    scorer.score(prompts, responses)
    t_b = time.perf_counter() - t0
    lock = threading.Lock()
    with serving(_baseline_app(lm.model, lm.tokenizer, lock)) as url:
        asyncio.run(_load(url, warm, 2))
        t_c, lat_c, got_c = _load_apart(url, samples, cfg.clients)
    n = len(samples)
    tokens_a = d["rmfast_prompt_tokens_encoded_total"] + d["rmfast_batch_tokens_total"]
    groups_once = 1 - d["rmfast_prompt_reencodings_total"] / max(1, cfg.groups)
    a, c = np.array([got_a[k] for k in range(n)]), np.array([got_c[k] for k in range(n)])
    work_a = narrowed_tokens(dims, tokens_a, d["rmfast_prompt_encodings_total"] + n)  # the head's positions only
    flop_ratio = tokens_c / work_a
    gemm = (lambda tok, t: None if not peak else round(2.0 * dims["gemm_params"] * tok / t / 1e9 / peak, 3))
    row = {"model": name, "groups": cfg.groups, "n_responses": cfg.n[0], "clients": cfg.clients,
           "prompt_tokens_target": cfg.prompt_tokens[0], "min_len": cfg.min_len, "max_len": cfg.max_len,
           "serve_responses_per_s": round(n / t_a, 2), "inprocess_responses_per_s": round(n / t_b, 2),
           "hf_server_responses_per_s": round(n / t_c, 2),
           "serve_over_inprocess": round(t_b / t_a, 3), "serve_over_hf_server": round(t_c / t_a, 3),
           "flop_ratio": round(flop_ratio, 3), "serve_over_hf_server_over_flop_ratio": round(t_c / t_a / flop_ratio, 3),
           "serve_p50_s": round(float(np.percentile(lat_a, 50)), 4), "serve_p99_s": round(float(np.percentile(lat_a, 99)), 4),
           "hf_server_p50_s": round(float(np.percentile(lat_c, 50)), 4),
           "hf_server_p99_s": round(float(np.percentile(lat_c, 99)), 4),
           "prompt_tokens_saved": int(d["rmfast_prompt_tokens_saved_total"]),
           "prompt_encodings": int(d["rmfast_prompt_encodings_total"]),
           "groups_encoded_once": round(groups_once, 3), "serve_waves": int(d["rmfast_waves_total"]),
           "serve_waves_lingered": int(d.get("rmfast_waves_lingered_total", 0)),
           "serve_tokens": int(tokens_a), "hf_server_tokens": int(tokens_c),
           "serve_gemm_fraction": gemm(work_a, t_a), "hf_server_gemm_fraction": gemm(tokens_c, t_c),
           "gemm_rows": core.decisions["gemm_rows"]["value"], "max_abs_diff": float(np.abs(a - c).max()),
           "score_std": float(np.std(c)), "hf_attention": attention, "dtype": str(dtype).removeprefix("torch."), "device": str(dev),
           "gemm_bound_gflops": round(peak, 1) if peak else None, "loadavg": loadavg(),
           **{k: info.get(k) for k in MACHINE_FIELDS}, **{k: ver.get(k) for k in VERSION_FIELDS}}
    bound_again([row], ("serve_gemm_fraction", "hf_server_gemm_fraction"), peak, dims, dtype, dev)
    flag_over_bound([row], {"serve": row["serve_gemm_fraction"], "HF server": row["hf_server_gemm_fraction"]}, name)
    log(f"{name}: serve {row['serve_responses_per_s']}/s, in-process {row['inprocess_responses_per_s']}/s, "
        f"HF server {row['hf_server_responses_per_s']}/s; serve/in-process {row['serve_over_inprocess']}, "
        f"serve/HF {row['serve_over_hf_server']} at FLOP ratio {row['flop_ratio']}; groups encoded once "
        f"{row['groups_encoded_once']:.0%}; max|diff| {row['max_abs_diff']:.2e}")
    return [row]


def write_serve_bench(rows: list[dict], out, config: dict, device: str = "cpu", stem: str = "serve"):
    """Rows to ``<out>/<stem>_<timestamp>.csv`` / ``.json`` and ``<stem>_latest`` (machine, versions, config)."""
    from .output import write_workload_rows

    return write_workload_rows(rows, out, config, workload="serve", stem=stem, device=device)


def config_record(cfg: ServeBenchConfig) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()}
