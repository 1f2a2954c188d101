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
    problems = fit_problems(fit, caught)
    converged = not problems
    terms = list(fit.fe_params.index)
    dfs, df_between = containment_df(fit)
    t = fit.fe_params[terms] / fit.bse_fe[terms]
    pretty = [":".join(names.get(x, x) for x in term.split(":")).replace("Intercept", "(Intercept)")
              for term in terms]
    label = {**{k: f"{v[len('base_model'):]} − {groups[0]}" for k, v in names.items() if k in gs},
             **{k: f"{v[len('Category'):]} − {cats[0]}" for k, v in names.items() if k in cs},
             "fneg": "negative − positive framing"}
    meaning = [_meaning(term, label, groups[0], cats[0]) for term in terms]
    coef, se = fit.fe_params[terms].to_numpy(), fit.bse_fe[terms].to_numpy()
    tv, pv, pz = t.to_numpy(), 2 * tdist.sf(np.abs(t.to_numpy()), dfs), fit.pvalues[terms].to_numpy()
    # the model (base) effect as a marginal contrast: each group − the reference group, averaged with equal
    # weight over every category × framing cell (a main effect; the base_model coefficient is one cell's)
    cov = fit.cov_params().loc[terms, terms].to_numpy()
    for g in gs:
        L = np.zeros(len(terms))
        for i, term in enumerate(terms):
            parts = term.split(":")
            if g in parts and all(x == g or x in cs or x == "fneg" for x in parts):
                others = [x for x in parts if x != g]
                w = 1.0
                if any(x in cs for x in others):
                    w /= len(cats)
                if "fneg" in others:
                    w /= 2
                L[i] = w
        est, sd = float(L @ coef), float(np.sqrt(L @ cov @ L))
        tt = est / sd
        pretty.append(f"{names[g]} (marginal)")
        meaning.append(f"{label[g]}, averaged over the {len(cats)} categories × 2 framings with equal weights "
                       "(the model main effect as a marginal contrast; t with the between-model df)")
        coef, se = np.append(coef, est), np.append(se, sd)
        tv, dfs = np.append(tv, tt), [*dfs, df_between]
        pv = np.append(pv, 2 * tdist.sf(abs(tt), df_between))
        pz = np.append(pz, 2 * deps.require("scipy.stats", "the mixed model").norm.sf(abs(tt)))
    return pd.DataFrame({
        "term": pretty, "meaning": meaning,
        "coef": coef, "se": se, "df": dfs, "t": tv, "p_value": pv, "p_z": pz,
        "random_effects": "intercept + category slope per model" if random_slope
        else "intercept per model",
        "model_sd": float(np.sqrt(fit.cov_re.iloc[0, 0])), "residual_sd": float(np.sqrt(fit.scale)),
        "converged": converged, "fit_check": "; ".join(problems) or "ok",
        "test": PAPER_TEST,
        "reference": f"{groups[0]}, {cats[0]}, positive framing",
    })


def containment_df(fit) -> tuple[list[int], int]:
    """nlme's containment degrees of freedom of a statsmodels MixedLM fit's fixed effects, in their order, and the
    between-group df: a column constant within every group (a model's base) is estimated from the groups, its df
    groups − such columns − 1; the rest, and the intercept, rows − groups − the other columns. A z-test in place
    of this t counts a term estimated from 10 models as if it had a thousand rows (p 1.3e-4 where t(8) gives 5e-3).
    """
    X = pd.DataFrame(fit.model.exog, columns=fit.model.exog_names)
    g = pd.Series(fit.model.groups)
    const = X.groupby(g.to_numpy()).nunique().max() == 1  # (columns,) constant within every group
    names = list(fit.fe_params.index)
    between = [c for c in names[1:] if bool(const[c])]
    df_between = g.nunique() - len(between) - 1
    df_within = len(X) - g.nunique() - (len(names) - 1 - len(between))
    return [df_between if c in between else df_within for c in names], df_between


def _meaning(term: str, label: dict, g0: str, c0: str) -> str:
    """What a treatment-coded coefficient is: a contrast at the reference levels of the factors it leaves out."""
    if term == "Intercept":
        return f"{g0}, {c0}, positive framing: the reference cell's mean"
    parts = term.split(":")
    at = []
    if not any(x.startswith("g") for x in parts):
        at.append(g0)
    if not any(x.startswith("c") for x in parts):
        at.append(c0)
    if "fneg" not in parts:
        at.append("positive framing")
    what = " × ".join(f"({label[x]})" for x in parts) if len(parts) > 1 else label[parts[0]]
    kind = "difference of differences" if len(parts) > 1 else "simple effect"
    where = f" at the reference cell ({', '.join(at)})" if at else ""
    main = "; not a main effect" if at and len(parts) == 1 and parts[0].startswith("g") else ""
    return f"{what}{where}: a {kind}{main}"


def fit_problems(fit, caught=()) -> list[str]:
    """Why a MixedLM fit cannot be trusted, or []: the optimiser's flag, and (statsmodels reports
    ``converged=True`` on degenerate fits) the random effects' covariance (a variance at ~0 or a correlation at
    ±1: on the boundary) and the Hessian (the information matrix must be positive definite), and the warnings
    the fit raised about them."""
    out = []
    if not bool(getattr(fit, "converged", True)):
        out.append("the optimiser did not converge")
    cov_re = np.asarray(fit.cov_re, dtype=float)
    if cov_re.size:
        ev = np.linalg.eigvalsh(cov_re)
        if not np.all(np.isfinite(ev)) or ev.min() <= 1e-6 * max(ev.max(), float(fit.scale)):
            sd = np.sqrt(np.clip(np.diag(cov_re), 0, None))
            out.append("random-effects covariance singular (on the boundary: SDs "
                       + ", ".join(f"{x:.3g}" for x in sd) + f"; smallest eigenvalue {ev.min():.2g})")
    try:
        hess, sing = fit.model.hessian(fit.params_object)
        ev = np.linalg.eigvalsh(-(hess + hess.T) / 2)
        if sing or not np.all(np.isfinite(ev)) or ev.min() <= 0:
            out.append("Hessian not negative definite (the information matrix is not positive definite)")
    except (np.linalg.LinAlgError, ValueError, AttributeError):
        out.append("Hessian could not be computed")
    if not np.all(np.isfinite(np.asarray(fit.bse_fe, dtype=float))):
        out.append("fixed-effect SEs not finite")
    for w in caught:
        msg = str(w.message).splitlines()[0]
        if any(k in msg.lower() for k in ("converge", "boundary", "hessian", "singular")) and \
                not any(msg in o for o in out):
            out.append(f"statsmodels: {msg}")
    return out


__all__ = ["PAPER_TEST", "fit_problems", "paper_mixed"]
