"""``--compat authors``: the papers' published scoring loop, reproduced with all its quirks.

The published loop decodes each id to text, renders the whole conversation as text, re-tokenizes it
with special tokens (a second BOS where the template already has one), pads conversations in
batches of the papers' size (:func:`authors_batches`) and scores each batch with ``model(**inputs)``,
pooling at the checkpoint's own ``pad_token_id`` (:func:`authors_scores`): a row whose last token
equals the pad id is read at a pad or too early (:func:`hf_read_positions`). This module builds
those batches (:func:`authors_plan`), scores them as groups of the batching loop
(:func:`authors_groups`) and counts what the loop did differently (:func:`authors_diagnostics`,
:func:`authors_manifest`), for :func:`rmfast.scoring.pipeline.score_texts`.
"""

from __future__ import annotations

import numpy as np
import torch

from ..dims import text_config
from ..errors import UserError
from .batching import Group
from .candidates import render_text, tokenizer_order
from .hf_path import pad_token_as, reward_from_outputs
from .plan import engine_name

PAPER_BATCH_SIZES = {
    "nicolinho/QRM-Gemma-2-27B": 32, "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": 32, "Skywork/Skywork-Reward-Gemma-2-27B": 32,
    "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": 32, "nicolinho/QRM-Llama3.1-8B": 32, "LxzGordon/URM-LLaMa-3.1-8B": 64,
    "Ray2333/GRM-Llama3-8B-rewardmodel-ft": 64, "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft": 128,
    "RLHFlow/ArmoRM-Llama3-8B-v0.1": 32, "Ray2333/GRM-gemma2-2B-rewardmodel-ft": 256,
}
AUTHORS_BATCH_SIZE = 32  # the published loop's most common batch (five of the ten models)

def hf_read_positions(input_ids: torch.Tensor, pad_token_id) -> torch.Tensor:
    """(B,) the position a Hugging Face sequence classifier reads in each row of ``input_ids`` (B, L):
    the rightmost token that is not ``pad_token_id`` (transformers 5.x,
    ``GenericForSequenceClassification``); the final position when the pad id is None.

    Under transformers 4.x (the papers' 4.43 pin) the rule was "one before the FIRST ``pad_token_id``,
    modulo L": the same position unless the config's pad id occurs inside the sequence.

    Example:
        >>> hf_read_positions(torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]]), 0).tolist()
        [2, 4]
        >>> hf_read_positions(torch.tensor([[5, 6, 7, 0, 0]]), 3).tolist()  # pads are not the config's pad
        [4]
    """
    L = input_ids.shape[-1]
    if pad_token_id is None:
        return torch.full(input_ids.shape[:1], L - 1, dtype=torch.long)
    keep = (input_ids != pad_token_id).long()  # (B, L)
    return (torch.arange(L, device=input_ids.device) * keep).argmax(-1)


def _config_pad(model):
    """The pad id the checkpoint's config names: what the published loop's pooling used. rmfast's loader
    sets the config's pad to the tokenizer's (and keeps the checkpoint's in ``_rmfast_checkpoint_pad_id``)."""
    if hasattr(model, "_rmfast_checkpoint_pad_id"):
        return model._rmfast_checkpoint_pad_id
    return getattr(text_config(model.config), "pad_token_id", None)

def authors_encode(tokenizer, texts: list[str]):
    """The published loop's tokenization of a batch of rendered conversations: special tokens added
    (a second BOS where the template has one), padded with the tokenizer's pad on its padding side,
    truncated at ``model_max_length``. Returns a BatchEncoding of (B, L) tensors."""

    if len(texts) > 1 and tokenizer.pad_token_id is None:
        raise UserError("--compat authors pads each batch with the tokenizer's pad token, and this tokenizer has none; "
                        "use --batch-size 1 (no padding) or --compat decode-retokenize")
    return tokenizer(texts, return_tensors="pt", padding=True, truncation=True)


@torch.no_grad()

