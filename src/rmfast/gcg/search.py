"""Greedy Coordinate Gradient (GCG) search for multi-token responses that maximize or minimize a reward.

Exhaustive scans stop at one token; GCG extends the study to ~20-token responses. One step:

1. Gradient. The reward of the current response is differentiated with respect to its one-hot
   token matrix ``X`` (L, V): the response embeddings are ``(X @ W_embed) * scale`` (``scale`` is
   the embedding module's own, e.g. sqrt(hidden) for Gemma), placed between the embedded prefix and
   suffix, and the WHOLE sequence goes through the Hugging Face model with autograd (no prompt
   cache in the gradient pass: one row of ~P+L+S tokens costs little next to the evaluation).
   Score head: the classifier output at the final position. Logprob head:
   ``sum_i <log p(· | prefix, r_<i), X_i> + log p(continuation | prefix, r)``, so the gradient also
   sees each position's own log-probability as a target (the exact first-order term).
2. Direction. The objective is ``+reward`` (maximize) or ``-reward`` (minimize) and the search
   ascends the objective: minimize DEScends the reward. (The fork the original study used
   optimized a squared error to a ±30 target with a gradient that always pointed to higher reward.)
3. Candidates. Per position, the ``topk`` tokens with the largest objective gradient among the
   allowed ones; ``search_width`` candidates, each replacing ``n_replace`` random positions with
   random top-k tokens. Options from the study's fork of nanoGCG (:mod:`rmfast.gcg.select`, off by
   default): ``distance_penalty`` adds ``w * ||E[cur_p] - E[v]||`` to the loss gradient,
   ``greedy`` takes the ``search_width`` best (position, token) pairs deterministically, and
   ``compat="authors"`` uses the fork's loss gradient, sign bug included. Already-evaluated sequences are skipped, and (by default) so are those whose
   decoded text does not re-encode, in template context, to the same ids — the reported text
   really has the reported score.
4. Evaluation. All survivors are scored by the shared-prompt :class:`~rmfast.fast.engine.Engine` in a
   few big batches (the prompt K/V is computed once per run), or by full sequences through
   ``model(...)`` (``evaluator="full"``: the plain-HF path, used as the benchmark baseline and as
   the fallback for architectures the engine does not know).
5. Buffer. The ``buffer_size`` best distinct sequences seen so far are kept. A step starts from the
   best; after each step without improvement the next step starts from the next buffer entry
   (round robin), so a stuck best does not exhaust its neighbourhood alone. ``patience`` steps
   without improvement end a restart.

Example:
    >>> from rmfast import load  # doctest: +SKIP
    >>> from rmfast.gcg import GCGConfig, run  # doctest: +SKIP
    >>> lm = load("smollm2-135m-instruct")  # doctest: +SKIP
    >>> res = run(lm.model, lm.tokenizer, "What, in one word, is the best thing ever?",
    ...           GCGConfig(length=8, steps=20, search_width=128, maximize=False))  # doctest: +SKIP
    >>> res.best_text, res.best_score, res.best_score_reference  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..scoring.candidates import check_context, vocab_size
from ..cpu import say_choice
from ..errors import UserError
from . import checkpoint as ck
from .config import GCGConfig
from .result import GCGInterrupted, GCGResult, RandomSearchResult, search_timing
from .select import distance_penalty, greedy_pairs, loss_gradient, objective
from .tokens import Retokenizer, allowed_tokens, initial_ids, initial_list, key, random_init, response_text, text_of
from ..scoring.batching import available_memory, oom_batches
from ..scoring.plan import ScoringPlan, decide, finish_manifest, plan_scoring
from ..template import Template, build_template

__all__ = ["GCGConfig", "GCGResult", "RandomSearchResult", "run", "random_search", "allowed_tokens"]


# --------------------------------------------------------------------------------------------
# gradient and evaluation


def _no_pad_pooling(model):
    """Batch-1 classifier forward with inputs_embeds: pad None makes HF pool the final position, silently."""
    from ..scoring.hf_path import pad_token_as

    return pad_token_as(model, None)


class _Gradient:
    """Reward and d reward / d one-hot(response) through the HF model (full sequence, autograd)."""

    def __init__(self, model, tmpl: Template, head: str, head_index: int):
        self.model, self.head, self.head_index = model, head, head_index
        self.embed = model.get_input_embeddings()
        W = self.embed.weight  # (V, D)
        self.W = W
        s = getattr(self.embed, "embed_scale", None)
        self.scale = s.to(W.dtype) if isinstance(s, torch.Tensor) else (1.0 if s is None else s)
        dev = W.device
        tail = tmpl.suffix_ids if head == "score" else tmpl.continuation_ids
        with torch.no_grad():
            self.pre = self.embed(torch.tensor(tmpl.prefix_ids, dtype=torch.long, device=dev))  # (P, D)
            self.post = (self.embed(torch.tensor(tail, dtype=torch.long, device=dev)) if tail
                         else W.new_zeros(0, W.shape[1]))  # (S or m, D)
        self.cont = torch.tensor(tmpl.continuation_ids, dtype=torch.long, device=dev)  # (m,)
        # a gated head (ArmoRM/QRM) finds its gating position in the tokens: it is told them beside the
        # embeddings (the prompt's gate, or a later one a candidate's own tokens hold, as in scoring)
        self.ids_around = ((torch.tensor(tmpl.prefix_ids, dtype=torch.long), torch.tensor(tail, dtype=torch.long))
                           if getattr(model, "rmfast_head", None) is not None else None)

    def __call__(self, ids: torch.Tensor) -> tuple[float, torch.Tensor]:
        """ids: (L,) long. Returns (reward, (L, V) fp32 gradient of the reward)."""
        from ..scoring.hf_path import reward_from_outputs

        W = self.W
        L = ids.shape[0]
        with torch.enable_grad():
            oh = torch.zeros(L, W.shape[0], dtype=W.dtype, device=W.device)
            oh.scatter_(1, ids.to(W.device)[:, None], 1.0)
            oh.requires_grad_(True)
            e = (oh @ W) * self.scale  # (L, D), bitwise the embedding module's output
            x = torch.cat([self.pre, e, self.post], dim=0)[None]  # (1, P+L+T, D)
            if self.head == "score":
                kw = {}
                if self.ids_around is not None:
                    pre, post = self.ids_around
                    kw["gating_ids"] = torch.cat([pre, ids.cpu(), post])[None].to(W.device)  # (1, P+L+T)
                with _no_pad_pooling(self.model):
                    out = self.model(inputs_embeds=x, **kw)
                r = reward_from_outputs(out, self.head_index)[0]
            else:
                m = self.cont.shape[0]
                logits = self.model(inputs_embeds=x, logits_to_keep=L + m + 1).logits[0].float()  # (L+m+1, V)
                logp = torch.log_softmax(logits[:-1], dim=-1)  # row j predicts sequence position P+j
                r = (logp[:L] * oh.float()).sum()
                if m:
                    r = r + logp[L:].gather(1, self.cont[:, None]).sum()
            (g,) = torch.autograd.grad(r, oh)
        return float(r.detach()), g.float()


def _score_all(plan: ScoringPlan, cands: torch.Tensor) -> torch.Tensor:
    """(B, L) candidates -> (B,) fp32 scores, in the plan's batches (halved on out-of-memory; later
    calls keep the smaller size)."""
    L = cands.shape[1]
    out = torch.empty(cands.shape[0], dtype=torch.float32)
    bs = plan.rows_per_batch(L)
    for lo, hi, s, b in oom_batches(cands.shape[0], bs, plan.device, lambda lo, hi, b: plan.score(cands[lo:hi], b)):
        out[lo:hi] = torch.from_numpy(s)
        if b < bs:
            plan._rows[(L, None)] = b
    return out


# --------------------------------------------------------------------------------------------
# the search


def _sample(start: torch.Tensor, top: torch.Tensor, width: int, n_replace: int, gen: torch.Generator) -> torch.Tensor:
    """width candidates: start with n_replace random positions set to random top-k tokens. (width, L)."""
    L, k = top.shape
    r = min(n_replace, L)
    pos = torch.rand(width, L, generator=gen).argsort(dim=1)[:, :r]  # (width, r) distinct positions
    pick = torch.randint(k, (width, r), generator=gen)  # (width, r)
    cands = start[None].expand(width, L).clone()
    cands.scatter_(1, pos, top[pos, pick])
    return cands


@dataclass
class _Search:
    """What every restart and step of one run shares: template, token mask, scorer, gradient, counters."""

    cfg: GCGConfig
    tokenizer: object
    tmpl: Template
    head: str
    n_vocab: int
    allowed: torch.Tensor  # (n_vocab,) bool
    allowed_ids: torch.Tensor  # (n_allowed,) long
    retok: Retokenizer | None
    init_ids: list[int] | None
    init_list: list[list[int]] | None  # init_strings' ids (all of length L)
    L: int  # response length
    k: int  # substitutions kept per position
    plan: ScoringPlan
    prefix_s: float
    grad_fn: _Gradient
    sign: float  # +1 maximize, -1 minimize: the objective is sign * reward
    emb: torch.Tensor | None = None  # (n_vocab, D) fp32 embedding rows, for the distance penalty
    seen: dict[bytes, None] = field(default_factory=dict)  # every candidate evaluated (its key), in the order first seen
    n_eval: int = 0
    n_dup: int = 0
    n_rej: int = 0
    n_nonfinite: int = 0  # candidates whose score came out NaN or +-inf: never taken as best
    nonfinite_ids: list[list[int]] = field(default_factory=list)  # the first few of them
    t_grad: float = 0.0
    t_filter: float = 0.0
    t_eval: float = 0.0
    t_eval_steps: float = 0.0  # of t_eval, inside the steps (the rest: each restart's start)
    step_times: list[float] = field(default_factory=list)
    unfinished_step_s: float = 0.0  # a step Ctrl-C stopped: its time until then
    live: tuple | None = None  # the running restart's (r, start ids, buffer, trajectory, evaluations): an interrupt's
    checkpoint: Path | None = None  # where the search's last step boundary is saved (rmfast.gcg.checkpoint)
    job: dict | None = None  # the job that checkpoint names
    boundary: ck.Boundary | None = None  # the last step boundary (what a save writes)
    saved_at: float = 0.0
    resumed: dict | None = None  # where a checkpoint put this search (the manifest's "resumed")
    notes: bool = False  # print the one-line notes (going on from a checkpoint; the first step's estimate)


#: host bytes per token of one step's sampled candidates: random keys (fp32), their argsort and the rows (int64 each),
#: and the rows as Python lists (a pointer and an int object a token)
ROW_TOKEN_BYTES = 4 + 8 + 8 + 8 + 32


def _check_rows_fit(rows: int, L: int, what: str) -> None:
    """One line, before any work, for ``rows`` candidates of ``L`` tokens that cannot fit in half the host's
    available memory at once (a search width of 10^9 was an out-of-memory kill)."""
    need, avail = rows * L * ROW_TOKEN_BYTES, available_memory(torch.device("cpu"))
    if avail is not None and need > avail // 2:
        raise UserError(f"{what} {rows:,} x {L} tokens needs ~{need / 2**30:,.1f} GiB at once, over half of this "
                        f"machine's available {avail / 2**30:.1f} GiB: give a smaller {what}")


def _say_capped(cfg: GCGConfig, k: int, L: int) -> None:
    """One line for a setting past what the search has, and what runs instead (the manifest records both)."""
    if cfg.topk > k:
        warnings.warn(f"rmfast: gcg: --topk {cfg.topk} is more than the {k:,} allowed tokens: every allowed token is a "
                      f"substitution (topk {k:,})", stacklevel=4)
    if not cfg.greedy and cfg.n_replace > L:
        warnings.warn(f"rmfast: gcg: --n-replace {cfg.n_replace} is more than the response's {L} tokens: every "
                      f"candidate changes all {L}", stacklevel=4)


def _prepare(model, tokenizer, prompt: str, cfg: GCGConfig, template: Template | None) -> _Search:
    """Template, head, allowed tokens, the initial ids, the scorer and the gradient of one run."""
    tmpl = template or build_template(tokenizer, prompt, template=cfg.template, system=cfg.system)
    n_vocab = vocab_size(model, tokenizer)
    allowed = allowed_tokens(tokenizer, n_vocab, allow_non_ascii=cfg.allow_non_ascii, allow_special=cfg.allow_special)
    allowed_ids = allowed.nonzero()[:, 0]
    if allowed_ids.numel() == 0:
        raise UserError("no allowed tokens left (try --allow-non-ascii / --allow-special)")
    retok = Retokenizer(tokenizer, tmpl) if cfg.retokenize_filter else None

    init_ids = initial_ids(tokenizer, tmpl, cfg.init, n_vocab, allowed) if cfg.init is not None else None
    init_list = initial_list(tokenizer, tmpl, cfg.init_strings, n_vocab, allowed) if cfg.init_strings else None
    L = len(init_ids) if init_ids is not None else len(init_list[0]) if init_list else cfg.length
    check_context(model, len(tmpl.prefix_ids), L, len(tmpl.suffix_ids))
    if not cfg.greedy:  # (greedy keeps at most the pairs there are)
        _check_rows_fit(cfg.search_width, L, "--search-width")
    k = min(cfg.topk, allowed_ids.numel())
    _say_capped(cfg, k, L)
    decided = decide(model, cfg.scoring(), "gcg", template=tmpl, response_tokens=L, stacklevel=4)
    head = decided.head  # the evaluator's and the gradient's

    t0 = time.perf_counter()
    plan = plan_scoring(model, tmpl, decided=decided)
    prefix_s = time.perf_counter() - t0
    if cfg.compat == "authors" and head != "score":
        raise UserError("--compat authors reproduces the fork's squared error to a reward of 30 (a score head); "
                        "drop it for a logprob head")
    grad_fn = _Gradient(model, tmpl, head, cfg.head_index)
    sign = 1.0 if cfg.maximize else -1.0
    emb = grad_fn.W[:n_vocab].detach().float() if cfg.distance_penalty else None
    return _Search(cfg, tokenizer, tmpl, head, n_vocab, allowed, allowed_ids, retok, init_ids, init_list, L, k, plan, prefix_s,
                   grad_fn, sign, emb)


def _evaluate(s: _Search, rows: list[list[int]]) -> torch.Tensor:
    """Score (B, L) rows with the run's scorer, counted and timed. Returns (B,) fp32."""
    te = time.perf_counter()
    scores = _score_all(s.plan, torch.tensor(rows, dtype=torch.long))
    s.t_eval += time.perf_counter() - te
    s.n_eval += len(rows)
    bad = (~torch.isfinite(scores)).nonzero()[:, 0].tolist()
    s.n_nonfinite += len(bad)
    s.nonfinite_ids += [list(rows[i]) for i in bad[: max(0, 5 - len(s.nonfinite_ids))]]
    return scores


