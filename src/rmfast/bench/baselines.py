"""The plain Hugging Face baselines of ``rmfast bench`` and the checks that every method agrees.

* **naive**: the full templated sequence per candidate (:func:`naive_scorer`, over
  :func:`rmfast.scoring.hf_path.hf_scores`).
* **hf-cache**: the prompt's KV cache reused, copied per row (:class:`HFCacheScorer`).
* agreement in the benchmark dtype (:func:`agreement`) and exactness in fp32 (:func:`fp32_check`).
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import torch

from ..scoring.hf_path import flat_lm_head  # shared with the plain-HF reference


def set_attention(model, impl: str) -> tuple[str, str | None]:
    """The HF baselines' attention implementation (transformers' ``set_attn_implementation``): ``impl`` where the
    model takes it, else eager, which every model takes (Gemma 2 refuses sdpa: its logit soft-capping); returns
    (the implementation set, a one-line note where it is not ``impl``). rmfast's engine has its own attention, so
    this changes only the baselines (and the plain-HF engine, for an architecture off the fast path)."""
    def put(name: str) -> None:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(name)
        else:
            model.config._attn_implementation = name

    try:
        put(impl)
        return impl, None
    except (ValueError, ImportError) as e:
        put("eager")
        why = str(e).split(". ")[0].split("\n")[0]
        return "eager", f"the baseline's attention: {impl} refused ({why}); eager"


class HFCacheScorer:
    """Plain Hugging Face with the prompt's KV cache reused: the strongest baseline without rmfast.

    The prompt runs once (``use_cache=True``). Each batch gets a deep copy of that cache repeated
    per row (``batch_repeat_interleave``), because HF's cache grows along the sequence axis in
    place; the candidate + template suffix then run with that cache (:func:`cache_kwarg`). The LM head
    runs under :func:`flat_lm_head` (a torch CPU accident, not the method's cost).
    """

    def __init__(self, model, template, *, head: str, head_index: int = 0):
        self.model, self.template, self.head, self.head_index = model, template, head, head_index
        self.device = next(model.parameters()).device
        self.suffix = torch.tensor(template.suffix_ids, dtype=torch.long, device=self.device)
        self.cont = torch.tensor(template.continuation_ids, dtype=torch.long, device=self.device)
        prefix = torch.tensor([template.prefix_ids], dtype=torch.long, device=self.device)
        self.net = model.model if head == "score" else model  # what runs the prompt and the rows
        self.cache_name = cache_kwarg(self.net)
        with torch.no_grad(), flat_lm_head(model):
            if head == "score":
                out = self.net(input_ids=prefix, use_cache=True)
                self.prefix_lp = None
            else:
                out = self.net(input_ids=prefix, use_cache=True, logits_to_keep=1)
                self.prefix_lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)  # (V,)
        self.cache = getattr(out, self.cache_name)

    def _cache_for(self, B: int) -> dict:
        """The prompt's cache repeated per row, as the keyword argument the model takes it by."""
        c = copy.deepcopy(self.cache)
        c.batch_repeat_interleave(B)
        return {self.cache_name: c}

    @torch.no_grad()
    def score(self, responses: torch.Tensor) -> torch.Tensor:
        """(B, n) response ids -> (B,) fp32 scores."""
        responses = responses.to(self.device)
        B, n = responses.shape
        if self.head == "score":
            ids = torch.cat([responses, self.suffix.expand(B, -1)], dim=1)  # (B, n+S)
            h = self.net(input_ids=ids, **self._cache_for(B), use_cache=True).last_hidden_state
            # h: (B, n+S, D); the score head reads the final position
            return self.model.score(h[:, -1]).float()[:, self.head_index]
        total = self.prefix_lp[responses[:, 0]].clone()  # (B,)
        targets = torch.cat([responses[:, 1:], self.cont.expand(B, -1)], dim=1)  # (B, T)
        T = targets.shape[1]
        if T == 0:
            return total
        ids = torch.cat([responses, self.cont[:-1].expand(B, -1)], dim=1)[:, :T]  # (B, T)
        with flat_lm_head(self.model):
            logits = self.net(input_ids=ids, **self._cache_for(B), use_cache=True, logits_to_keep=T).logits
        # logits: (B, T, V)
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]  # (B, T)
        return total + lp.sum(-1)