def authors_scores(model, tokenizer, texts: list[str], *, head_index: int = 0) -> tuple[torch.Tensor, dict]:
    """Scores of rendered conversations scored as ONE batch the published way: :func:`authors_encode`,
    then ``model(**inputs)`` pooling with the checkpoint's own ``pad_token_id`` (:func:`_config_pad`; no fix).

    Returns ((B,) fp32 scores, {"input_ids", "attention_mask", "read": (B,) read positions by
    :func:`hf_read_positions`}).

    Example:
        >>> authors_scores(model, tok, [render_text(tok, tmpl, "love"), render_text(tok, tmpl, "hope")])  # doctest: +SKIP
    """

    enc = authors_encode(tokenizer, texts)
    dev = next(model.parameters()).device
    pad = _config_pad(model)
    if len(texts) > 1 and pad is None:
        raise UserError("--compat authors batches rows, and this model's config has no pad_token_id, so Hugging Face "
                        "cannot pool a batch (as in the published loop); use --batch-size 1")
    with pad_token_as(model, pad):
        out = model(**{k: v.to(dev) for k, v in enc.items()})
    scores = reward_from_outputs(out, head_index).cpu()
    ids = enc["input_ids"]
    return scores, {"input_ids": ids, "attention_mask": enc["attention_mask"], "read": hf_read_positions(ids, _config_pad(model))}

def authors_batch_size(batch_size, model_name: str | None) -> tuple[int, str]:
    """Rows padded together: an explicit ``batch_size``, else the papers' size for a model they scored, else 32.
    Returns (size, where it came from)."""
    if batch_size not in ("auto", None):
        try:
            n = int(batch_size)
        except (TypeError, ValueError):
            n = 0
        if n < 1:
            raise UserError(f"--batch-size {batch_size!r} is not a positive integer or auto")
        return n, "--batch-size"
    from ..loading.registry import find

    known = find(model_name) if model_name else None
    hub = known.hub_id if known is not None else model_name
    if hub in PAPER_BATCH_SIZES:
        return PAPER_BATCH_SIZES[hub], "the papers' configuration for this model"
    return AUTHORS_BATCH_SIZE, f"default {AUTHORS_BATCH_SIZE} (the papers' most common; set --batch-size)"

