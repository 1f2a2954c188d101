"""Implicit reward between two language models, exhaustively over their shared vocabulary.

For every string t that both models can emit as their first response token (Paper B):

* log ratio  ``log p_a(t) − log p_b(t)`` — the DPO-style implicit reward of model a against
  reference b (β = 1, one-token responses, first-token log-probabilities);
* MWLR       ``½ (p_a(t) + p_b(t)) · (log p_a(t) − log p_b(t))`` — the mixture-weighted log
  ratio, which keeps strings that neither model would say from dominating the extremes.

The log-probabilities come from :func:`rmfast.logprobs.logprobs` (one forward pass per model
and prompt). Models with different tokenizers are compared on the decoded strings they share:

1. per model, the rows are keyed by their decoded string (``join="text"``, the issue's rule),
   or by the normalised word (``join="word"``: surrounding whitespace stripped, lower-cased —
   the analysis layer's dictionary-matching key, so ``"Love"`` after a chat template's
   ``assistant\\n`` and ``" love"`` after ``Assistant:`` meet);
2. several tokens with the same key (byte pieces that all decode to U+FFFD, ``"Love"`` and
   ``" love"`` under ``join="word"``) are collapsed to the **highest** log-probability
   (``agg="max"``, default). ``agg="logsumexp"`` instead sums their probabilities (the mass of
   "some token that decodes to this string") — a different quantity, offered for comparison;
3. the keys present in both models are kept; the result counts tokens, collapsed
   duplicates, shared keys and the keys each model loses because the other lacks them.

Prompt sweeps read the Paper B YAML (``key: "prompt"`` per line) and write one tidy Parquet
with ``prompt_id`` and ``prompt`` columns. With a category dictionary (the Big Two nouns) the
word-level sweep feeds :func:`rmfast.analysis.paper_b.categories.categories` (median rank per
category) — see :func:`dictionary_summary` and ``rmfast implicit --demo``.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .version import __version__
from .errors import UserError, UserNote
from .io import check_output, manifest_path, provenance, write_csv, write_json, write_parquet
from .user_files import read_text
from .yaml_keys import yaml_load_unique, yaml_problem
from .analysis.stats.permutation import N_PERM

__all__ = [
    "ImplicitResult",
    "implicit",
    "implicit_sweep",
    "collapse",
    "join_shared",
    "reward_terms",
    "read_prompts",
    "dictionary_coverage",
    "dictionary_summary",
    "agency_communion_demo",
]

JOINS = ("text", "word")
AGGS = ("max", "logsumexp")
COLUMNS = ["text", "token_id_a", "token_id_b", "logp_a", "logp_b", "log_ratio", "mwlr",
           "rank_a", "rank_b", "rank_log_ratio", "rank_mwlr", "n_tokens_a", "n_tokens_b"]
DEMO_TEMPLATE_B = "User: {prompt}\nAssistant:"
#: what the table's scores are (the manifest's and the Parquet's ``score_meaning``, as a scan's says what ``score`` is)
SCORE_MEANING = ("no score column: logp_a, logp_b are log p(first response token | prompt side) of each shared string "
                 "under model a and model b, in nats (its tokens collapsed by the agg rule); log_ratio = logp_a - "
                 "logp_b, the implicit reward of a against reference b (beta = 1), higher = a prefers it more; "
                 "mwlr = 0.5*(p_a + p_b)*log_ratio")


def reward_terms(logp_a, logp_b) -> tuple[np.ndarray, np.ndarray]:
    """(log ratio, MWLR) from two arrays of log-probabilities, in float64.

    >>> lr, mw = reward_terms(np.log([0.5]), np.log([0.25]))
    >>> round(float(lr[0]), 6), round(float(mw[0]), 6)  # log 2, ½·0.75·log 2
    (0.693147, 0.25993)
    """
    a = np.asarray(logp_a, dtype=np.float64)
    b = np.asarray(logp_b, dtype=np.float64)
    ratio = a - b
    return ratio, 0.5 * (np.exp(a) + np.exp(b)) * ratio


def _key(texts, join: str) -> pd.Series:
    from .analysis.data.lexicons import normalize_word

    s = pd.Series(list(texts), dtype=object)
    return s if join == "text" else s.map(normalize_word)


def collapse(res, *, join: str = "text", agg: str = "max") -> pd.DataFrame:
    """One row per key of a ScanResult: key, text (of the kept token), token_id, logp, n_tokens.

    ``agg="max"`` keeps the most probable token per key (its id and text); ``"logsumexp"``
    sums the probabilities of all tokens with that key (id/text of the most probable one).
    Under ``join="word"`` whitespace-only strings (key "") are dropped.

    >>> from rmfast.scoring.pipeline import ScanResult
    >>> r = ScanResult(np.arange(3), np.log([0.5, 0.2, 0.3]).astype("float32"), ["a", "b", "c"], ["x", "x", "y"])
    >>> collapse(r)[["key", "token_id", "n_tokens"]].values.tolist()
    [['x', 0, 2], ['y', 2, 1]]
    """
    if join not in JOINS:
        raise UserError(f"unknown join {join!r}; use one of {JOINS}")
    if agg not in AGGS:
        raise UserError(f"unknown agg {agg!r}; use one of {AGGS}")
    df = pd.DataFrame({
        "key": _key(res.texts, join).to_numpy(),
        "text": list(res.texts),
        "token_id": np.asarray(res.token_ids, dtype=np.int64),
        "logp": np.asarray(res.scores, dtype=np.float64),
    })
    df = df[~np.logical_or.reduce(list(_left_out_masks(res, join)))]
    df = df.sort_values(["logp", "token_id"], ascending=[False, True], kind="stable")
    g = df.groupby("key", sort=False)
    out = g.head(1).set_index("key")
    out["n_tokens"] = g.size()
    if agg == "logsumexp":
        top = g["logp"].max()
        mass = np.exp(df["logp"] - df["key"].map(top)).groupby(df["key"]).sum()
        out["logp"] = (top + np.log(mass)).reindex(out.index)
    return out.reset_index()[["key", "text", "token_id", "logp", "n_tokens"]]


def _left_out_masks(res, join: str):
    """(nonfinite, unreadable, blank): the rows of ``res`` no key keeps, each in one mask only. NaN/inf are no
    log-probability; a byte piece decodes to U+FFFD, whose "string" is no text (two models' pieces under that key are
    not the same string: it had joined unrelated pieces, even of one tokenizer); a whitespace-only word (``join="word"``)."""
    key = _key(res.texts, join).astype(str)
    nf = ~np.isfinite(np.asarray(res.scores, dtype=np.float64))
    unread = key.str.contains("\ufffd", regex=False).to_numpy() & ~nf
    blank = (key.to_numpy() == "") & ~nf & ~unread if join == "word" else np.zeros_like(nf)
    return nf, unread, blank


def _left_out(res, join: str) -> dict:
    """:func:`_left_out_masks` counted (each row once: a NaN byte piece had been counted twice)."""
    nf, unread, blank = _left_out_masks(res, join)
    return {"nonfinite": int(nf.sum()), "unreadable": int(unread.sum()), "blank": int(blank.sum())}


def join_shared(a, b, *, join: str = "text", agg: str = "max") -> tuple[pd.DataFrame, dict]:
    """Join two ScanResults of log-probabilities on their shared keys.

    Returns (table, counts): the table has columns :data:`COLUMNS` (``text`` is the key —
    the shared decoded string, or the normalised word), ranks 1 = highest within the shared
    set; counts has tokens_a/b (rows given), strings_a/b (distinct keys), collapsed_a/b
    (tokens folded into a key held by a more probable token), shared, dropped_a/b (keys of
    one model the other lacks), nonfinite_a/b (NaN or infinite log-probs, left out, with a note), unreadable_a/b
    (tokens decoding to U+FFFD, byte pieces: left out, no string to compare), and under ``join="word"`` blank_a/b
    (whitespace-only tokens).
    """
    ca, cb = collapse(a, join=join, agg=agg), collapse(b, join=join, agg=agg)
    m = ca.merge(cb, on="key", suffixes=("_a", "_b"))
    ratio, mwlr = reward_terms(m["logp_a"], m["logp_b"])
    t = pd.DataFrame({
        "text": m["key"].astype(str),
        "token_id_a": m["token_id_a"].astype(np.int64),
        "token_id_b": m["token_id_b"].astype(np.int64),
        "logp_a": m["logp_a"].astype(np.float64),
        "logp_b": m["logp_b"].astype(np.float64),
        "log_ratio": ratio,
        "mwlr": mwlr,
    })
    for col, src in (("rank_a", "logp_a"), ("rank_b", "logp_b"), ("rank_log_ratio", "log_ratio"), ("rank_mwlr", "mwlr")):
        t[col] = t[src].rank(ascending=False, method="min").astype(np.int64)
    t["n_tokens_a"] = m["n_tokens_a"].astype(np.int64)
    t["n_tokens_b"] = m["n_tokens_b"].astype(np.int64)
    t = t.sort_values(["rank_log_ratio", "text"], kind="stable").reset_index(drop=True)
    n_a, n_b = len(a.token_ids), len(b.token_ids)
    out = {"a": _left_out(a, join), "b": _left_out(b, join)}
    bad = {side: o["nonfinite"] for side, o in out.items()}
    for side, n in bad.items():  # left out, and said: the counts had stopped adding up without a word
        if n:
            warnings.warn(UserNote(f"rmfast: implicit: {n} of model {side}'s log-probabilities are NaN or infinite: left "
                                   f"out of the join (nonfinite_{side} in the counts)"), stacklevel=2)
    counts = {
        "join": join, "agg": agg,
        "tokens_a": int(n_a), "tokens_b": int(n_b),
        "strings_a": int(len(ca)), "strings_b": int(len(cb)),
        "collapsed_a": int(ca["n_tokens"].sum() - len(ca)), "collapsed_b": int(cb["n_tokens"].sum() - len(cb)),
        "shared": int(len(t)),
        "dropped_a": int(len(ca) - len(t)), "dropped_b": int(len(cb) - len(t)),
    }
    counts.update({"nonfinite_a": out["a"]["nonfinite"], "nonfinite_b": out["b"]["nonfinite"],
                   "unreadable_a": out["a"]["unreadable"], "unreadable_b": out["b"]["unreadable"]})
    if join == "word":  # whitespace-only tokens
        counts["blank_a"], counts["blank_b"] = out["a"]["blank"], out["b"]["blank"]
    if t.empty:
        raise UserError(f"the two models share no {'decoded strings' if join == 'text' else 'words'}; nothing to compare")
    return t, counts


@dataclass
class ImplicitResult:
    """Implicit reward of model a against model b over their shared strings.

    Attributes:
        table: text, token_id_a, token_id_b, logp_a, logp_b, log_ratio, mwlr, rank_a, rank_b,
            rank_log_ratio, rank_mwlr (1 = highest), n_tokens_a/b (tokens collapsed into the
            key); for sweeps prompt_id and prompt come first.
        counts: shared / dropped / collapsed counts (one dict; for sweeps a frame per prompt
            in ``manifest["counts"]``).
        manifest: both models' logprobs manifests (minus the prefix ids' bulk), join rule, counts.
    """

    table: pd.DataFrame
    counts: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)

    def to_pandas(self) -> pd.DataFrame:
        return self.table

    def top(self, k: int = 20, by: str = "log_ratio") -> pd.DataFrame:
        """The k strings with the highest ``by`` (log_ratio, mwlr, logp_a, logp_b)."""
        return self.table.sort_values([self._by(by), "text"], ascending=[False, True]).head(k).reset_index(drop=True)

    def bottom(self, k: int = 20, by: str = "log_ratio") -> pd.DataFrame:
        return self.table.sort_values([self._by(by), "text"], ascending=[True, True]).head(k).reset_index(drop=True)

    def _by(self, by: str) -> str:
        if by not in ("log_ratio", "mwlr", "logp_a", "logp_b"):  # a bare KeyError had been all
            raise UserError(f"by={by!r}: give one of log_ratio, mwlr, logp_a, logp_b")
        return by

    def to_parquet(self, path, overwrite: bool = False) -> Path:
        """Write ``path`` (Parquet) and ``path.json`` (manifest), each atomically."""
        p = check_output(path, overwrite)
        write_parquet(p, self.table, provenance(self.manifest))  # the Parquet alone says what its scores are
        write_json(manifest_path(p), self.manifest)
        return p


def _side_manifest(m: dict) -> dict:
    keep = {k: v for k, v in m.items() if k not in ("versions",)}
    t = dict(keep.get("template") or {})
    t["n_prefix_ids"] = len(t.get("prefix_ids") or [])
    keep["template"] = t
    return keep


def _model_name(m: dict, fallback: str) -> str:
    model = m.get("model") or {}
    return str(model.get("name") or model.get("spec") or fallback) if isinstance(model, dict) else str(model)


def _as_logprobs(side, prompt, template, system, exclude_special):
    """A ScanResult of next-token log-probs from a ScanResult or a LoadedModel / (model, tokenizer)."""
    from .logprobs import HEAD, logprobs
    from .scoring.pipeline import ScanResult

    if isinstance(side, ScanResult):
        got = side.manifest.get("prompt")
        if prompt is not None and got is not None and got != prompt:
            raise UserError(f"a log-prob result is for the prompt {got!r}, not {prompt!r}")
        head = side.manifest.get("head")
        if head is None:  # a reward scan copied without its .json had been read as log-probs, then crashed the CLI
            raise UserError("a log-prob input has no manifest saying what its scores are (a .parquet without the "
                            ".json `rmfast logprobs` writes beside it?): give the file with its manifest, or make it "
                            "again with `rmfast logprobs`")
        if np.unique(side.token_ids).size < side.token_ids.size:
            raise UserError("a log-prob input holds a token id more than once (several prompts' rows in one file?): "
                            "give one `rmfast logprobs` output per prompt")
        if head != HEAD:  # a scan's 'logprob' is log p(token + end of turn): another quantity
            raise UserError(f"an input scan holds {'reward scores' if head == 'score' else 'log p(token + end of turn)'} "
                            f"(head {head!r}), not next-token log-probabilities; make it with `rmfast logprobs`")
        if exclude_special:
            raise UserError("--exclude-special filters a model's vocabulary before its log-probs are computed; a "
                            "log-prob file is already made: make it with `rmfast logprobs --exclude-special`, or drop "
                            "the flag")
        return side
    if hasattr(side, "model") and hasattr(side, "tokenizer"):
        model, tok, info = side.model, side.tokenizer, getattr(side, "source", None)
    elif isinstance(side, tuple) and len(side) == 2:
        (model, tok), info = side, None
    else:
        raise UserError(f"expected a ScanResult, a LoadedModel or (model, tokenizer), got {type(side).__name__}")
    if prompt is None:
        raise UserError("a prompt is needed to compute log-probabilities")
    return logprobs(model, tok, prompt, template=template, system=system, exclude_special=exclude_special,
                    model_info=info)


def implicit(a, b, prompt: str | None = None, *, template_a: str | None = None, template_b: str | None = None,
             system_a: str | None = None, system_b: str | None = None, join: str = "text", agg: str = "max",
             exclude_special: bool = False) -> ImplicitResult:
    """Implicit reward (log ratio, MWLR) of a against b on one prompt.

    ``a`` and ``b``: ScanResults from :func:`rmfast.logprobs.logprobs` (then ``prompt`` etc.
    are ignored), or loaded models (:class:`rmfast.loading.loader.LoadedModel` or ``(model, tokenizer)``)
    with ``prompt`` and their templates (None: chat template + generation prompt, or the raw
    prompt for a base model).

    Example:
        >>> from rmfast import load  # doctest: +SKIP
        >>> a, b = load("smollm2-135m-instruct", dtype="float32"), load("gemma3-270m", dtype="float32")  # doctest: +SKIP
        >>> r = implicit(a, b, "What, in one word, is the greatest thing ever?",
        ...              template_b="User: {prompt}\\nAssistant:")  # doctest: +SKIP
        >>> r.counts["shared"], r.top(5)  # doctest: +SKIP
    """
    results = [x for x in (a, b) if hasattr(x, "manifest")]
    if prompt is None and len(results) == 1:  # a log-prob result carries its prompt: the model side's is that one
        prompt = results[0].manifest.get("prompt")
    ra = _as_logprobs(a, prompt, template_a, system_a, exclude_special)
    rb = _as_logprobs(b, prompt, template_b, system_b, exclude_special)
    pa, pb = ra.manifest.get("prompt"), rb.manifest.get("prompt")
    if pa is not None and pb is not None and pa != pb:
        raise UserError(f"the two log-prob results are for different prompts ({pa!r} vs {pb!r}); give two results of "
                        "one prompt (rmfast logprobs ... --prompt with the same text for both models)")
    table, counts = join_shared(ra, rb, join=join, agg=agg)
    manifest = {
        "rmfast_version": __version__,
        "kind": "implicit_reward",
        "prompt": pa if pa is not None else pb,
        "model_a": _model_name(ra.manifest, "a"),
        "model_b": _model_name(rb.manifest, "b"),
        "score_meaning": SCORE_MEANING,
        "definition": {"log_ratio": "log p_a - log p_b", "mwlr": "0.5*(p_a+p_b)*(log p_a - log p_b)",
                       "join": join, "agg": agg, "ranks": "1 = highest, within the shared strings"},
        "counts": counts,
        "a": _side_manifest(ra.manifest),
        "b": _side_manifest(rb.manifest),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return ImplicitResult(table, counts, manifest)


def read_prompts(path) -> dict[str, str]:
    """Prompts from a YAML file: a mapping ``id: prompt`` (the Paper B file), a list, or ``{prompts: ...}``.

    >>> read_prompts("../shared/data/prompts/paper_b_prompts.yaml")["greatest_ever_one"]
    'What, in one word, is the greatest thing ever?'
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"--prompts-yaml {p}: no such file")
    try:
        data = yaml_load_unique(read_text(p, "--prompts-yaml file"))
    except yaml.YAMLError as e:  # a key given twice included: PyYAML would keep only the last prompt
        raise UserError(f"{p}: not valid YAML {yaml_problem(e)}") from None
    if isinstance(data, dict) and set(data) == {"prompts"}:
        data = data["prompts"]
    if isinstance(data, list):
        data = {f"p{i:02d}": v for i, v in enumerate(data, 1)}
    if not isinstance(data, dict) or not data:
        raise UserError(f"{p}: expected a mapping 'id: prompt' (or a list of prompts)")
    out = {}
    for k, v in data.items():
        if not isinstance(v, str) or not v.strip():
            raise UserError(f"{p}: prompt {k!r} is not a non-empty string")
        out[str(k)] = v
    return out


