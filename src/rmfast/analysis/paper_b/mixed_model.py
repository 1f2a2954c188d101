"""Paper B's linear mixed model, fitted as the authors fit it (one definition for ``reproduce``
and ``rmfast analyze categories --method paper``).

The authors' R: ``nlme::lme(sum_value ~ base_model*Category*prompt_framing, random = ~1|model_id)``,
REML, R's treatment coding (the first level in sorted order is the reference: Gemma, Agency; the
framing's reference is *positive*, R's factor order), and t-tests with nlme's containment degrees of
freedom. statsmodels' MixedLM gives the same REML fit; only the coding and the df are set here.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..data import deps

#: What the table's ``test`` column says for this model.
PAPER_TEST = "t with nlme's containment df (p_value); p_z: normal approximation"


def paper_mixed(med: pd.DataFrame, *, random_slope: bool = False,
                measure: str = "median_rank") -> pd.DataFrame:
    """The paper's ``lme(sum_value ~ base_model*Category*prompt_framing, random = ~1|model_id)``.

    R's reference levels (the first group and category in sorted order, e.g. Gemma, Agency;
    framing positive), REML, coefficients named as R prints them (``base_modelLlama:
    CategoryCommunion``); any number of categories (MFD's five foundations too). ``p_value`` uses
    nlme's t with its containment degrees of freedom (between-model terms: models - between
    terms - 1; the rest: rows - models - within terms), ``p_z`` the normal approximation
    statsmodels reports.

    ``random_slope``: also a per-model random slope for category (``random = ~Category|model_id``):
    each model may have its own category preference, so the base × category interaction is
    judged against how much models of one base differ among themselves. ``p_value`` keeps the
    same df rule (nlme's containment rule does not look at random slopes), so read ``p_z``
    and the SE; ``converged`` says whether the optimiser converged.
    """
    smf = deps.require("statsmodels.formula.api", "the mixed model")
    tdist = deps.require("scipy.stats", "the mixed model").t
    groups = sorted(med["group"].unique())
    cats = sorted(med["category"].unique())
    names = {}  # internal (patsy-safe) name -> R's name
    d = pd.DataFrame({"y": med[measure].to_numpy(), "model": med["model"].to_numpy()})
    for i, g in enumerate(groups[1:]):
        d[f"g{i}"] = (med["group"] == g).astype(float).to_numpy()
        names[f"g{i}"] = f"base_model{g}"
    for i, c in enumerate(cats[1:]):
        d[f"c{i}"] = (med["category"] == c).astype(float).to_numpy()
        names[f"c{i}"] = f"Category{c}"
    d["fneg"] = (med["framing"] == "negative").astype(float).to_numpy()
    names["fneg"] = "prompt_framingnegative"
    gs = [k for k in names if k.startswith("g")]
    cs = [k for k in names if k.startswith("c")]
    formula = f"y ~ ({' + '.join(gs)}) * ({' + '.join(cs)}) * fneg"
    re_formula = ("~ " + " + ".join(cs)) if random_slope else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = smf.mixedlm(formula, d, groups=d["model"], re_formula=re_formula).fit(reml=True)
    converged = bool(getattr(fit, "converged", True)) and not any(
        "converge" in str(w.message).lower() for w in caught)
    terms = list(fit.fe_params.index)
    n, n_groups = len(d), d["model"].nunique()
    between = [t for t in terms[1:] if all(d.groupby("model")[c].nunique().max() == 1
                                           for c in t.split(":"))]
    within = [t for t in terms[1:] if t not in between]
    df_between, df_within = n_groups - len(between) - 1, n - n_groups - len(within)
    dfs = [df_within if t == "Intercept" or t in within else df_between for t in terms]
    t = fit.fe_params[terms] / fit.bse_fe[terms]
    pretty = [":".join(names.get(x, x) for x in term.split(":")).replace("Intercept", "(Intercept)")
              for term in terms]
    return pd.DataFrame({
        "term": pretty,
        "coef": fit.fe_params[terms].to_numpy(), "se": fit.bse_fe[terms].to_numpy(),
        "df": dfs, "t": t.to_numpy(), "p_value": 2 * tdist.sf(np.abs(t.to_numpy()), dfs),
        "p_z": fit.pvalues[terms].to_numpy(),
        "random_effects": "intercept + category slope per model" if random_slope
        else "intercept per model",
        "model_sd": float(np.sqrt(fit.cov_re.iloc[0, 0])), "residual_sd": float(np.sqrt(fit.scale)),
        "converged": converged, "test": PAPER_TEST,
        "reference": f"{groups[0]}, {cats[0]}, positive framing",
    })


__all__ = ["PAPER_TEST", "paper_mixed"]
