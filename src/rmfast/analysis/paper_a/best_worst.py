"""Best vs worst: the same tokens under a positive and a negative prompt (the papers' Figure 4).

Per model, tokens scored under both prompts are paired (text join with the papers'
de-duplication, or token id + text). best + worst is high for tokens that are good
answers to both frames and low for tokens bad under both; best − worst is the
frame-sensitive (valence) axis. Scores are z-scored within model × prompt by default so
the two prompts weigh equally.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data import deps
from ..data.framing import NEGATIVE, POSITIVE, check_named_prompts, framing_map
from ..data.ledger import Ledger
from ..data.results import Result
from ..data.scans import select, validate_scans
from ..data.shared_vocab import JOIN_RULES, dedupe_text
from ..data.tokens import drop_unscaled, standardize_scores, units

#: Pseudo-model name of the across-model rows (mean z over models, shared strings only).
ALL_MODELS = "(mean over models)"


@dataclass(kw_only=True)
class BestWorstResult(Result):
    """Tables:

    extremes:     model, measure ("best+worst" | "best-worst"), end ("top" | "bottom"),
                  position, text, token_id, value, best, worst
    correlations: model, n, pearson_r, spearman_rho
    scores:       model, text, token_id, best, worst, sum, diff  (every paired token)
    """

    extremes: pd.DataFrame = field(default_factory=pd.DataFrame)
    correlations: pd.DataFrame = field(default_factory=pd.DataFrame)
    scores: pd.DataFrame = field(default_factory=pd.DataFrame)
    best_prompt: str = ""
    worst_prompt: str = ""
    units: str = ""


def pick_prompts(prompts, best: str | None, worst: str | None, framing=None) -> tuple[str, str]:
    """The (best, worst) prompt pair: as given, else the only positive and negative prompts."""
    prompts = list(prompts)
    frame = framing_map(prompts, framing)
    check_named_prompts(prompts, [("best prompt", best), ("worst prompt", worst)])
    picked = []
    missing = [(kind, label) for given, kind, label in ((best, POSITIVE, "best"), (worst, NEGATIVE, "worst"))
               if given is None and not any(frame[p] == kind for p in prompts)]
    if missing:  # said first: a prompt of one kind that is not there cannot be picked by naming the other kind's
        kind, label = missing[-1] if len(missing) == 1 or missing[-1][0] == NEGATIVE else missing[0]
        counts = {k: sum(frame[p] == k for p in prompts) for k in (POSITIVE, NEGATIVE)}
        raise UserError(f"best vs worst needs a {kind}ly framed ('{label}') prompt; none of the {len(prompts)} "
                        f"prompts is one ({counts[POSITIVE]} positive, {counts[NEGATIVE]} negative; name it with "
                        f"--{label}, or --framing PROMPT={kind})")
    for given, kind, label in ((best, POSITIVE, "best"), (worst, NEGATIVE, "worst")):
        if given is None:
            found = [p for p in prompts if frame[p] == kind]
            if not found:
                raise UserError(f"best vs worst needs a {kind}ly framed ('{label}') prompt; none of "
                                f"the {len(prompts)} prompts is one (name it with --{label}, or "
                                f"--framing PROMPT={kind})")
            if len(found) != 1:
                raise UserError(f"need one {kind} ('{label}') prompt, found {len(found)} ({found}); "
                                f"name it with --{label}")
            given = found[0]
        picked.append(given)
    best, worst = picked
    if best == worst:
        raise UserError("the best and worst prompts are the same; name two different prompts")
    return best, worst


def _check_paired(paired, disjoint, n_given, df, best: str, worst: str, ledger) -> None:
    """Why nothing was paired, in one line (no token in common; standardizing left nothing; no model with both
    prompts, naming the settings that make one model's scans other models); a note of the models left out."""
    if disjoint:
        ledger.note(f"model(s) {', '.join(map(str, disjoint))}: no token scored under both prompts; left out")
    if not paired and disjoint:
        raise UserError(f"the {best!r} and {worst!r} scans share no token (or text) of any model; scan the same "
                        "--token-ids (or candidates) under both prompts")
    if not paired and (n_given == 2).any():  # both prompts were given: standardizing left nothing
        raise UserError(f"no model has standardized scores under both {best!r} and {worst!r}: a prompt's scores that "
                        "are all equal (a scan of one token) have no z-score; scan more tokens, or pass --no-standardize")
    if not paired:
        tagged = any(str(m).endswith("]") for m in df["model"].unique())  # variants named apart (scans.py)
        raise UserError(f"no model has both {best!r} and {worst!r}; nothing to pair" + (
            " (scans of one model in other settings, a head, dtype, template or random head, are other models: give "
            "a best and a worst scan of the same settings)" if tagged else ""))


def best_worst(df: pd.DataFrame, *, best: str | None = None, worst: str | None = None,
               join: str = "text", standardize: bool = True, k: int = 10, framing=None,
               models=None) -> BestWorstResult:
    """Pair every token's best-prompt and worst-prompt score per model; rank sum and difference.

    >>> d = pd.DataFrame({"model": "m", "prompt": ["best?"] * 3 + ["worst?"] * 3,
    ...                   "text": list("abc") * 2, "score": [3.0, 1, 2, 1, 3, 2]})
    >>> r = best_worst(d, standardize=False, k=1)
    >>> r.extremes.query("measure == 'best-worst' and end == 'top'")["text"].tolist()
    ['a']
    """
    if join not in JOIN_RULES:
        raise UserError(f"unknown join rule {join!r}; use one of {JOIN_RULES}")
    stats = deps.stats()
    ledger = Ledger()
    df = select(validate_scans(df, ledger=ledger), models=models)
    best, worst = pick_prompts(df["prompt"].unique(), best, worst, framing)
    df = df[df["prompt"].isin([best, worst])]
    n_given = df.groupby("model", sort=False)["prompt"].nunique()
    df = drop_unscaled(standardize_scores(df, standardize), ledger)
    if join == "text":
        df = dedupe_text(df, ledger)
        key = ["text"]
    else:
        if df["token_id"].isna().any():
            raise UserError("join on token id needs token ids; these scans have text "
                            "candidates: use --join text")
        key = ["token_id", "text"]
    paired, disjoint = [], []  # models with tokens under both prompts; models whose two scans share none
    for m, g in df.groupby("model", sort=False):
        b = g[g["prompt"] == best].set_index(key)
        w = g[g["prompt"] == worst].set_index(key)
        if b.empty or w.empty:
            ledger.note(f"model {m} lacks the {'best' if b.empty else 'worst'} prompt; "
                        "left out of best vs worst")
            continue
        j = b[["value", "token_id"] if join == "text" else ["value"]].rename(
            columns={"value": "value_b"}).join(w[["value"]].rename(columns={"value": "value_w"}),
                                               how="inner")
        ledger.drop("pair prompts", len(b) - len(j), "token not scored (uniquely) under "
                    "the worst prompt", model=m, prompt=best)
        ledger.drop("pair prompts", len(w) - len(j), "token not scored (uniquely) under "
                    "the best prompt", model=m, prompt=worst)
        j = j.reset_index()
        if j.empty:
            disjoint.append(m)
            continue
        if "token_id" not in j.columns:
            j["token_id"] = pd.NA
        paired.append(pd.DataFrame({"model": m, "text": j["text"], "token_id": j["token_id"],
                                    "best": j["value_b"], "worst": j["value_w"]}))
    _check_paired(paired, disjoint, n_given, df, best, worst, ledger)
    scores = pd.concat(paired, ignore_index=True)
    scores["token_id"] = scores["token_id"].astype("Int64")  # ids stay integers (<NA> for text candidates)
    scores["sum"] = scores["best"] + scores["worst"]
    scores["diff"] = scores["best"] - scores["worst"]
    corr = []
    for m, g in scores.groupby("model", sort=False):
        ok = len(g) > 2
        if not ok:
            ledger.note(f"model {m}: {len(g)} paired token(s), too few for a correlation (NaN)")
        corr.append({"model": m, "n": len(g),
                     "pearson_r": float(np.corrcoef(g["best"], g["worst"])[0, 1]) if ok else np.nan,
                     "spearman_rho": float(stats.spearmanr(g["best"], g["worst"]).statistic)
                     if ok else np.nan})
    tables = [_ends(g, m, k) for m, g in scores.groupby("model", sort=False)]
    n_models = scores["model"].nunique()
    if standardize and n_models > 1:
        counts = scores.groupby("text")["model"].nunique()
        shared = counts.index[counts == n_models]
        mean = (scores[scores["text"].isin(shared)].groupby("text")[["best", "worst", "sum", "diff"]]
                .mean().reset_index().assign(token_id=pd.NA))
        ledger.note(f"{ALL_MODELS}: {len(shared)} strings paired in all {n_models} models")
        if len(mean):
            tables.append(_ends(mean, ALL_MODELS, k))
    extremes = pd.concat(tables, ignore_index=True)
    extremes["token_id"] = extremes["token_id"].astype("Int64")  # not the float a column with <NA> becomes
    res = BestWorstResult(extremes=extremes,
                          correlations=pd.DataFrame(corr), scores=scores,
                          best_prompt=best, worst_prompt=worst, units=units(standardize))
    res.take_ledger(ledger)
    return res


def _ends(g: pd.DataFrame, model: str, k: int) -> pd.DataFrame:
    out = []
    for measure, col in (("best+worst", "sum"), ("best-worst", "diff")):
        order = g.sort_values([col, "text"], ascending=[False, True], kind="stable")
        for end, part in (("top", order.head(k)), ("bottom", order.tail(k).iloc[::-1])):
            out.append(pd.DataFrame({
                "model": model, "measure": measure, "end": end,
                "position": np.arange(1, len(part) + 1), "text": part["text"].to_numpy(),
                "token_id": part["token_id"].to_numpy(), "value": part[col].to_numpy(),
                "best": part["best"].to_numpy(), "worst": part["worst"].to_numpy()}))
    return pd.concat(out, ignore_index=True)
