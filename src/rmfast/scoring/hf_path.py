"""The plain Hugging Face path: full templated sequences through ``model(...)``.

It is the oracle for tests, the fallback for architectures the engine does not know
(custom ``trust_remote_code`` reward models included) and the "naive" benchmark baseline.
It shares no model code with the engine beyond transformers itself: the sequence comes from
the template room, everything else is ``model.forward``.

Where the score is read: at the FINAL position of the sequence. HF sequence classifiers read
"the last token that is not ``pad_token_id``"; when the pad id equals a template token (SmolLM2's
pad is ``<|im_end|>``), that is an earlier position. Our rows are never padded (rows in a batch
have one length), so we temporarily set the pad id to -1, which never occurs, and HF's own
pooling then picks the final position.
"""

from __future__ import annotations

import contextlib

import torch

from ..dims import model_dims, text_config
from ..template import Template


@contextlib.contextmanager
def pad_token_as(model, value):
    """Temporarily set the (text) config's pad_token_id: -1 (never occurs) or None both make HF's
    sequence-classifier pooling read the final position. Under the model's lock
    (:func:`rmfast.scoring.model_mode.model_lock`): two scorers or scans of one model in two threads each saved the
    other's temporary value, and the last to finish left the config's pad_token_id at -1 for good."""
    from .model_mode import model_lock

    cfgs = [model.config]
    text_cfg = text_config(model.config)
    if text_cfg is not model.config:
        cfgs.append(text_cfg)
    with model_lock(model):
        saved = [c.pad_token_id for c in cfgs]
        try:
            for c in cfgs:
                c.pad_token_id = value
            yield
        finally:
            for c, s in zip(cfgs, saved):
                c.pad_token_id = s


def reward_from_outputs(out, head_index: int) -> torch.Tensor:
    """The reward from a classifier's outputs: ``.score`` (ArmoRM/QRM style) or ``.logits[:, i]``."""
    score = getattr(out, "score", None)
    if score is not None:
        score = score if score.dim() > 1 else score[:, None]
        return score[:, head_index].float()
    logits = out.logits if hasattr(out, "logits") else out[0]
    if logits.dim() == 3:  # a model that returns per-position outputs: take the final position
        logits = logits[:, -1]
    return logits[:, head_index].float()


@contextlib.contextmanager
def flat_lm_head(model):
    """Run the LM head as one 2-D GEMM inside a plain-HF forward.

    ``model(..., logits_to_keep=k)`` hands the head a (B, k, D) slice of the hidden states; on CPU,
    ``F.linear`` on such a 3-D view can fall back to ``bmm`` with the (V, D) weight expanded and
    COPIED per row (B x 335 MB for Gemma 3's 262,144 x 640 head: 64 rows -> 21 GB and minutes per
    batch; even one row costs 2.5 s). That is a torch/HF accident, not the method's cost, so the
    reference and the benchmark baselines get this fix: the head sees (B*k, D) and its output is viewed back to (B, k, V).
    Numerically the same GEMM. A no-op for models without an LM head.
    """
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Module) or getattr(head, "_rmfast_flat", False):
        yield  # no LM head, or already flattened by an enclosing flat_lm_head (nesting must not reshape twice)
        return
    shapes = []

    def pre(mod, a):
        x = a[0]
        shapes.append(x.shape[:-1])
        return (x.reshape(-1, x.shape[-1]), *a[1:])

    def post(mod, a, out):
        return out.view(*shapes.pop(), out.shape[-1])

    h1, h2 = head.register_forward_pre_hook(pre), head.register_forward_hook(post)
    head._rmfast_flat = True
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        head._rmfast_flat = False


def n_layers(model) -> int:
    """The number of decoder layers (HF's ``hidden_states`` has one more entry)."""
    return model_dims(model.config).layers


