"""Join models on a shared vocabulary (the papers' text rule or rmfast's id rule).

The papers' rule (``on="text"``): within each model × prompt, drop every decoded string
that occurs more than once (e.g. several byte tokens decoding to U+FFFD), then keep the
strings present in every model. rmfast's stricter rule (``on="id"``): a row matches only
if both its token id and its decoded string are the same in every model, so models with
different tokenizers share nothing by accident.

:func:`shared_vocabulary` returns a wide frame per prompt::

    index: key (text, or "id:text")    columns: one per model, the score
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ...errors import UserError
from .ledger import Ledger

JOIN_RULES = ("text", "id")


@dataclass
class SharedVocabulary:
    """Scores on the shared vocabulary of one prompt.

    wide: index = key, columns = models (in the order given), values = score.
    text: the decoded string per key (same index).
    counts: per model: rows, duplicated (dropped), not_shared (dropped), shared.
    """

    prompt: str
    wide: pd.DataFrame
    text: pd.Series
    counts: pd.DataFrame = field(default_factory=pd.DataFrame)


def dedupe_text(df: pd.DataFrame, ledger: Ledger, step: str = "dedupe") -> pd.DataFrame:
    """Drop every decoded string occurring more than once within a model × prompt (all copies).

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": ["a", "a", "b"], "score": 1.0})
    >>> dedupe_text(d, Ledger())["text"].tolist()
    ['b']
    """
    dup = df.duplicated(["model", "prompt", "text"], keep=False)
    for (m, p), n in df[dup].groupby(["model", "prompt"]).size().items():
        ledger.drop(step, n, "decoded string occurs more than once within the model "
                    "(papers' de-duplication rule)", model=m, prompt=p)
    return df[~dup]


def _keys(df: pd.DataFrame, on: str) -> pd.Series:
    if on == "text":
        return df["text"]
    if df["token_id"].isna().any():
        bad = df.loc[df["token_id"].isna(), "model"].unique().tolist()
        raise UserError(f"join on token id needs token ids, but model(s) {bad} have rows "
                        "without one (text candidates); use the text join (--join text)")
    return df["token_id"].astype("int64").astype(str) + ":" + df["text"]


def shared_vocabulary(df: pd.DataFrame, prompt: str, *, on: str = "text",
                      models: list[str] | None = None, ledger: Ledger | None = None,
                      min_models: int = 2) -> SharedVocabulary:
    """Wide score matrix of one prompt over the strings every model shares.

    >>> d = pd.DataFrame({"model": ["a", "a", "b", "b"], "prompt": "p",
    ...                   "text": ["x", "y", "x", "z"], "score": [1.0, 2.0, 3.0, 4.0]})
    >>> sv = shared_vocabulary(d, "p")
    >>> sv.wide.to_dict("list")
    {'a': [1.0], 'b': [3.0]}
    """
    if on not in JOIN_RULES:
        raise UserError(f"unknown join rule {on!r}; use one of {JOIN_RULES}")
    ledger = ledger if ledger is not None else Ledger()
    sub = df[df["prompt"] == prompt]
    have = list(pd.unique(sub["model"]))
    models = have if models is None else [m for m in models if m in have]
    if len(models) < min_models:
        raise UserError(f"prompt {prompt!r} has {len(models)} model(s) with scores; "
                        f"this needs at least {min_models}")
    sub = sub[sub["model"].isin(models)]
    if on == "id":
        _keys(sub.head(0) if sub["token_id"].notna().all() else sub, on)  # raises without ids
    counts = pd.DataFrame(index=pd.Index(models, name="model"))
    counts["rows"] = sub.groupby("model").size()
    if on == "text":
        sub = dedupe_text(sub, ledger)
    else:
        dup = sub.duplicated(["model", "token_id"], keep=False)
        for m, n in sub[dup].groupby("model").size().items():
            ledger.drop("dedupe", n, "token id occurs more than once within the model",
                        model=m, prompt=prompt)
        sub = sub[~dup]
    counts["duplicated"] = counts["rows"] - sub.groupby("model").size().reindex(models).fillna(0)
    keyed = sub.assign(_key=_keys(sub, on))
    wide = keyed.pivot(index="_key", columns="model", values="score")[models]
    shared = wide.dropna()
    for m in models:
        n = int(wide[m].notna().sum() - len(shared))
        ledger.drop("intersect", n, f"{on} not present in every model of the prompt",
                    model=m, prompt=prompt)
    counts["not_shared"] = wide.notna().sum() - len(shared)
    counts["shared"] = len(shared)
    counts = counts.astype("int64").reset_index()
    if shared.empty:
        raise UserError(_nothing_shared(sub, models, prompt, on))
    text = keyed.drop_duplicates("_key").set_index("_key")["text"].reindex(shared.index)
    shared.index.name = "key"
    text.index.name = "key"
    shared.columns.name = None
    return SharedVocabulary(prompt=prompt, wide=shared, text=text, counts=counts)


def _nothing_shared(sub: pd.DataFrame, models: list, prompt: str, on: str) -> str:
    """Why no string (or id) is every model's, naming a fix that changes something: several candidate sets (a sweep's
    words and items, each analysed as 'model [set]': a word set and an item set share nothing), or the join (only
    where it is not the text join already: the line had said "use --join text" to a text join)."""
    sets = list(pd.unique(sub["candidates"].astype(str))) if "candidates" in sub.columns else []
    if len(sets) > 1:
        one = [m for m in models if str(m).endswith(f"[{sets[-1]}]")]
        return (f"prompt {prompt!r}: the candidate sets {', '.join(map(repr, sets))} share no {on} (each set is "
                f"analysed as its own 'model [set]', and every one must share the strings compared): compare one "
                f"set, e.g. --models {' '.join(repr(str(m)) for m in one)}, or rank the sets together with "
                "--pool-candidates")
    fix = ("with different tokenizers use the text join (--join text)" if on != "text" else
           "scan the same candidates (--token-ids, --candidates) with each model")
    return f"prompt {prompt!r}: the models share no {on}s after de-duplication; {fix}"