def implicit_sweep(a, b, prompts: dict[str, str], *, template_a=None, template_b=None, system_a=None, system_b=None,
                   join: str = "text", agg: str = "max", exclude_special: bool = False,
                   progress: bool = False) -> ImplicitResult:
    """:func:`implicit` over many prompts (two loaded models): one tidy table with prompt_id, prompt.

    ``manifest["counts"]`` lists the per-prompt counts; ``counts`` holds their totals.
    """
    frames, per_prompt, first, said = [], [], None, set()
    t0 = time.perf_counter()
    for i, (pid, prompt) in enumerate(prompts.items(), 1):
        with warnings.catch_warnings(record=True) as got:  # each distinct warning once a sweep, not once a prompt
            warnings.simplefilter("always")
            r = implicit(a, b, prompt, template_a=template_a, template_b=template_b, system_a=system_a,
                         system_b=system_b, join=join, agg=agg, exclude_special=exclude_special)
        for w in got:
            if (str(w.message), w.category) not in said:
                said.add((str(w.message), w.category))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        frames.append(r.table.assign(prompt_id=pid, prompt=prompt))
        per_prompt.append({"prompt_id": pid, "prompt": prompt, **r.counts})
        first = first or r.manifest
        if progress:
            print(f"[{i}/{len(prompts)}] {pid}: {r.counts['shared']} shared", file=sys.stderr, flush=True)
    table = pd.concat(frames, ignore_index=True)
    table = table[["prompt_id", "prompt"] + [c for c in table.columns if c not in ("prompt_id", "prompt")]]
    cdf = pd.DataFrame(per_prompt)
    counts = {"prompts": len(prompts), "shared_min": int(cdf["shared"].min()), "shared_max": int(cdf["shared"].max())}
    manifest = {k: v for k, v in first.items() if k not in ("prompt", "counts")}
    manifest.update({"prompts": dict(prompts), "counts": per_prompt, "wall_s": round(time.perf_counter() - t0, 2)})
    for side in ("a", "b"):
        manifest[side] = {k: v for k, v in manifest[side].items() if k != "prompt"}
        manifest[side]["template"] = {k: v for k, v in manifest[side]["template"].items()
                                      if k not in ("prefix_ids", "prefix_text")}
    return ImplicitResult(table, counts, manifest)


