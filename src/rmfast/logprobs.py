"""``logprobs``: the next-token log-probability of every vocabulary token as the first response token.

One forward pass over the prompt side of the conversation, then ``log_softmax`` (fp32) of the
model's own logits at the last position (so Gemma's final-logit softcapping, where a model
applies it, is included). The result is a :class:`rmfast.scoring.pipeline.ScanResult`, written in the same
format as ``scan`` (columns token_id, token, text, score, rank; manifest ``head:
"next_token_logprob"``). The full response log-probability including end-of-turn is
``scan --head logprob``; this is its first factor only where the chat template renders the start of an answer
as its generation prompt does (ChatML, Llama 3, Gemma, Mistral, Phi-3). A template that renders a finished
assistant turn otherwise (Qwen3's empty ``<think>`` block, which its generation prompt lacks) conditions the two on
different ids: this gives the token's log-probability as the model starts to answer (the generation prompt),
``scan --head logprob`` as part of the rendered conversation (-8.559 vs -8.521 on one such template).

What precedes the first response token (the "prompt side"):

* instruction-tuned models (the tokenizer has a chat template, no ``template``): the chat
  template with the user turn (and ``system``) and ``add_generation_prompt=True``, tokenized
  by ``apply_chat_template(tokenize=True)`` — what the model sees when it starts to answer;
* a Jinja ``template``: the same, rendered with that template;
* a plain ``template`` *with* ``{response}`` (``"User: {prompt}\\nAssistant: {response}"``):
  the ids before the response slot exactly as :func:`rmfast.template.build_template` splits the
  full conversation (the prefix ``scan`` uses). A space before ``{response}`` is carried by the
  response's first token (``" love"``), as the tokenizer would tokenize a real answer, so the
  prefix ends at ``"Assistant:"``;
* a plain ``template`` *without* ``{response}`` (``"User: {prompt}\\nAssistant:"``): that text,
  verbatim (nothing stripped), tokenized with the tokenizer's special tokens (BOS). Candidates
  that carry their own leading space (``" love"``) are then the natural answers. A text ending
  in whitespace is kept as given (with a warning): the next token is then conditioned on a
  lone space token, which real tokenizations of an answer rarely contain;
* base models without a chat template and no ``template``: the raw prompt (with the BOS the tokenizer adds, if any), as in
  Paper B.
"""

from __future__ import annotations

import contextlib
import time
import warnings

import numpy as np
import torch

from .version import __version__
from .scoring.candidates import check_context, check_embedded, decoded, select_ids
from .cpu import say_choice
from .errors import UserError
from .fast import ops
from .template import build_template, check_placeholders, is_plain_format

__all__ = ["logprobs", "prompt_ids", "next_token_logprobs", "vocab_strings"]

HEAD = "next_token_logprob"


def _chat_ids(tokenizer, prompt: str, system: str | None, chat_template: str | None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": prompt}
    ]
    try:
        out = tokenizer.apply_chat_template(messages, chat_template=chat_template, add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
    except Exception as e:  # jinja errors, templates that refuse roles, ...
        raise UserError(f"the chat template failed to render ({type(e).__name__}: {str(e).splitlines()[0]}); "
                        "pass a working --template") from None
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(i) for i in out]


#: the ``template`` that asks for the raw prompt (BOS + the prompt's tokens), even where the tokenizer has a chat template
RAW = "raw"