def _objective(score: float, sign: float, compat: str | None = None) -> float:
    """:func:`~rmfast.gcg.select.objective` (``sign * score``, or the fork's closeness to +-30 under ``compat``), and
    -inf for a NaN or infinite score: such a candidate is never better than any."""
    return objective(score, sign, compat) if math.isfinite(score) else -math.inf


def _loss_matrix(s: _Search, cur: torch.Tensor) -> torch.Tensor:
    """Gradient step: (L, V) estimated loss change of each substitution around ``cur`` (L,), lower is
    better: the loss gradient (:func:`~rmfast.gcg.select.loss_gradient`) plus the distance penalty."""
    tg = time.perf_counter()
    r, g = s.grad_fn(cur)  # (L, V') d reward / d one-hot
    sel = loss_gradient(g[:, : s.n_vocab], r, s.sign, s.cfg.compat)
    if s.cfg.distance_penalty:
        sel = sel + distance_penalty(s.emb, cur, s.cfg.distance_penalty).to(sel.device)
    s.t_grad += time.perf_counter() - tg
    return sel.cpu()


def _top_substitutions(s: _Search, sel: torch.Tensor) -> torch.Tensor:
    """Per position, the ``k`` allowed tokens of lowest selection score. (L, k)."""
    sel = torch.where(s.allowed[None, : sel.shape[1]], -sel, torch.tensor(float("-inf")))
    return sel.topk(s.k, dim=1).indices  # (L, k)


