"""Shared steps of the lexicon analyses: standardising scores, joining words to lexicons."""

from __future__ import annotations

import pandas as pd

from .ledger import Ledger
from .lexicons import normalize_word, paper_word


def standardize_scores(df: pd.DataFrame, standardize: bool) -> pd.DataFrame:
    """Add ``value``: the score, z-scored within model × prompt over all its rows if asked.

    z-scoring makes slopes comparable across models whose score scales differ by 100×;
    it uses every scored row (the whole vocabulary), before any lexicon join.

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "score": [1.0, 2.0, 3.0]})
    >>> standardize_scores(d, True)["value"].tolist()
    [-1.0, 0.0, 1.0]
    """
    df = df.copy()
    if standardize:
        g = df.groupby(["model", "prompt"], sort=False)["score"]
        sd = g.transform("std")
        df["value"] = (df["score"] - g.transform("mean")) / sd.where(sd > 0)
    else:
        df["value"] = df["score"]
    return df


def join_words(df: pd.DataFrame, lexicon: pd.DataFrame, *, ledger: Ledger, step: str,
               what: str, method: str = "rmfast") -> pd.DataFrame:
    """Inner join of scan rows with a lexicon keyed by ``word`` (many-to-many: a word with
    several lexicon rows, like the BNC's per part of speech, gives several rows).

    The key is the text stripped and lower-cased (``method="rmfast"``) or lower-cased only
    (``"paper"``: paper A's ``tolower(token_decoded)``). Records per model × prompt how many
    rows found no entry.

    >>> lex = pd.DataFrame({"word": ["love"], "valence": [3]})
    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": [" Love", "love"]})
    >>> [len(join_words(d, lex, ledger=Ledger(), step="s", what="w", method=m))
    ...  for m in ("rmfast", "paper")]
    [2, 1]
    """
    df = df.assign(word=df["text"].map(paper_word if method == "paper" else normalize_word))
    hit = df["word"].isin(set(lexicon["word"]))
    for (m, p), n in df[~hit].groupby(["model", "prompt"], sort=False).size().items():
        ledger.drop(step, n, f"token not in the {what}", model=m, prompt=p)
    return df[hit].merge(lexicon, on="word", how="left")


def units(standardize: bool) -> str:
    """Label of the score units used."""
    return "z (SD within model × prompt)" if standardize else "raw score"


def drop_unscaled(df: pd.DataFrame, ledger: Ledger) -> pd.DataFrame:
    """Drop rows whose z-score is undefined (all scores equal in the model × prompt)."""
    bad = df["value"].isna()
    for (m, p), n in df[bad].groupby(["model", "prompt"], sort=False).size().items():
        ledger.drop("standardize", n, "scores constant within model × prompt; z undefined",
                    model=m, prompt=p)
    return df[~bad]


def per_word(tok: pd.DataFrame, keys: list[str], ledger: Ledger | None = None) -> pd.DataFrame:
    """One row per word within ``keys`` (e.g. model × prompt): the mean ``value`` and ``score`` of its tokens, every
    other column its first token's (word-level: valence, frequency). " Love", "love" and "Love" are one word with one
    valence: fitted as several rows, they weighted a word by its spellings and shrank the SE (pseudo-replication;
    review 48d). rmfast's regressions fit these rows; the paper's fit every token.

    >>> t = pd.DataFrame({"model": "m", "word": ["love", "love", "hate"], "text": [" love", "Love", "hate"],
    ...                   "valence": [3, 3, -3], "score": [1.0, 2.0, 0.0], "value": [1.0, 2.0, 0.0]})
    >>> per_word(t, ["model"])[["word", "valence", "value"]].to_dict("records")
    [{'word': 'love', 'valence': 3, 'value': 1.5}, {'word': 'hate', 'valence': -3, 'value': 0.0}]
    """
    cols = [c for c in tok.columns if c not in (*keys, "word")]
    out = tok.groupby([*keys, "word"], sort=False, as_index=False).agg(
        {c: "mean" if c in ("value", "score") else "first" for c in cols})
    if ledger is not None and len(out) < len(tok):
        ledger.note(f"{len(tok) - len(out)} tokens were spellings of a word already seen (e.g. ' Love' and 'love'); "
                    "averaged per word before fitting, so each word is one observation")
    return out