def cache_kwarg(module) -> str:
    """The name ``module.forward`` takes a KV cache by, and its output returns it under: ``cache`` where the
    installed transformers has renamed it (5.24 has, and warns on every call that ``past_key_values`` goes
    in 5.40), ``past_key_values`` in versions before the rename. Asked of the signature, not the version
    number, so either works without a warning."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def naive_scorer(model, tmpl, head: str, batch_size: int):
    """The naive method as ``f((B, 1) ids) -> (B,) scores``: full sequences, ``batch_size`` rows at a time."""
    from ..scoring.hf_path import hf_scores

    def f(b):  # hf_scores batches internally (logprob: at most ~5e7 fp32 logits per batch)
        with flat_lm_head(model):
            return hf_scores(model, tmpl, b.tolist(), head=head, batch_size=batch_size)

    return f


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


U32 = 2.0 ** -24  # fp32 unit roundoff


def fp32_rounding_tol(a: np.ndarray, ref64: np.ndarray) -> float:
    """How far two fp32 evaluations of the same scores may differ by rounding alone: ``2 E`` with
    ``E = max |a - ref64| + U32 * max |ref64|``, the error of ``a`` measured against a float64
    evaluation of the same rows (its own error is 2**-29 below fp32's) plus the rounding of that
    value to fp32; another op order makes errors of the same size (tests/rounding.py derives it).

    >>> fp32_rounding_tol(np.float32([1.0, 2.0]), np.array([1.0, 2.0])) == 2 * 2.0 * U32
    True
    """
    a, r = np.asarray(a, np.float64), np.asarray(ref64, np.float64)
    return float(2.0 * (np.abs(a - r).max() + U32 * np.abs(r).max()))


def float64_scores(model, tmpl, head: str, ids: np.ndarray) -> np.ndarray:
    """The plain-HF scores of ``ids`` with the whole model (buffers too) in float64; the model is
    returned to float32 afterwards (only called on fp32 models, so the round trip is lossless)."""
    from ..scoring.hf_path import hf_scores

    try:
        model.double()
        with flat_lm_head(model):
            return hf_scores(model, tmpl, torch.from_numpy(ids)[:, None].tolist(), head=head,
                                    batch_size=len(ids)).double().numpy()
    finally:
        model.float()


def _params_to(model, dtype: torch.dtype) -> None:
    """Cast parameters only (rotary inv_freq and other buffers keep their dtype); bf16 -> fp32 -> bf16 is lossless."""
    for prm in model.parameters():
        prm.data = prm.data.to(dtype)


def fp32_check(model, tmpl, head: str, ids: np.ndarray, device: torch.device, dtype: torch.dtype,
               compile: bool = False, truth_ids: np.ndarray | None = None) -> tuple[dict, np.ndarray | None]:
    """All methods on ``ids`` with the model's parameters in fp32: the scores must be equal up to
    fp32 rounding (:func:`close_ok`). The model is cast back to ``dtype`` afterwards. With ``compile``
    rmfast is the compiled engine and the eager engine is checked against it too.

    Returns (the check, the fp32 scores of ``truth_ids`` or None): with ``truth_ids`` the same fp32
    engine (just checked equal to both plain-HF paths) also scores those ids, the fp32 truth that the
    benchmark-dtype rankings are judged against (:func:`rmfast.bench.run.check_agreement`)."""
    from ..fast.engine import Engine
    from ..scoring.hf_path import hf_scores

    c = torch.from_numpy(ids)[:, None]
    truth = None
    try:
        if dtype != torch.float32:
            _params_to(model, torch.float32)
        rm_eng = Engine(model, tmpl, head=head, compile=compile)
        rm = rm_eng.score(c).float().cpu().numpy()
        if truth_ids is not None and truth_ids.size:
            bs = max(1, ids.size)
            truth = np.concatenate([rm_eng.score(torch.from_numpy(truth_ids[i : i + bs])[:, None]).float().cpu().numpy()
                                    for i in range(0, truth_ids.size, bs)])
        del rm_eng
        eg = Engine(model, tmpl, head=head).score(c).float().cpu().numpy() if compile else None
        hf = HFCacheScorer(model, tmpl, head=head).score(c).float().cpu().numpy()
        with flat_lm_head(model):
            nv = hf_scores(model, tmpl, c.tolist(), head=head, batch_size=len(ids)).numpy()
    finally:
        if dtype != torch.float32:
            _params_to(model, dtype)
    # CPU: the same fp32 maths in another order. CUDA: also other kernels (cuBLAS/Triton split-K, atomics).
    atol, rtol = (2e-4, 1e-4) if device.type == "cpu" else (1e-3, 1e-3)
    out = {"n": int(ids.size), "atol": atol, "rtol": rtol}
    for name, x in (("hf-cache", hf), ("naive", nv)) + ((("rmfast-eager", eg),) if eg is not None else ()):
        out[f"{name}_max_abs_diff"] = float(np.abs(x.astype(np.float64) - rm).max())
        out[f"{name}_ok"] = close_ok(rm, x, atol=atol, rtol=rtol)
    return out, truth
