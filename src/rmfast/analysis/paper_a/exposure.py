"""Mere exposure: do scores rise with word frequency once valence is controlled for?

Per model × prompt, ordinary least squares score ~ ln(frequency) + valence over the
tokens found in the frequency list (and in AFINN, unless ``missing_valence="zero"``
treats unlisted words as neutral, AFINN's own convention). The papers found positive
frequency slopes in almost all models and prompts (their Figure 3D).

``method="paper"`` is paper A's R script: AFINN joined first on ``tolower(token_decoded)``
(no stripping; every valence, 0 included), then the BNC list joined per lemma *and part of
speech* as R read it (:func:`~rmfast.analysis.data.lexicons.load_bnc_rows`: a word listed as noun
and verb gives two rows with their own frequencies, flagged "98#" values are NA and dropped,
forms are not matched), raw scores, ``lm(score ~ log(freq) + value)``. rmfast's default
strips, sums a word's forms over parts of speech (one frequency per word form, as a
reader meets it), z-scores within model × prompt, and fits one row per word (its tokens' mean:
:func:`~rmfast.analysis.data.tokens.per_word`; the paper fits every token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.deps import require
from ..data.framing import framing_map
from ..data.ledger import Ledger
from ..data.lexicons import load_afinn, load_bnc_rows, load_frequencies, normalize_word
from ..data.methods import check_method
from ..stats.regression import ols
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans
from ..data.tokens import drop_unscaled, join_words, per_word, standardize_scores, units


@dataclass(kw_only=True)
class ExposureResult(Result):
    """Tables:

    slopes: model, prompt, framing, n (rows fitted: words; tokens with method="paper"), n_words, slope_log_freq, se_log_freq, p_log_freq,
            slope_log_freq_per_sd, slope_valence, se_valence, p_valence, r2, units
            (slope_log_freq: score units per unit of ln(frequency per million);
            _per_sd: per standard deviation of ln frequency among the fitted tokens)
    tokens: model, prompt, text, word, frequency, log_freq, valence, score, value
    """

    slopes: pd.DataFrame = field(default_factory=pd.DataFrame)
    tokens: pd.DataFrame = field(default_factory=pd.DataFrame)


def exposure(df: pd.DataFrame, frequencies, afinn=None, *, missing_valence: str = "drop",
             use_valence: bool = True, standardize: bool | None = None, framing=None,
             min_words: int = 10, models=None, prompts=None,
             method: str = "rmfast") -> ExposureResult:
    """score ~ ln(frequency) + valence per model × prompt.

    ``frequencies``: a BNC-format list, a word,frequency CSV, ``"wordfreq"``, or a frame
    (word, frequency). ``afinn``: as in :func:`~rmfast.analysis.paper_a.sentiment.sentiment`.
    ``standardize``: z-score within model × prompt (default: yes for ``method="rmfast"``, no
    for ``"paper"``). ``method="paper"`` needs the BNC list (a path) or a frame of its rows
    (word, frequency; not summed), valence from AFINN (``use_valence``, ``missing_valence="drop"``).

    >>> rng = np.random.default_rng(1); w = [f"w{i}" for i in range(50)]
    >>> fq = pd.DataFrame({"word": w, "frequency": np.exp(rng.normal(size=50))})
    >>> lex = pd.DataFrame({"word": w, "valence": rng.integers(-3, 4, 50)})
    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": w,
    ...                   "score": 0.5 * np.log(fq.frequency) + 0.1 * lex.valence})
    >>> r = exposure(d, fq, lex, standardize=False).slopes
    >>> round(float(r.loc[0, "slope_log_freq"]), 3)
    0.5
    """
    if missing_valence not in ("drop", "zero"):
        raise UserError(f"missing_valence={missing_valence!r}; use 'drop' or 'zero'")
    check_method(method)
    if method == "paper" and (missing_valence != "drop" or not use_valence):
        raise UserError("method='paper' joins AFINN first (missing_valence='drop', "
                        "use_valence=True), as paper A's script did")
    standardize = (method == "rmfast") if standardize is None else standardize
    require("scipy.stats", "analyze exposure (its regressions)")  # before the lexicons: an --afinn given led into it
    ledger = Ledger()
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    frame = framing_map(df["prompt"].unique(), framing)
    if method == "paper":
        freq = (frequencies[["word", "frequency"]] if isinstance(frequencies, pd.DataFrame)
                else load_bnc_rows(frequencies)[["word", "frequency"]])
        freq = freq.dropna()
    elif isinstance(frequencies, pd.DataFrame):
        freq = frequencies.assign(word=frequencies["word"].map(normalize_word))
        freq = freq.groupby("word", as_index=False)["frequency"].sum()
    else:
        freq = load_frequencies(frequencies, words=df["text"].map(normalize_word).unique())
    nonpos = freq["frequency"] <= 0
    if nonpos.any():
        ledger.note(f"{int(nonpos.sum())} frequency-list words with frequency 0 left out "
                    "(log undefined)")
    freq = freq[~nonpos]
    df = drop_unscaled(standardize_scores(df, standardize), ledger)
    if method == "paper":  # AFINN first, then the BNC rows (R: inner_join, left_join, filter)
        lex = afinn[["word", "valence"]] if isinstance(afinn, pd.DataFrame) else load_afinn(afinn)
        tok = join_words(df, lex, ledger=ledger, step="afinn join", what="AFINN lexicon",
                         method="paper")
        tok = join_words(tok.drop(columns="word"), freq, ledger=ledger, step="frequency join",
                         what="BNC list (lemma rows per part of speech)", method="paper")
    else:
        tok = _rmfast_join(df, freq, afinn, ledger, missing_valence, use_valence)
    tok = tok.copy()
    tok["log_freq"] = np.log(tok["frequency"])
    if tok.empty:
        raise UserError("no scored token is in the frequency list (and lexicon); "
                        "check the word list")
    rows = []
    fitted = tok if method == "paper" else per_word(tok, ["model", "prompt"], ledger)
    for (m, p), g in fitted.groupby(["model", "prompt"], sort=False):
        cols = [g["log_freq"]] + ([g["valence"]] if use_valence else [])
        fit = ols(g["value"], *cols) if len(g) >= min_words else None
        row = {"model": m, "prompt": p, "framing": frame[p], "n": len(g),
               "n_words": g["word"].nunique(), "units": units(standardize)}
        if fit is None:
            ledger.note(f"{m} / {p}: {len(g)} tokens; regression not fitted (need "
                        f"{min_words} and non-constant predictors)")
            rows.append(row)
            continue
        row.update(slope_log_freq=fit.coef[1], se_log_freq=fit.se[1], p_log_freq=fit.p[1],
                   se_hc3_log_freq=fit.se_hc3[1], p_hc3_log_freq=fit.p_hc3[1],
                   slope_log_freq_per_sd=fit.coef[1] * float(g["log_freq"].std()), r2=fit.r2)
        if use_valence:
            row.update(slope_valence=fit.coef[2], se_valence=fit.se[2], p_valence=fit.p[2],
                       se_hc3_valence=fit.se_hc3[2], p_hc3_valence=fit.p_hc3[2])
        rows.append(row)
    cols = ["model", "prompt", "framing", "n", "n_words", "slope_log_freq", "se_log_freq",
            "p_log_freq", "se_hc3_log_freq", "p_hc3_log_freq", "slope_log_freq_per_sd", "slope_valence",
            "se_valence", "p_valence", "se_hc3_valence", "p_hc3_valence", "r2", "units"]
    res = ExposureResult(
        slopes=pd.DataFrame(rows).reindex(columns=cols),
        tokens=tok[["model", "prompt", "text", "word", "frequency", "log_freq", "valence",
                    "score", "value"]].reset_index(drop=True))
    res.take_ledger(ledger)
    return res


def _rmfast_join(df, freq, afinn, ledger, missing_valence: str, use_valence: bool) -> pd.DataFrame:
    """rmfast's joins: frequency list first (stripped, lower-cased), then AFINN valence."""
    tok = join_words(df, freq, ledger=ledger, step="frequency join", what="frequency list")
    if not use_valence:
        ledger.note("valence not controlled for (use_valence=False)")
        return tok.assign(valence=np.nan)
    lex = afinn[["word", "valence"]] if isinstance(afinn, pd.DataFrame) else load_afinn(afinn)
    if missing_valence == "drop":
        return join_words(tok.drop(columns="word"), lex, ledger=ledger, step="afinn join",
                          what="AFINN lexicon: valence is a covariate, so a word without one is left out")
    tok = tok.merge(lex, on="word", how="left")
    tok["valence"] = tok["valence"].fillna(0).astype(int)
    return tok