def _admit(s: _Search, row: list[int]) -> bool:
    """A candidate not evaluated before whose text re-tokenizes to itself (counted either way)."""
    kb = key(row)
    if kb in s.seen:
        s.n_dup += 1
        return False
    s.seen[kb] = None
    if s.retok is not None and not s.retok(row):
        s.n_rej += 1
        return False
    return True


def _candidates(s: _Search, cur: torch.Tensor, sel: torch.Tensor, gen: torch.Generator) -> list[list[int]]:
    """``search_width`` candidates around ``cur`` (L,) that :func:`_admit` keeps: sampled from the
    per-position top-k, or (``greedy``) the best (position, token) pairs in order."""
    tf = time.perf_counter()
    if s.cfg.greedy:
        keep, base = [], cur.tolist()
        for p, t in greedy_pairs(sel, s.allowed, cur):
            row = base[:p] + [t] + base[p + 1:]
            if _admit(s, row):
                keep.append(row)
                if len(keep) == s.cfg.search_width:
                    break
    else:
        cands = _sample(cur, _top_substitutions(s, sel), s.cfg.search_width, s.cfg.n_replace, gen)  # (width, L)
        keep = [row for row in cands.tolist() if _admit(s, row)]
    s.t_filter += time.perf_counter() - tf
    return keep