def prompt_ids(tokenizer, prompt: str, *, template: str | None = None, system: str | None = None) -> tuple[list[int], dict]:
    """The ids that precede the first response token, and a manifest entry describing them.

    See the module docstring for the four cases (chat template + generation prompt, Jinja
    template, plain format with or without ``{response}``, raw prompt: a base model's default, or
    ``template=RAW`` for any model).

    >>> ids, info = prompt_ids(tok, "Best thing?", template="User: {prompt}\\nAssistant:")  # doctest: +SKIP
    >>> info["kind"]  # doctest: +SKIP
    'plain_text'
    """
    if prompt is None or not prompt.strip():
        raise UserError("the prompt is empty; pass --prompt 'What, in one word, is the greatest thing ever?'")
    if template == RAW:  # asked for: the raw prompt whether or not the tokenizer has a chat template
        if system is not None:
            raise UserError("--system needs a chat template or a --template with a {system} placeholder, not 'raw'")
        ids, kind = list(tokenizer(prompt, add_special_tokens=True)["input_ids"]), "raw_prompt"
    elif template is not None and is_plain_format(template):
        tmpl = build_template(tokenizer, prompt, template=template, system=system)
        ids, kind = list(tmpl.prefix_ids), "plain_prefix"
    elif template is not None and "{prompt}" in template and "{%" not in template and "{{" not in template:
        if system is not None and "{system}" not in template:
            raise UserError("--system given but the plain --template has no {system} placeholder; add one or drop --system")
        check_placeholders(template)
        text = template.replace("{system}", system or "").replace("{prompt}", prompt)
        if text != text.rstrip():
            warnings.warn(
                f"rmfast: the prompt text ends in whitespace (...{{prompt}}{template.rsplit('{prompt}', 1)[-1]!r}); the next token is conditioned on it "
                "(answers such as ' love' carry their own leading space: usually 'Assistant:' without a trailing space "
                "is wanted)", stacklevel=3,
            )
        ids, kind = list(tokenizer(text, add_special_tokens=True)["input_ids"]), "plain_text"
    elif template is not None and ("{%" in template or "{{" in template):
        ids, kind = _chat_ids(tokenizer, prompt, system, template), "jinja_generation_prompt"
    elif template is not None:
        raise UserError("--template needs a {prompt} placeholder, e.g. 'User: {prompt}\\nAssistant:' "
                        "(or a Jinja chat template)")
    elif getattr(tokenizer, "chat_template", None):
        ids, kind = _chat_ids(tokenizer, prompt, system, None), "chat_generation_prompt"
    else:
        if system is not None:
            raise UserError("--system needs a chat template or a --template with a {system} placeholder; "
                            "this base model gets the raw prompt")
        ids, kind = list(tokenizer(prompt, add_special_tokens=True)["input_ids"]), "raw_prompt"
    if not ids:
        raise UserError("the prompt side tokenized to nothing; check --prompt / --template")
    info = {"kind": kind, "format": template, "system": system, "prefix_ids": [int(i) for i in ids],
            "prefix_text": tokenizer.decode(ids)}
    return ids, info


#: output rows of the LM head multiplied at once in :func:`fp32_lm_head` (bounds its fp32 copy of the weights)
HEAD_CHUNK = 16384


def fp32_head_applies(model) -> bool:
    """Whether :func:`fp32_lm_head` changes the model's head (the plan's rule:
    :func:`rmfast.scoring.decisions.choose_lm_head_dtype`)."""
    from .scoring.decisions import choose_lm_head_dtype

    value, _ = choose_lm_head_dtype(model)
    return value == "float32" and model.get_output_embeddings().weight.dtype != torch.float32


@contextlib.contextmanager
def fp32_lm_head(model):
    """Inside, the model's LM head multiplies in float32 (its weights cast chunk by chunk, its input once): a bf16
    model's logits had been bf16, and the fp32 log-softmax of them kept their 8 bits (SmolLM2's 49,152 log-probs took
    298 distinct values; 'The' and 'That' tied at rank 1, 0.04 nats apart in fp32). The model's own forward runs
    around it (its final softcap, a logit scale: applied to fp32 logits). A float32 head is left as it is."""
    if not fp32_head_applies(model):
        yield
        return
    head = model.get_output_embeddings()
    w = head.weight
    b = None if head.bias is None else head.bias.float()

    def forward(x):  # x (..., D) -> (..., V) fp32
        xf = x.float()
        out = torch.cat([xf @ w[i:i + HEAD_CHUNK].float().T for i in range(0, w.shape[0], HEAD_CHUNK)], dim=-1)
        return out if b is None else out + b

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # the class's own forward again


@torch.inference_mode()
def next_token_logprobs(model, ids) -> torch.Tensor:
    """fp32 ``log_softmax`` of the model's logits at the last position of ``ids`` (one forward pass), the LM head
    multiplied in fp32 (:func:`fp32_lm_head`).

    Returns a CPU tensor over the model's full output dimension.
    """
    p = next(model.parameters())
    x = torch.as_tensor([list(ids)], dtype=torch.long, device=p.device)
    mask = torch.ones_like(x)
    from .scoring.model_mode import model_lock

    with model_lock(model), fp32_lm_head(model):  # (its head's forward swapped: one call on a model at a time)
        try:
            out = model(input_ids=x, attention_mask=mask, logits_to_keep=1, use_cache=False)
        except TypeError:  # models that do not take logits_to_keep
            out = model(input_ids=x, attention_mask=mask, use_cache=False)
    logits = getattr(out, "logits", None)
    if logits is None:
        raise UserError("this model returns no logits; logprobs needs a causal language model")
    return ops.vocab_logprobs(logits[0, -1]).cpu()  # (V,) fp32; the model's forward applied any final softcap


_STRINGS: dict = {}  # (id(tokenizer), len(tokenizer)) -> (tokens, texts) over 0..n-1


