"""Top and bottom tokens per model × prompt (the papers' optimal and pessimal tokens).

With ``shared_vocab=True`` the tables are restricted to the strings every model shares
for the prompt (the papers' comparison vocabulary: text join with de-duplication).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..data.ledger import Ledger
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans
from ..data.shared_vocab import shared_vocabulary


@dataclass(kw_only=True)
class ExtremesResult(Result):
    """extremes: model, prompt, end ("top" | "bottom"), position, text, token_id, score,
    rank (the scan's rank over everything scored)."""

    extremes: pd.DataFrame = field(default_factory=pd.DataFrame)
    shared_vocab: bool = False


def extremes(df: pd.DataFrame, *, k: int = 10, shared_vocab: bool = False, join: str = "text",
             models=None, prompts=None) -> ExtremesResult:
    """The k best and k worst scored strings per model × prompt.

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": list("abc"),
    ...                   "score": [0.0, 2.0, 1.0]})
    >>> extremes(d, k=1).extremes[["end", "text"]].values.tolist()
    [['top', 'b'], ['bottom', 'a']]
    """
    ledger = Ledger()
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    if shared_vocab:
        parts = []
        for p in pd.unique(df["prompt"]):
            sub = df[df["prompt"] == p]
            one = sub["model"].nunique() < 2
            if one:  # the rule's de-duplication still applies (its table kept strings the rule drops)
                ledger.note(f"prompt {p!r} has one model; its shared vocabulary is its own strings, de-duplicated")
            sv = shared_vocabulary(df, p, on=join, ledger=ledger, min_models=1 if one else 2)
            key = sub["text"] if join == "text" else \
                sub["token_id"].astype("int64").astype(str) + ":" + sub["text"]
            parts.append(sub[key.isin(set(sv.wide.index))])
        df = pd.concat(parts, ignore_index=True)
    rows = []
    for (m, p), g in df.groupby(["model", "prompt"], sort=False):
        order = g.sort_values(["score", "rank"], ascending=[False, True], kind="stable")
        kk = min(k, len(order))
        for end, part in (("top", order.head(kk)), ("bottom", order.tail(kk).iloc[::-1])):
            rows.append(pd.DataFrame({
                "model": m, "prompt": p, "end": end, "position": np.arange(1, len(part) + 1),
                "text": part["text"].to_numpy(), "token_id": part["token_id"].to_numpy(),
                "score": part["score"].to_numpy(), "rank": part["rank"].to_numpy()}))
    res = ExtremesResult(extremes=pd.concat(rows, ignore_index=True), shared_vocab=shared_vocab)
    res.take_ledger(ledger)
    return res
