"""Human comparison: model scores of items against the items' human scores (EloEverything).

Items are matched by exact text (the papers' de-duplication applies to the model side).
Per model × prompt: Spearman rho and Kendall tau-b with the human score. Per prompt, the
consensus model rank is set against the human rank; the largest differences both ways are the
items humans value more than the models ("models undervalue") and less.

The consensus model rank (``method``):

* ``"rmfast"`` (default): each model ranks the items, the ten ranks are averaged and the
  average is ranked again, so the consensus is a rank on the same 1..n scale as the human
  rank and depends on the models alone.
* ``"paper"``: paper A's Fig. 5B / A7 — the *median of the 11 ranks including the human
  rank*, minus the human rank, items kept in the CSV's order (``nlargest`` keeps the first
  of tied items). Including the human rank pulls the median towards it, so items where the
  models are unanimous but humans disagree get the largest gaps; the median is not
  re-ranked, so the differences are not on the human rank's scale.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data import deps
from ..data.framing import NEGATIVE, framing_map
from ..data.ledger import Ledger
from ..data.methods import check_method
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans
from ..data.shared_vocab import dedupe_text
from ..stats.rank_stats import note_underflow, spearman_p

HUMAN = "human"


@dataclass(kw_only=True)
class HumanResult(Result):
    """Tables:

    correlations: model, prompt, n, spearman_rho, spearman_p, kendall_tau_b, kendall_p
    differences:  prompt, direction ("humans rank higher" | "models rank higher"),
                  position, text, human_rank, model_rank, mean_model_rank, rank_diff
                  (rank_diff = model_rank − human_rank; rank 1 = best; ties averaged)
    trajectories: prompt, text, group, rater, rank  (rater = "human" or a model; group:
                  "human top", "human bottom", "model #1")
    ranks:        prompt, text, human_rank, <one column per model: its rank>, model_rank
    method:       "rmfast" or "paper" (how model_rank is formed; see the module docstring)
    """

    correlations: pd.DataFrame = field(default_factory=pd.DataFrame)
    differences: pd.DataFrame = field(default_factory=pd.DataFrame)
    trajectories: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    method: str = "rmfast"


def _clean_human(human: pd.DataFrame, ledger: Ledger) -> pd.DataFrame:
    if not {"text", "human_score"} <= set(human.columns):
        raise UserError("the human frame needs columns text, human_score "
                        "(see load_human_scores)")
    h = human[["text", "human_score"]].copy()
    h["human_score"] = pd.to_numeric(h["human_score"], errors="coerce")
    bad = h["human_score"].isna() | h["text"].isna()
    ledger.drop("human scores", int(bad.sum()), "item without a human score or name")
    h = h[~bad]
    dup = h["text"].duplicated(keep=False)
    ledger.drop("human scores", int(dup.sum()), "item name occurs more than once among "
                "the human scores")
    h = h[~dup]
    h["text"] = h["text"].astype(str)
    return h


def human_comparison(scans: pd.DataFrame, human: pd.DataFrame, *, k: int = 20,
                     n_trajectory: int = 5, models=None, prompts=None,
                     method: str = "rmfast") -> HumanResult:
    """Rank-correlate every model × prompt with human scores; list the largest disagreements.

    ``method``: "rmfast" (mean model rank, re-ranked) or "paper" (median of the model ranks
    and the human rank); see the module docstring.

    >>> h = pd.DataFrame({"text": list("abcd"), "human_score": [4.0, 3, 2, 1]})
    >>> s = pd.DataFrame({"model": "m", "prompt": "p", "text": list("abcd"),
    ...                   "score": [4.0, 3, 1, 2]})
    >>> round(float(human_comparison(s, h).correlations.loc[0, "spearman_rho"]), 2)
    0.8
    """
    check_method(method)
    stats = deps.stats()
    ledger = Ledger()
    h = _clean_human(human, ledger)
    df = select(validate_scans(scans, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    df = dedupe_text(df, ledger)
    known = df["text"].isin(set(h["text"]))
    for (m, p), n in df[~known].groupby(["model", "prompt"], sort=False).size().items():
        ledger.drop("match items", n, "scored text has no human score", model=m, prompt=p)
    df = df[known].merge(h, on="text")
    if df.empty:
        raise UserError("no scored text matches an item with a human score; "
                        "do the item names match the scored strings exactly?")
    negative = [p for p, f in framing_map(pd.unique(df["prompt"])).items() if f == NEGATIVE]
    if negative:  # EloEverything's Elo answers positive questions (the greatest, the most preferred)
        ledger.note(f"prompt(s) {negative} read as negatively framed, and human Elo scores rank items as the greater or "
                    "more preferred: there a positive correlation means the model's 'worst' order follows the humans' "
                    "'best' (the sign reads reversed)")
    corr, diffs, traj, rank_tables = [], [], [], []
    for p in pd.unique(df["prompt"]):
        sub = df[df["prompt"] == p]
        wide = sub.pivot(index="text", columns="model", values="score")
        models_p = list(pd.unique(sub["model"]))
        wide = wide[models_p]
        unscored = len(h) - wide.notna().all(axis=1).sum()
        if unscored:
            ledger.note(f"{p!r}: {unscored} of {len(h)} human-scored items are not scored by "
                        "every model; correlations use each model's items, the rank "
                        "comparison only items all models scored")
        hs = h.set_index("text")["human_score"]
        for m in models_p:
            col = wide[m].dropna()
            x = hs.reindex(col.index).to_numpy()
            y = col.to_numpy()
            if len(y) < 3:  # two points always lie on a line: rho = +-1 at p = 1 said nothing (as agreement refuses)
                ledger.note(f"{m} for {p!r}: {len(y)} human-scored item(s); correlations need at least 3, not computed")
                continue
            sp = stats.spearmanr(x, y)
            kt = stats.kendalltau(x, y, variant="b")
            corr.append({"model": m, "prompt": p, "n": len(y),
                         "spearman_rho": float(sp.statistic), "spearman_p": spearman_p(x, y),
                         "kendall_tau_b": float(kt.statistic), "kendall_p": float(kt.pvalue)})
        full = wide.dropna()
        if method == "paper":  # the CSV's item order decides ties, as pandas' nlargest does
            full = full.reindex([t for t in h["text"] if t in full.index])
        table = _rank_table(p, full, hs, method)
        rank_tables.append(table.reset_index(drop=True))
        for direction, asc in (("humans rank higher", False), ("models rank higher", True)):
            # only items of the direction's own sign (rank_diff > 0: humans rank it higher): with k past half the
            # items, the largest gaps of one direction ran into the other's, listed under the wrong label
            own = table[table["rank_diff"] < 0] if asc else table[table["rank_diff"] > 0]
            top = _largest(own, k, asc, method)
            if len(top) < k:
                ledger.note(f"{p!r}: {len(top)} item(s) where {direction.replace(' rank higher', '')} rank them "
                            f"higher, fewer than k = {k}; the list holds those")
            diffs.append(top[["prompt", "text", "human_rank", "model_rank", "mean_model_rank",
                              "rank_diff"]].assign(direction=direction,
                                                   position=np.arange(1, len(top) + 1)))
        traj.append(_trajectories(p, table, models_p, n_trajectory))
    cols = ["prompt", "direction", "position", "text", "human_rank", "model_rank",
            "mean_model_rank", "rank_diff"]
    corr = pd.DataFrame(corr, columns=["model", "prompt", "n", "spearman_rho", "spearman_p", "kendall_tau_b",
                                       "kendall_p"])
    note_underflow(corr, ["spearman_p", "kendall_p"], ledger)
    res = HumanResult(correlations=corr,
                      differences=pd.concat(diffs, ignore_index=True)[cols],
                      trajectories=pd.concat(traj, ignore_index=True),
                      ranks=pd.concat(rank_tables, ignore_index=True), method=method)
    res.take_ledger(ledger)
    return res


def _rank_table(prompt: str, full: pd.DataFrame, hs: pd.Series, method: str) -> pd.DataFrame:
    """Per item: the human rank, each model's rank, the consensus model rank and the gap.

    >>> full = pd.DataFrame({"m1": [3.0, 2, 1], "m2": [1.0, 3, 2]}, index=list("abc"))
    >>> hs = pd.Series([1.0, 3, 2], index=list("abc"))
    >>> _rank_table("p", full, hs, "paper")["model_rank"].tolist()  # median of (human, m1, m2)
    [3.0, 1.0, 2.0]
    >>> _rank_table("p", full, hs, "rmfast")["model_rank"].tolist()  # mean of m1, m2, re-ranked
    [2.0, 1.0, 3.0]
    """
    ranks = full.rank(ascending=False, method="average")
    table = pd.DataFrame({"prompt": prompt, "text": full.index,
                          "human_rank": hs.reindex(full.index).rank(ascending=False,
                                                                    method="average")})
    table = pd.concat([table, ranks], axis=1)
    table.index.name = None
    table["mean_model_rank"] = ranks.mean(axis=1)
    if method == "paper":  # median over the models' ranks AND the human rank, not re-ranked
        table["model_rank"] = pd.concat([table["human_rank"], ranks], axis=1).median(axis=1)
    else:
        table["model_rank"] = table["mean_model_rank"].rank(method="average")
    table["rank_diff"] = table["model_rank"] - table["human_rank"]
    return table


def _largest(table: pd.DataFrame, k: int, ascending: bool, method: str) -> pd.DataFrame:
    """The k largest (or smallest) gaps: ties by text (rmfast) or by item order (paper,
    as pandas' nlargest/nsmallest with keep='first')."""
    if method == "paper":
        return table.nsmallest(k, "rank_diff") if ascending else table.nlargest(k, "rank_diff")
    return table.sort_values(["rank_diff", "text"], ascending=[ascending, True]).head(k)


def _trajectories(prompt: str, table: pd.DataFrame, models: list[str], n: int) -> pd.DataFrame:
    by_h = table.sort_values(["human_rank", "text"])
    groups = [("human top", list(by_h["text"].head(n))),
              ("human bottom", list(by_h["text"].tail(n)))]
    firsts = []
    for m in models:
        t = table.sort_values([m, "text"])["text"].iloc[0]
        if t not in firsts:
            firsts.append(t)
    groups.append(("model #1", firsts))
    rows, seen = [], set()
    t_idx = table.set_index("text")
    for group, items in groups:
        for t in items:
            if t in seen:
                continue
            seen.add(t)
            rows.append({"prompt": prompt, "text": t, "group": group, "rater": HUMAN,
                         "rank": t_idx.loc[t, "human_rank"]})
            for m in models:
                rows.append({"prompt": prompt, "text": t, "group": group, "rater": m,
                             "rank": t_idx.loc[t, m]})
    return pd.DataFrame(rows)