def vocab_strings(tokenizer, ids: np.ndarray) -> tuple[list[str], list[str]]:
    """(tokens, texts) for ``ids``, exactly as ``scan`` makes them; the full vocabulary is decoded once per tokenizer."""
    key = (id(tokenizer), len(tokenizer))
    hit = _STRINGS.get(key)
    if hit is None or hit[0] is not tokenizer:
        n = len(tokenizer)
        toks = tokenizer.convert_ids_to_tokens(list(range(n)))
        toks = [t if isinstance(t, str) else "" for t in toks]
        texts = decoded(tokenizer, range(n))
        if len(_STRINGS) > 4:
            _STRINGS.clear()
        hit = _STRINGS[key] = (tokenizer, toks, texts)
    _, toks, texts = hit
    return [toks[i] for i in ids], [texts[i] for i in ids]


def logprobs(
    model,
    tokenizer,
    prompt: str,
    *,
    template: str | None = None,
    system: str | None = None,
    token_ids=None,
    exclude_special: bool = False,
    model_info: dict | None = None,
):
    """Next-token log-probability of every candidate id as the first response token.

    Args:
        model: a causal LM (eval mode); any dtype — the log-softmax is taken in fp32 (load in
            float32 for exact references).
        tokenizer: its tokenizer.
        prompt: the user turn.
        template: None (chat template + generation prompt; the raw prompt for models without a
            chat template), a Jinja chat template, or a plain format such as
            ``"User: {prompt}\\nAssistant:"`` (see the module docstring for ``{response}``).
        system: system message (chat templates, or a plain format with ``{system}``).
        token_ids: None (the whole vocabulary), a range "A:B", a file, or ids (as in ``scan``).
        exclude_special: drop special / added tokens from the output (they still take part in
            the softmax: the log-probabilities are the model's, over its full output).
        model_info: provenance for the manifest (the loader's ``source``).

    Returns:
        :class:`rmfast.scoring.pipeline.ScanResult` with ``scores`` = log p(token | prompt side), fp32.

    Example:
        >>> from rmfast import load  # doctest: +SKIP
        >>> lm = load("smollm2-135m-instruct", dtype="float32")  # doctest: +SKIP
        >>> res = logprobs(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
        >>> res.top(5)  # doctest: +SKIP
    """
    from .scoring.batching import count_nonfinite
    from .scoring.options import ScoringOptions
    from .scoring.plan import decide, finish_manifest, score_meaning
    from .scoring.results import ScanResult

    t0 = time.perf_counter()
    try:  # the plan's decisions for this job (a logprob head: an LM head), with this command's words
        decided = decide(model, ScoringOptions(head="logprob"), "logprobs")
    except UserError:
        raise UserError("logprobs needs a causal language model; this model has no LM head") from None
    ids, info = prompt_ids(tokenizer, prompt, template=template, system=system)
    check_context(model, len(ids), 0)  # the scored token is predicted after the last prompt position
    check_embedded(model, ids)  # before the forward: an IndexError from inside the embedding had been all it said
    cand, n_vocab, _ = select_ids(model, tokenizer, token_ids, exclude_special=exclude_special)
    say_choice(model)  # the --dtype auto line, as a scan prints it (bf16 picked here had been said nowhere)
    t_fwd = time.perf_counter()
    lp = next_token_logprobs(model, ids)
    fwd_s = time.perf_counter() - t_fwd
    if lp.shape[0] < n_vocab:
        raise UserError(f"the model's output has {lp.shape[0]} logits but the vocabulary has {n_vocab} ids")
    scores = lp.numpy()[cand].astype(np.float32)
    tokens, texts = vocab_strings(tokenizer, cand)
    p = next(model.parameters())
    manifest = {
        "rmfast_version": __version__,
        "model": model_info or {"name": getattr(model.config, "name_or_path", None) or type(model).__name__},
        "architecture": (getattr(model.config, "architectures", None) or [type(model).__name__])[0],
        "prompt": prompt,
        "template": info,
        "head": HEAD,
        "score_meaning": score_meaning(HEAD),  # what `score` is, in the manifest and the Parquet, as scan's
        "dtype": str(p.dtype).replace("torch.", ""),
        "logsoftmax_dtype": "float32",
        "lm_head_dtype": decided.reasons["lm_head_dtype"]["value"],  # the logits' (the plan's decision, its reason)
        "device": str(p.device),
        "engine": "single_forward",
        "vocab_size": n_vocab,
        "n_logits": int(lp.shape[0]),
        "n_candidates": int(cand.size),
        "exclude_special": exclude_special,
        "score_position": "last prompt-side position (next-token distribution of the first response token)",
        "forward_s": round(fwd_s, 3),
        # one warning naming them, as a scan's (all 512 NaN printed a top table of NaN, exit 0, nothing said)
        "n_nonfinite": count_nonfinite(scores, cand, "token ids", dtype=str(p.dtype).replace("torch.", "")),
    }
    return ScanResult(cand, scores, tokens, texts, finish_manifest(manifest, t0, decisions=decided.reasons))