def authors_batches(n: int, batch_size: int, source_ids=None, tokenizer=None) -> tuple[list[list], list[tuple[int, int]]]:
    """The published loop's batches for ``n`` candidates: (members of each batch, (batch, slot) of each candidate).

    Texts: consecutive runs of ``batch_size`` in input order. Vocabulary ids (``source_ids``): the
    loop's own batches over the whole vocabulary in id order, so that a subset is padded exactly as
    in the full run; a member outside the subset is an id (int) the caller must score too, a
    candidate is its row number in a ("row", i) tuple.

    Example:
        >>> authors_batches(5, 2)
        ([[('row', 0), ('row', 1)], [('row', 2), ('row', 3)], [('row', 4)]], [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)])
    """
    if source_ids is None:
        members = [[("row", i) for i in range(lo, min(n, lo + batch_size))] for lo in range(0, n, batch_size)]
        return members, [(i // batch_size, i % batch_size) for i in range(n)]
    order = tokenizer_order(tokenizer)
    full = sorted(order, key=order.get)
    pos = {int(t): i for i, t in enumerate(source_ids)}
    extra = [int(t) for t in source_ids if int(t) not in order]  # ids past the tokenizer: after it, in input order
    seq = full + extra
    where: dict[int, tuple[int, int]] = {}
    members: list[list] = []
    for k in sorted({(order[t] if t in order else len(full) + extra.index(t)) // batch_size for t in pos}):
        batch = seq[k * batch_size:(k + 1) * batch_size]
        members.append([("row", pos[t]) if t in pos else t for t in batch])
        for j, t in enumerate(batch):
            if t in pos:
                where[pos[t]] = (len(members) - 1, j)
    return members, [where[i] for i in range(len(source_ids))]


# --------------------------------------------------------------------------------------------
# checks

def authors_plan(tokenizer, tmpl, texts, source_ids, bs: int):
    """The published loop's batches as rendered conversation texts, and where each candidate sits."""
    members, where = authors_batches(len(texts), bs, source_ids, tokenizer)
    convs = [[render_text(tokenizer, tmpl, texts[m[1]] if isinstance(m, tuple) else tokenizer.decode([m]))
              for m in batch] for batch in members]
    return convs, where

def authors_diagnostics(model, tokenizer, convs, where) -> dict:
    """Which candidates the published loop reads at a pad (or before its end) and which get two BOS: from
    the tokenization alone (:func:`rmfast.scoring.hf_path.hf_read_positions`, the installed transformers' rule)."""

    n = len(where)
    pad_read, early_read, double_bos = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    slot_of = {}
    for i, (b, j) in enumerate(where):
        slot_of.setdefault(b, []).append((j, i))
    bos = tokenizer.bos_token_id
    for b, pairs in slot_of.items():
        enc = authors_encode(tokenizer, convs[b])
        ids, mask = enc["input_ids"], enc["attention_mask"]  # (B, L)
        read = hf_read_positions(ids, _config_pad(model))  # (B,)
        for j, i in pairs:
            real = mask[j].nonzero()[:, 0]  # attended positions
            pad_read[i] = not bool(mask[j, read[j]])
            early_read[i] = bool(mask[j, read[j]]) and int(read[j]) != int(real[-1])
            double_bos[i] = bos is not None and len(real) > 1 and int(ids[j, real[0]]) == bos == int(ids[j, real[1]])
    return {"pad_read": pad_read, "early_read": early_read, "double_bos": double_bos,
            "padding_side": tokenizer.padding_side, "tokenizer_pad_id": tokenizer.pad_token_id,
            "config_pad_id": _config_pad(model)}

def authors_groups(model, tokenizer, convs, where, head_index: int, rows_run: dict | None = None) -> list[Group]:
    """One group per published batch: every call scores the WHOLE batch (its padding decides the reads); each batch
    run is counted in ``rows_run`` (rows -> batches: the plan's, for the manifest and the summary), after its forward."""
    by_batch: dict[int, list[tuple[int, int]]] = {}
    for i, (b, j) in enumerate(where):
        by_batch.setdefault(b, []).append((j, i))
    groups = []
    for b in sorted(by_batch):
        slot = {i: j for j, i in by_batch[b]}

        def score(sel, _bs, b=b, slot=slot):
            s, _ = authors_scores(model, tokenizer, convs[b], head_index=head_index)
            if rows_run is not None:
                rows_run[len(convs[b])] = rows_run.get(len(convs[b]), 0) + 1
            return s.numpy()[[slot[int(i)] for i in sel]]

        rows = np.asarray([i for _, i in sorted(by_batch[b])], dtype=np.int64)
        groups.append(Group(rows, len(convs[b]), score))
    return groups

def authors_manifest(diag: dict, bs: int, bs_from: str, source_ids) -> dict:
    """What the published loop did differently, counted (and which candidates: token ids, else row numbers)."""
    import transformers

    key = (lambda m: np.asarray(source_ids)[m].tolist()) if source_ids is not None else (lambda m: np.flatnonzero(m).tolist())
    return {
        "batch_size": bs, "batch_size_from": bs_from, "padding_side": diag["padding_side"],
        "tokenizer_pad_id": diag["tokenizer_pad_id"], "config_pad_id": diag["config_pad_id"],
        "n_double_bos": int(diag["double_bos"].sum()), "n_pad_reads": int(diag["pad_read"].sum()),
        "n_early_reads": int(diag["early_read"].sum()),
        "pad_reads": key(diag["pad_read"]), "early_reads": key(diag["early_read"]),
        "read_rule": f"rightmost token != config pad_token_id (transformers {transformers.__version__})",
    }

def check_authors(head: str, engine: str) -> None:
    if head != "score":
        raise UserError("--compat authors reproduces the papers' reward-model scoring loop (score head); for a causal "
                        "LM's log-probabilities use --compat decode-retokenize")
    if engine_name(engine) == "fast":
        raise UserError("--compat authors runs the plain Hugging Face path (it reproduces the published loop, "
                        "padding included); drop --engine fast")