def final_norm_module(model) -> torch.nn.Module | None:
    """The decoder stack's final norm (what HF's last ``hidden_states`` entry comes out of), or None."""
    base = getattr(model, "base_model", model)
    base = getattr(base, "language_model", base)
    for name in ("norm", "final_layernorm", "ln_f"):
        m = getattr(base, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    return None


@contextlib.contextmanager
def norm_input(model, box: list):
    """Appends the final norm's input (B, L, D) to ``box`` on each forward (no copy, no change)."""
    norm = final_norm_module(model)
    if norm is None:
        raise ValueError("no final norm module found")
    h = norm.register_forward_pre_hook(lambda mod, a: box.append(a[0]))
    try:
        yield
    finally:
        h.remove()


def _take_states(hs, pre_norm: list, taps: set, pos: int) -> dict:
    """HF's hidden_states tuple (L + 1 entries, the last normed) and the norm's input -> {k: (b, D)}
    at sequence position ``pos``; k = n_layers is the norm's input, "normed" HF's last entry."""
    L = len(hs) - 1  # (L + 1 entries: embeddings, layers 1..L-1, then the normed output of layer L)
    out = {}
    for k in taps:
        src = pre_norm[-1] if k == L else hs[L] if k == "normed" else hs[k]
        out[k] = src[:, pos].clone()  # (b, D)
    return out


@torch.no_grad()
def hf_scores(
    model,
    template: Template,
    responses: list[list[int]],
    *,
    head: str,
    head_index: int = 0,
    batch_size: int = 64,
    progress=None,
    taps: set | None = None,
):
    """Scores of each response (a list of token ids) by full forward passes. Returns (N,) fp32.

    Rows of equal length are batched together (no padding ever). ``taps``: residual-stream
    indices 0..n_layers (as :meth:`rmfast.fast.engine.Engine.score`: n_layers is the final norm's
    input) and/or "normed" (its output, HF's last ``hidden_states``); then returns (scores,
    {k: (N, D) model dtype}) taken from the same forward (``output_hidden_states``) at the final
    position for the score head, the one that predicts the last continuation token for logprob.

    Example:
        >>> hf_scores(model, tmpl, [[1234], [5678]], head="score")  # doctest: +SKIP
    """
    dev = next(model.parameters()).device
    out = torch.empty(len(responses), dtype=torch.float32)
    by_len: dict[int, list[int]] = {}
    for i, r in enumerate(responses):
        by_len.setdefault(len(r), []).append(i)
    P = len(template.prefix_ids)
    cont = list(template.continuation_ids)
    states: dict = {}
    pre_norm: list = []
    extra = {} if taps is None else {"output_hidden_states": True}
    need_pre = taps is not None and n_layers(model) in taps
    hook = (lambda: norm_input(model, pre_norm)) if need_pre else contextlib.nullcontext
    for n, idx in by_len.items():
        seqs = [template.sequence(responses[i]) if head == "score" else [*template.prefix_ids, *responses[i], *cont] for i in idx]
        bs = batch_size
        if head == "logprob":  # keep the (B, kept, V) fp32 logits block modest
            V = model_dims(model.config).vocab
            bs = max(1, min(batch_size, int(5e7 // ((n + len(cont) + 1) * V))))
        for s in range(0, len(idx), bs):
            rows = idx[s : s + bs]
            ids = torch.tensor(seqs[s : s + bs], dtype=torch.long, device=dev)  # (b, L)
            if head == "score":
                with pad_token_as(model, -1), hook():
                    res = model(input_ids=ids, **extra)
                out[rows] = reward_from_outputs(res, head_index).cpu()
                pos = -1
            else:
                keep = n + len(cont) + 1  # logits at positions P-1 .. L-1 (the last is unused)
                with flat_lm_head(model), hook():
                    res = model(input_ids=ids, logits_to_keep=keep, **extra)
                logits = res.logits.float()  # (b, keep, V)
                pos = -2
                logp = torch.log_softmax(logits[:, :-1], dim=-1)  # predicts ids[:, P:]
                tgt = ids[:, P:]  # (b, n + m)
                out[rows] = logp.gather(-1, tgt[..., None])[..., 0].sum(-1).cpu()
            if taps is not None:
                for k, v in _take_states(res.hidden_states, pre_norm, taps, pos).items():
                    states.setdefault(k, torch.empty(len(responses), v.shape[-1], dtype=v.dtype))[rows] = v.cpu()
                pre_norm.clear()
            if progress is not None:
                progress.update(len(rows))
    return out if taps is None else (out, states)
