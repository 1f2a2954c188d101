"""Sentiment and framing: how steeply scores follow AFINN valence (the papers' Figure 3A–C).

Tokens are matched to AFINN-111 by their stripped, lower-cased text. For each model ×
prompt × valence sign (positive words: valence > 0; negative words: valence < 0;
valence 0 is left out and counted) a simple linear regression score ~ valence gives the
slope and its standard error. Framing: positive prompts are expected to be more
sensitive to positive words, negative prompts to negative words.

``method="paper"`` is paper A's R script (Fig. 3A–C): tokens joined on
``tolower(token_decoded)`` without stripping (space-prefixed tokens match nothing), valence 0
counted with the negative words (``value > 0`` is "Positive", the rest "Negative"), raw
scores (``lm(score ~ value)``). rmfast's default strips (a BPE vocabulary writes most words
with a leading space, and those are the words a reply starts with), leaves valence 0 out
(it is neither sign), z-scores within model × prompt so slopes compare across models, and fits one row per
word (its tokens' mean: " Love" and "love" are one observation, :func:`~rmfast.analysis.data.tokens.per_word`;
the paper fits every token, which weights a word by its spellings and understates the SE).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.deps import require
from ..data.framing import framing_map
from ..data.ledger import Ledger
from ..data.lexicons import load_afinn
from ..data.methods import check_method
from ..stats.regression import ols
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans
from ..data.tokens import drop_unscaled, join_words, per_word, standardize_scores, units


@dataclass(kw_only=True)
class SentimentResult(Result):
    """Tables:

    slopes:  model, prompt, framing, sign, n (rows fitted: words; tokens with method="paper"), n_words, slope, se,
             intercept, r, p_value, units
    summary: framing, sign, n_models, mean_slope, se_slope   (per model: mean over the
             framing's prompts; then mean ± SE across models — the figure's diamonds)
    tokens:  model, prompt, framing, text, word, valence, score, value (the fitted rows)
    """

    slopes: pd.DataFrame = field(default_factory=pd.DataFrame)
    summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    tokens: pd.DataFrame = field(default_factory=pd.DataFrame)


def _lexicon(afinn) -> pd.DataFrame:
    if isinstance(afinn, pd.DataFrame):
        if not {"word", "valence"} <= set(afinn.columns):
            raise UserError("an AFINN frame needs columns word, valence")
        return afinn[["word", "valence"]]
    return load_afinn(afinn)


def summarize_by_model(slopes: pd.DataFrame, keys: list[str], value: str = "slope") -> pd.DataFrame:
    """Per ``keys``: average the value per model first, then mean ± SE across models."""
    per_model = slopes.dropna(subset=[value]).groupby(keys + ["model"])[value].mean().reset_index()
    g = per_model.groupby(keys)[value]
    out = g.agg(n_models="count", mean_slope="mean", sd="std").reset_index()
    out["se_slope"] = out["sd"] / np.sqrt(out["n_models"])
    return out.drop(columns="sd")


def sentiment(df: pd.DataFrame, afinn=None, *, standardize: bool | None = None, framing=None,
              min_words: int = 3, models=None, prompts=None,
              method: str = "rmfast") -> SentimentResult:
    """Slope of score on AFINN valence per model × prompt × valence sign.

    ``afinn``: path of an AFINN file, a frame (word, valence), or None for the ``afinn``
    package's copy. ``standardize``: z-score scores within model × prompt first (default:
    yes for ``method="rmfast"``, no for ``"paper"``). ``method``: see the module docstring.
    ``framing``: {prompt: "positive"|"negative"} overriding the guess from the wording.

    >>> lex = pd.DataFrame({"word": ["good", "great", "nice", "bad", "awful", "vile"],
    ...                     "valence": [1, 2, 3, -1, -2, -3]})
    >>> d = pd.DataFrame({"model": "m", "prompt": "best?", "text": list(lex.word) + ["x"],
    ...                   "score": [1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0]})
    >>> s = sentiment(d, lex, standardize=False).slopes
    >>> s.set_index("sign")["slope"].round(3).to_dict()
    {'negative': 0.0, 'positive': 1.0}
    """
    check_method(method)
    standardize = (method == "rmfast") if standardize is None else standardize
    require("scipy.stats", "analyze sentiment (its regressions)")  # before the lexicons: an --afinn given led into it
    ledger = Ledger()
    lex = _lexicon(afinn)
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    frame = framing_map(df["prompt"].unique(), framing)
    df = drop_unscaled(standardize_scores(df, standardize), ledger)
    tok = join_words(df, lex, ledger=ledger, step="afinn join", what="AFINN lexicon",
                     method=method)
    zero = tok["valence"] == 0
    if method == "paper":  # R: if_else(value > 0, "Positive", "Negative")
        if zero.any():
            ledger.note(f"{int(zero.sum())} rows of AFINN valence 0 fitted with the negative "
                        "words (method='paper')")
    else:
        for (m, p), n in tok[zero].groupby(["model", "prompt"]).size().items():
            ledger.drop("valence sign", n, "AFINN valence 0 (neither positive nor negative)",
                        model=m, prompt=p)
        tok = tok[~zero]
    tok = tok.copy()
    tok["framing"] = tok["prompt"].map(frame)
    tok["sign"] = np.where(tok["valence"] > 0, "positive", "negative")
    if tok.empty:
        raise UserError("no scored token matches the AFINN lexicon; are the texts words?")
    rows = []
    fitted = tok if method == "paper" else per_word(tok, ["model", "prompt", "sign"], ledger)
    for (m, p, s), g in fitted.groupby(["model", "prompt", "sign"], sort=False):
        fit = ols(g["value"], g["valence"]) if len(g) >= min_words else None
        row = {"model": m, "prompt": p, "framing": frame[p], "sign": s, "n": len(g),
               "n_words": g["word"].nunique(), "slope": np.nan, "se": np.nan,
               "intercept": np.nan, "r": np.nan, "p_value": np.nan, "se_hc3": np.nan, "p_value_hc3": np.nan,
               "units": units(standardize)}
        if fit is None:
            ledger.note(f"{m} / {p} / {s} words: {len(g)} tokens over "
                        f"{g['valence'].nunique()} valence level(s); a slope needs at least "
                        f"{min_words} tokens and 2 levels: not fitted")
        else:
            r = np.corrcoef(g["valence"], g["value"])[0, 1] if g["value"].std() > 0 else np.nan
            row.update(slope=fit.coef[1], se=fit.se[1], intercept=fit.coef[0], r=r,
                       p_value=fit.p[1], se_hc3=fit.se_hc3[1], p_value_hc3=fit.p_hc3[1])
        rows.append(row)
    slopes = pd.DataFrame(rows).sort_values(["prompt", "model", "sign"], kind="stable")
    res = SentimentResult(
        slopes=slopes.reset_index(drop=True),
        summary=summarize_by_model(slopes, ["framing", "sign"]),
        tokens=tok[["model", "prompt", "framing", "text", "word", "valence", "score", "value"]]
        .reset_index(drop=True))
    res.take_ledger(ledger)
    return res