def _merge(buffer: list[tuple[float, list[int]]], rows: list[list[int]], scores: torch.Tensor, sign: float,
           size: int, compat: str | None = None) -> list[tuple[float, list[int]]]:
    """The buffer: the ``size`` best (score, ids) of the old buffer and the newly scored rows, best first by
    :func:`_objective`. Rows scored NaN or +-inf never enter it; a buffer of such rows only (a start scored NaN)
    keeps one entry to step from until a finite score replaces it."""
    finite = torch.isfinite(scores)
    order = torch.argsort(torch.where(finite, objective(scores, sign, compat), -math.inf), descending=True)[:size].tolist()
    merged = buffer + [(float(scores[i]), rows[i]) for i in order if finite[i]]
    merged.sort(key=lambda e: -_objective(e[0], sign, compat))
    ok = [e for e in merged if math.isfinite(e[0])]
    return ok[:size] if ok else merged[:1]


def _step(s: _Search, buffer: list[tuple[float, list[int]]], start: list[int],
          gen: torch.Generator) -> tuple[list[tuple[float, list[int]]], bool]:
    """One step from ``start``: gradient, candidates, evaluation, buffer. Returns (buffer, improved)."""
    cur = torch.tensor(start, dtype=torch.long)  # (L,)
    keep = _candidates(s, cur, _loss_matrix(s, cur), gen)
    best_before = buffer[0][0]
    if keep:
        buffer = _merge(buffer, keep, _evaluate(s, keep), s.sign, s.cfg.buffer_size, s.cfg.compat)
    return buffer, _objective(buffer[0][0], s.sign, s.cfg.compat) > _objective(best_before, s.sign, s.cfg.compat)