# ------------------------------------------------------------------------- dictionaries


def dictionary_coverage(dictionary: pd.DataFrame, tokenizers: dict) -> pd.DataFrame:
    """Per category: how many dictionary words each tokenizer can emit as ONE token.

    Columns category, words, then per tokenizer name ``<name>`` (some single-token string
    normalises to the word: "love", " Love", ...) and ``<name>_space`` (" word" itself is one
    token), then ``all`` / ``all_space`` (in every tokenizer). Wildcard terms are not counted.
    """
    from .analysis.data.lexicons import normalize_word
    from .logprobs import vocab_strings

    dic = dictionary[~dictionary.get("wildcard", pd.Series(False, index=dictionary.index)).astype(bool)]
    words = dic[["term", "category"]].drop_duplicates()
    have, space = {}, {}
    for name, tok in tokenizers.items():
        _, texts = vocab_strings(tok, np.arange(len(tok)))
        have[name] = {normalize_word(t) for t in texts}
        space[name] = set(texts)
    rows = []
    for cat, g in words.groupby("category", sort=True):
        row = {"category": cat, "words": int(len(g))}
        for name in tokenizers:
            row[name] = int(g["term"].isin(have[name]).sum())
            row[f"{name}_space"] = int(g["term"].map(lambda w: " " + w in space[name]).sum())
        row["all"] = int(g["term"].map(lambda w: all(w in have[n] for n in tokenizers)).sum())
        row["all_space"] = int(g["term"].map(lambda w: all(" " + w in space[n] for n in tokenizers)).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def dictionary_summary(table: pd.DataFrame, dictionary, *, name_a: str = "a", name_b: str = "b",
                       prompt: str | None = None, n_perm: int = N_PERM, seed: int = 0) -> dict:
    """Category analysis of a word-level implicit sweep (``join="word"``).

    Four score columns are treated as four "models" of the analysis layer
    (:func:`rmfast.analysis.paper_b.categories.categories`, ``rank_within="matched"``): log p_a,
    log p_b, the log ratio and MWLR; each ranks the dictionary words it shares (1 = highest)
    within each prompt, and the unit is the median rank per category per prompt.

    Returns a dict of frames:
        medians: the analysis layer's medians (one row per score × prompt × category);
        summary: score × framing × category: prompts, words, mean / min / max of the median rank;
        words:   per word × framing: category, mean log ratio, mean MWLR over prompts;
        tests:   per framing: difference of median per-word mean log ratio (first category
                 minus second) and a permutation Welch-t test with category labels permuted
                 over WORDS (the analysis layer's :func:`permutation_test`) — a test of this
                 model pair's words, not of model families.
    """
    from .analysis.paper_b.categories import categories, permutation_test
    from .analysis.data.framing import framing_map
    from .analysis.data.lexicons import as_dictionary, match_dictionary

    dic = as_dictionary(dictionary)
    if "prompt" not in table.columns:
        table = table.assign(prompt=prompt or "prompt")
    cats = match_dictionary(pd.Series(pd.unique(table["text"])), dic)
    if cats.empty:
        raise UserError("no dictionary word is among the shared strings: the dictionary's terms must be words both "
                        "models have as one token (under --join word, 'Love' and ' love' count as 'love')")
    sub = table[table["text"].isin(set(cats["word"]))]
    scores = {f"log p {name_a}": "logp_a", f"log p {name_b}": "logp_b",
              f"log ratio ({name_a} - {name_b})": "log_ratio", f"MWLR ({name_a} vs {name_b})": "mwlr"}
    tidy = pd.concat([pd.DataFrame({"model": label, "prompt": sub["prompt"], "text": sub["text"], "score": sub[col]})
                      for label, col in scores.items()], ignore_index=True)
    res = categories(tidy, dic, group_by={m: m for m in scores}, mixed=False, n_perm=1, word_agg="max")
    med = res.medians
    summary = (med.groupby(["model", "framing", "category"], sort=False)
               .agg(prompts=("prompt", "nunique"), words=("n_words", "median"), mean_median_rank=("median_rank", "mean"),
                    min_median_rank=("median_rank", "min"), max_median_rank=("median_rank", "max")).reset_index())
    frame = framing_map(sub["prompt"].unique())
    w = sub.merge(cats.rename(columns={"word": "text"}), on="text").assign(framing=lambda d: d["prompt"].map(frame))
    levels = ["all"] + sorted(w["framing"].unique()) if w["framing"].nunique() > 1 else sorted(w["framing"].unique())
    word_rows, tests = [], []
    cat_names = sorted(w["category"].unique())
    for fr in levels:
        ww = w if fr == "all" else w[w["framing"] == fr]
        per = ww.groupby(["text", "category"], as_index=False).agg(log_ratio=("log_ratio", "mean"), mwlr=("mwlr", "mean"),
                                                                   prompts=("prompt", "nunique"))
        word_rows.append(per.assign(framing=fr))
        if len(cat_names) == 2:
            c1, c2 = cat_names
            v = per["log_ratio"].to_numpy()
            in1 = (per["category"] == c1).to_numpy()
            t = permutation_test(v, in1, n_perm=n_perm, seed=seed)
            tests.append({"framing": fr, "category_1": c1, "category_2": c2, "n_1": int(in1.sum()),
                          "n_2": int((~in1).sum()), "median_log_ratio_1": float(np.median(v[in1])),
                          "median_log_ratio_2": float(np.median(v[~in1])),
                          "diff_median": float(np.median(v[in1]) - np.median(v[~in1])),
                          "mean_diff": float(v[in1].mean() - v[~in1].mean()), "t": t["t"], "p_value": t["p_value"],
                          "n_perm": t["n_perm"]})
    wins = pd.DataFrame()
    if len(cat_names) == 2:
        c1, c2 = cat_names
        pv = med.pivot_table(index=["model", "framing", "prompt"], columns="category", values="median_rank", sort=False)
        pv = pv.dropna()
        wins = (pd.DataFrame({f"{c1} better": pv[c1] < pv[c2], "tie": pv[c1] == pv[c2], f"{c2} better": pv[c1] > pv[c2]})
                .groupby(level=["model", "framing"], sort=False).sum().astype(int).reset_index())
    return {"medians": med, "summary": summary, "words": pd.concat(word_rows, ignore_index=True),
            "tests": pd.DataFrame(tests), "prompt_wins": wins, "notes": [n for n in res.notes if "group test" not in n]}


def summary_text(s: dict, *, score_order=None) -> str:
    summ = s["summary"]
    piv = summ.pivot_table(index=["model", "framing"], columns="category", values="mean_median_rank", sort=False)
    words = summ.pivot_table(index=["model", "framing"], columns="category", values="words", sort=False)
    piv.columns = [f"{c} median rank" for c in piv.columns]
    words.columns = [f"{c} words" for c in words.columns]
    out = pd.concat([piv, words], axis=1)
    if score_order:
        out = out.reindex([i for m in score_order for i in out.index if i[0] == m])
    lines = ["median rank per category (1 = most preferred; mean over prompts of the per-prompt median rank):",
             out.round(1).to_string()]
    if len(s.get("prompt_wins", [])):
        w = s["prompt_wins"]
        if score_order:
            w = w.set_index("model").loc[[m for m in score_order if m in set(w["model"])]].reset_index()
        lines += ["", "prompts in which each category has the better (lower) median rank:", w.to_string(index=False)]
    if len(s["tests"]):
        t = s["tests"].copy()
        for c in ("median_log_ratio_1", "median_log_ratio_2", "diff_median", "mean_diff", "t"):
            t[c] = t[c].round(3)
        t["p_value"] = t["p_value"].round(4)
        lines += ["", "per-word mean log ratio, category 1 vs 2 (permutation Welch t over words):", t.to_string(index=False)]
    return "\n".join(lines)


# ------------------------------------------------------------------------- demo


def shared_data() -> Path:
    """The shared data folder (:func:`rmfast.analysis.data.shared.shared_data_dir`, the one rule of reproduce too)."""
    from .analysis.data.shared import shared_data_dir

    return shared_data_dir("--prompts-yaml and --dictionary")


def agency_communion_demo(*, prompts_yaml=None, dictionary=None, prompt_ids=None, out=None, overwrite: bool = False,
                          template_b: str | None = DEMO_TEMPLATE_B, cache_dir=None, progress: bool = True,
                          dtype: str = "float32", device: str = "cpu") -> dict:
    """Big Two (agency vs communion) on the embedded pair: SmolLM2-135M-Instruct (a) vs Gemma 3 270M (b).

    SmolLM2 gets its chat template + generation prompt; Gemma (a base model) gets
    ``template_b`` (default ``"User: {prompt}\\nAssistant:"``; None or ``"raw"`` = the raw prompt). Words
    are joined with ``join="word"`` (max log-probability over the single-token spellings of a
    word) so each model is scored on its natural spelling. Multi-token words cannot be seen by
    a next-token lens and drop out (counted in ``coverage``). Returns a dict with the result,
    the coverage table, the :func:`dictionary_summary` frames and a printable ``text``.
    """
    from .analysis.data.lexicons import load_dictionary
    from .loading.loader import load

    root = shared_data()
    prompts_yaml = prompts_yaml or root / "prompts" / "paper_b_prompts.yaml"
    dictionary = dictionary or root / "lexicons" / "big2_nouns.csv"
    prompts = read_prompts(prompts_yaml)
    if prompt_ids:
        missing = [p for p in prompt_ids if p not in prompts]
        if missing:
            raise UserError(f"prompt id(s) {missing} not in {prompts_yaml}")
        prompts = {k: prompts[k] for k in prompt_ids}
    dic = load_dictionary(dictionary)
    if out is not None:
        out = check_output(out, overwrite, suffix=".parquet")
    a = load("smollm2-135m-instruct", dtype=dtype, device=device, cache_dir=cache_dir)
    b = load("gemma3-270m", dtype=dtype, device=device, cache_dir=cache_dir)
    na, nb = a.source.get("name") or "a", b.source.get("name") or "b"
    res = implicit_sweep(a, b, prompts, template_b=template_b, join="word", progress=progress)
    cov = dictionary_coverage(dic, {na: a.tokenizer, nb: b.tokenizer})
    summ = dictionary_summary(res.table, dic, name_a=na, name_b=nb)
    c0 = res.manifest["counts"][0]
    scores = [f"log p {na}", f"log p {nb}", f"log ratio ({na} - {nb})", f"MWLR ({na} vs {nb})"]
    text = "\n".join([
        f"a = {na} (chat template + generation prompt); b = {nb} ({'template ' + repr(template_b) if template_b not in (None, 'raw') else 'raw prompt'})",
        f"{len(prompts)} prompt(s); join on normalised words, max log-prob per word",
        f"shared words per prompt: {c0['shared']} (a: {c0['strings_a']} words from {c0['tokens_a']} tokens, "
        f"{c0['dropped_a']} not in b; b: {c0['strings_b']} words from {c0['tokens_b']} tokens, {c0['dropped_b']} not in a)",
        "",
        "dictionary words that are a single token (some spelling / ' word' exactly):",
        cov.to_string(index=False),
        "",
        summary_text(summ, score_order=scores),
    ])
    result = {"result": res, "coverage": cov, "summary": summ, "text": text}
    if out is not None:
        res.manifest["dictionary"] = {"path": str(dictionary), "coverage": cov.to_dict("records"),
                                      "tests": summ["tests"].to_dict("records")}
        res.to_parquet(out, overwrite=overwrite)
        write_csv(Path(str(out) + ".categories.csv"), summ["summary"])
    return result

