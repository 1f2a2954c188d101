"""Score distributions: moments per model × prompt (the papers' Figure 1 and its table)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..data import deps
from ..data.ledger import Ledger
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans


@dataclass(kw_only=True)
class DistributionResult(Result):
    """moments: one row per model × prompt::

        model, prompt, n, mean, variance (ddof=1), std, skew, kurtosis (excess),
        min, q25, median, q75, max

    skew and kurtosis are the bias-corrected sample statistics
    (``scipy.stats.skew(x, bias=False)``, ``scipy.stats.kurtosis(x, bias=False)``,
    as pandas' ``.skew()``/``.kurt()``).
    """

    moments: pd.DataFrame = field(default_factory=pd.DataFrame)


def distributions(df: pd.DataFrame, *, models=None, prompts=None) -> DistributionResult:
    """Mean, variance, skew and kurtosis of scores per model × prompt.

    >>> d = pd.DataFrame({"model": "m", "prompt": "p", "text": list("abcd"),
    ...                   "score": [1.0, 2.0, 3.0, 10.0]})
    >>> r = distributions(d).moments
    >>> round(float(r.loc[0, "mean"]), 6), round(float(r.loc[0, "variance"]), 6)
    (4.0, 16.666667)
    """
    stats = deps.stats()
    ledger = Ledger()
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    rows = []
    for (m, p), g in df.groupby(["model", "prompt"], sort=False):
        x = g["score"].to_numpy(dtype="float64")
        n = len(x)
        if n < 4:
            ledger.note(f"{m} / {p}: only {n} scores; skew and kurtosis need at least 4")
        q = np.percentile(x, [0, 25, 50, 75, 100])
        rows.append({
            "model": m, "prompt": p, "n": n, "mean": float(x.mean()),
            "variance": float(x.var(ddof=1)) if n > 1 else np.nan,
            "std": float(x.std(ddof=1)) if n > 1 else np.nan,
            "skew": float(stats.skew(x, bias=False)) if n > 3 else np.nan,
            "kurtosis": float(stats.kurtosis(x, fisher=True, bias=False)) if n > 3 else np.nan,
            "min": q[0], "q25": q[1], "median": q[2], "q75": q[3], "max": q[4],
        })
    res = DistributionResult(moments=pd.DataFrame(rows))
    res.take_ledger(ledger)
    return res