def nonfinite_cause(model) -> str:
    """Why scores come out NaN or inf in the model's dtype (an fp32 run was told to try --dtype float32)."""
    dt = str(next(model.parameters()).dtype).removeprefix("torch.")
    if dt == "float16":
        return "float16 overflows past 65,504: try --dtype float32"
    return f"{dt} has float32's range, so the model's own weights or activations are not finite"


def _duration(seconds: float) -> str:
    """A duration in words: "45 s", "12 min", "5.1 h"."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def run_estimate(first_step_s: float, cfg: GCGConfig) -> str:
    """The line a search prints after its first step: what the whole run will take at that pace.

    >>> run_estimate(73.0, GCGConfig(steps=250))
    'gcg: the first step took 73.0 s: 250 steps x 1 restart(s) take about 5.1 h (less if --patience stops it; --steps and --search-width set it)'
    """
    total = first_step_s * cfg.steps * cfg.restarts
    return (f"gcg: the first step took {first_step_s:.1f} s: {cfg.steps} steps x {cfg.restarts} restart(s) take about "
            f"{_duration(total)} (less if --patience stops it; --steps and --search-width set it)")


def _restart(s: _Search, r: int, bar, done: list[dict], resume: ck.Boundary | None = None) -> dict:
    """Restart ``r`` (seed + r): its initial response, then steps until ``steps`` or ``patience``; ``resume``: a
    checkpoint's boundary inside this restart, gone on from (its generator state: the draws it would have made).
    ``done``: the finished restarts (what a checkpoint saves beside this one's state)."""
    cfg = s.cfg
    gen = torch.Generator().manual_seed(cfg.seed + r)
    if resume is not None:
        gen.set_state(resume.gen_state)
        start_ids, buffer, traj, evals, stale = resume.start_ids, resume.buffer, resume.traj, resume.evals, resume.stale
    else:
        start_ids, buffer = _start(s, r, gen)
        traj, evals, stale = [buffer[0][0]], [s.n_eval], 0
    s.live = (r, start_ids, buffer, traj, evals)  # what an interrupt keeps (run)
    ck.mark(s, done, r, gen, stale)
    bar.update(len(traj) - 1)
    for _ in range(len(traj) - 1, cfg.steps):
        if stale >= cfg.patience:  # (a resumed restart whose patience was lowered)
            break
        ts, probe0 = time.perf_counter(), s.plan.pad_probe_s
        e0 = s.t_eval
        try:
            buffer, improved = _step(s, buffer, buffer[stale % len(buffer)][1], gen)
        except KeyboardInterrupt:  # Ctrl-C mid-step: its time so far is the unfinished step's, not "the rest"
            s.unfinished_step_s = time.perf_counter() - ts
            raise
        finally:
            s.t_eval_steps += s.t_eval - e0 - (s.plan.pad_probe_s - probe0)
        stale = 0 if improved else stale + 1
        traj.append(buffer[0][0])
        evals.append(s.n_eval)
        s.live = (r, start_ids, buffer, traj, evals)
        s.step_times.append(time.perf_counter() - ts)
        ck.mark(s, done, r, gen, stale)
        if len(s.step_times) == 1 and s.notes:  # the first step measures the whole run's cost, less a one-off
            # padding measurement that fell in it (it had made 68 s of a 10 s step the rate)
            print(f"rmfast: {run_estimate(s.step_times[0] - (s.plan.pad_probe_s - probe0), cfg)}", file=sys.stderr,
                  flush=True)
        bar.update(1)
        bar.set_postfix_str(f"restart {r} best {buffer[0][0]:.4f} evals {s.n_eval}")
        if stale >= cfg.patience:
            break
    stop = "patience" if stale >= cfg.patience else "steps"
    bar.update(max(cfg.steps - (len(traj) - 1), 0))
    s.live = None
    return _restart_record(s, r, start_ids, buffer, traj, evals, stop)


def _start(s: _Search, r: int, gen: torch.Generator) -> tuple[list[int], list[tuple[float, list[int]]]]:
    """Restart ``r``'s initial response and buffer: the best of --init-strings, --init, or a random draw."""
    if r == 0 and s.init_list is not None:
        inits = [list(x) for x in dict.fromkeys(tuple(i) for i in s.init_list)]  # each distinct one once
        buffer = _merge([], inits, _evaluate(s, inits), s.sign, s.cfg.buffer_size, s.cfg.compat)  # best first
        s.seen.update(dict.fromkeys(key(i) for i in inits))
        return buffer[0][1], buffer
    start_ids = s.init_ids if (r == 0 and s.init_ids is not None) else random_init(s.L, s.allowed_ids, gen, s.retok)
    s0 = float(_evaluate(s, [start_ids])[0])
    s.seen[key(start_ids)] = None
    return list(start_ids), [(s0, list(start_ids))]  # best first by objective sign * score


def _restart_record(s: _Search, r: int, start_ids, buffer, traj: list, evals: list, stop: str) -> dict:
    """A restart's entry in the result: its start, its best, its trajectory and why it stopped."""
    best_s, best_ids = buffer[0]
    return {
        "seed": s.cfg.seed + r,
        "init_ids": list(start_ids),
        "init_text": text_of(s.tokenizer, s.tmpl, start_ids),
        "best_ids": best_ids,
        "best_text": text_of(s.tokenizer, s.tmpl, best_ids),
        "best_text_exact": response_text(s.tokenizer, s.tmpl, best_ids) is not None,
        "best_score": best_s,
        "trajectory": traj,
        "evaluated": evals,
        "steps_run": len(traj) - 1,
        "stopped": stop,
    }


def _manifest(model, prompt: str, s: _Search, model_info: dict | None) -> dict:
    """The plan's fields (model, prompt, template, head, dtype, engine, ...), the direction, length,
    batch size, the selection rule and versions of a run."""
    cfg = s.cfg
    return {
        **s.plan.manifest(prompt, model_info),
        "direction": "maximize" if cfg.maximize else "minimize",
        "length": s.L,
        "batch_size": s.plan.rows_per_batch(s.L),
        "n_allowed_tokens": int(s.allowed_ids.numel()),
        "resumed": s.resumed,  # None, or where a checkpoint put the search (timing counts this process's wall only)
        "gradient": "full sequence through the HF model with autograd (no prompt cache); one-hot @ embedding weight x embedding scale",
        "candidate_selection": {
            "loss": ("the fork's (reward - 30)^2 in both directions (--compat authors: its sign bug)" if cfg.compat == "authors"
                     else "-reward" if cfg.maximize else "+reward"),
            "keep": (f"the fork's: the reward closest to {'+' if cfg.maximize else '-'}30 (its loss.argmin())"
                     if cfg.compat == "authors" else "the largest reward" if cfg.maximize else "the smallest reward"),
            "distance_penalty": cfg.distance_penalty,
            "candidates": "greedy: best (position, token) pairs" if cfg.greedy else "sampled from per-position top-k",
            "topk_run": s.k,  # --topk past the allowed tokens: all of them
            "n_replace_run": min(cfg.n_replace, s.L),  # --n-replace past the length: every position
        },
    }


def run(model, tokenizer, prompt: str, config: GCGConfig | None = None, *, progress: bool = True,
        model_info: dict | None = None, template: Template | None = None, checkpoint: str | os.PathLike | None = None,
        keep_checkpoint: bool = False, notes: bool | None = None) -> GCGResult:
    """Greedy Coordinate Gradient search over ``config.length``-token responses to ``prompt``.

    Args:
        model: an HF classifier / reward model or causal LM (any dtype/device; searched in eval mode with autocast
            off, the model's own mode back after it).
        tokenizer: its tokenizer.
        prompt: the user turn.
        config: a :class:`GCGConfig` (default: all defaults).
        progress: show a progress bar with the current best (default True).
        model_info: provenance for the manifest (the loader's ``source``; default: config name).
        template: a prepared :class:`Template` (default: built from prompt, config.template, config.system).
        checkpoint: a file where the search's last step boundary is saved (:mod:`rmfast.gcg.checkpoint`); a run
            of the same search finding one goes on from it, and ends as an uninterrupted run would. Default None.
        keep_checkpoint: leave it for the caller to remove once the result is written (default False: removed on
            return).
        notes: print the one-line notes on stderr: going on from a checkpoint, and the first step's estimate of
            the run's time (default: as ``progress``; ``rmfast gcg`` prints them with --no-progress too).

    Returns:
        GCGResult; ``best_score`` is the evaluator's score of ``best_ids`` and
        ``best_score_reference`` the plain-HF path's.

    Raises:
        GCGInterrupted: on Ctrl-C once something was scored; its ``result`` is the search so far.
    """
    from ..scoring.model_mode import scoring_mode

    with scoring_mode(model):  # eval mode (no dropout in the gradient or the scores) and no caller's autocast
        return _search(model, tokenizer, prompt, config, progress=progress, model_info=model_info, template=template,
                       checkpoint=checkpoint, keep_checkpoint=keep_checkpoint, notes=notes)


def _search(model, tokenizer, prompt: str, config: GCGConfig | None, *, progress: bool, model_info: dict | None,
            template: Template | None, checkpoint, keep_checkpoint: bool, notes: bool | None) -> GCGResult:
    """:func:`run`'s search, in the model's scoring mode."""
    from tqdm.auto import tqdm

    cfg = config or GCGConfig()
    cfg.validate()
    t0 = time.perf_counter()
    s = _prepare(model, tokenizer, prompt, cfg, template)
    s.notes = progress if notes is None else notes
    resume = ck.resume(s, checkpoint, prompt, model_info)
    if resume is not None and s.notes:
        print(f"rmfast: gcg: going on from {checkpoint} ({resume.where()}; {s.n_eval} candidates evaluated before)",
              file=sys.stderr, flush=True)
    setup_s = time.perf_counter() - t0
    say_choice(model)  # the search starts: every check of the input is behind us

    restarts: list[dict] = [] if resume is None else list(resume.done)
    bar = tqdm(total=cfg.steps * cfg.restarts, unit="step", desc="gcg", disable=not progress, dynamic_ncols=True)
    bar.update(sum(x["steps_run"] for x in restarts))
    interrupted = False
    try:
        for r in range(len(restarts), cfg.restarts):
            within = resume if resume is not None and resume.r == r and resume.start_ids is not None else None
            restarts.append(_restart(s, r, bar, restarts, within))
            ck.mark(s, restarts, r + 1, None, 0, force=True)  # between restarts
    except KeyboardInterrupt:  # the search so far is a result: kept (GCGInterrupted), unless nothing was scored
        ck.save_now(s)  # the last step boundary, whatever the time since the last save
        if s.live is None and not restarts:
            raise
        if s.live is not None:
            restarts.append(_restart_record(s, *s.live, stop="interrupted"))
        interrupted = True
    finally:
        bar.close()
    res = _result(model, tokenizer, prompt, s, restarts, t0, setup_s, model_info, interrupted)
    if interrupted:
        raise GCGInterrupted(res)
    if checkpoint is not None and not keep_checkpoint:
        Path(checkpoint).unlink(missing_ok=True)
    return res


def _result(model, tokenizer, prompt: str, s: _Search, restarts: list[dict], t0: float, setup_s: float,
            model_info, interrupted: bool) -> GCGResult:
    """The result of the restarts run (all of them, or those an interrupt left)."""
    from ..scoring.hf_path import hf_scores

    cfg = s.cfg
    best_r = max(range(len(restarts)), key=lambda i: _objective(restarts[i]["best_score"], s.sign, cfg.compat))
    best_s, best_ids = restarts[best_r]["best_score"], restarts[best_r]["best_ids"]
    _say_nonfinite(s)
    ref = float(hf_scores(model, s.tmpl, [best_ids], head=s.head, head_index=cfg.head_index)[0])
    wall = time.perf_counter() - t0
    return GCGResult(
        best_ids=list(best_ids),
        best_text=text_of(tokenizer, s.tmpl, best_ids),
        best_score=best_s,
        best_score_reference=ref,
        trajectory=restarts[best_r]["trajectory"],
        restarts=restarts,
        n_evaluated=s.n_eval,
        n_skipped_duplicate=s.n_dup,
        n_rejected_retokenize=s.n_rej,
        n_nonfinite=s.n_nonfinite,
        config={**dataclasses.asdict(cfg), "length": len(best_ids)},  # the length that ran (an init text sets it)
        manifest=finish_manifest({**_manifest(model, prompt, s, model_info), "n_nonfinite": s.n_nonfinite,
                                  "nonfinite_ids": s.nonfinite_ids}, t0, plan=s.plan, options=cfg.scoring()),
        timing=search_timing(s, wall, setup_s),
        interrupted=interrupted,
    )


def _say_nonfinite(s: _Search) -> None:
    """One warning naming how many candidates scored NaN/inf (none of them can be the best); a UserError
    when no candidate at all had a finite score: there is no best to report."""
    if not s.n_nonfinite:
        return
    what = (f"{s.n_nonfinite} of {s.n_eval} candidates scored NaN or inf (e.g. ids {s.nonfinite_ids[0]}); "
            f"{nonfinite_cause(s.plan.model)}")
    if s.n_nonfinite >= s.n_eval:
        raise UserError(f"gcg: every candidate scored NaN or inf ({s.n_eval} evaluated): no best to report; "
                        f"{nonfinite_cause(s.plan.model)}")
    warnings.warn(f"rmfast: gcg: {what}; they were never taken as best (n_nonfinite in the result)", stacklevel=3)


def random_search(model, tokenizer, prompt: str, config: GCGConfig | None = None, n_candidates: int = 1000,
                  *, template: Template | None = None) -> RandomSearchResult:
    """The baseline: ``n_candidates`` distinct uniformly random responses of ``config.length`` allowed
    tokens (the same exclusions and re-tokenization filter as GCG), best in ``config``'s direction."""
    cfg = config or GCGConfig()
    cfg.validate()
    tmpl = template or build_template(tokenizer, prompt, template=cfg.template, system=cfg.system)
    n_vocab = vocab_size(model, tokenizer)
    allowed_ids = allowed_tokens(tokenizer, n_vocab, allow_non_ascii=cfg.allow_non_ascii,
                                 allow_special=cfg.allow_special).nonzero()[:, 0]
    retok = Retokenizer(tokenizer, tmpl) if cfg.retokenize_filter else None
    L = cfg.length
    check_context(model, len(tmpl.prefix_ids), L, len(tmpl.suffix_ids))
    _check_rows_fit(n_candidates, L, "n_candidates")
    plan = plan_scoring(model, tmpl, cfg.scoring(), job="random-search", response_tokens=L, stacklevel=3)
    gen = torch.Generator().manual_seed(cfg.seed)
    seen: set[bytes] = set()
    keep: list[list[int]] = []
    tries = 0
    while len(keep) < n_candidates and tries < 100 * n_candidates:
        batch = allowed_ids[torch.randint(allowed_ids.numel(), (max(64, n_candidates), L), generator=gen)]
        for row in batch.tolist():
            tries += 1
            kb = key(row)
            if kb in seen or (retok is not None and not retok(row)):
                continue
            seen.add(kb)
            keep.append(row)
            if len(keep) == n_candidates:
                break
    scores = _score_all(plan, torch.tensor(keep, dtype=torch.long))
    sign = 1.0 if cfg.maximize else -1.0
    # NaN/inf is never the best; the search's own pick (the fork's closest to +-30 under --compat authors)
    ranked = torch.where(torch.isfinite(scores), objective(scores, sign, cfg.compat), -math.inf)
    if not torch.isfinite(scores).any():
        raise UserError(f"random search: every candidate scored NaN or inf ({len(keep)} evaluated): no best to "
                        f"report; {nonfinite_cause(plan.model)}")
    i = int(torch.argmax(ranked))
    return RandomSearchResult(best_ids=keep[i], best_score=float(scores[i]), n_evaluated=len(keep), scores=scores.tolist(),
                              best_text=text_of(tokenizer, tmpl, keep[i]))
