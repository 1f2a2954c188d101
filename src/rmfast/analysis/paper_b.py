"""Paper B reproduced from its published data: Fig. 1 (Big Two, ten RMs) and Fig. 4 (training runs).

Christian et al., "Reward Models Inherit Value Biases from Pretraining" (ICLR 2026). Each
finding is computed from ``../shared/data/iclr2026`` (see its README) and returned as a dict
(id, title, paper_claim, holds, summary, files) for ``rmfast reproduce``'s index page. What
differs from the authors' R scripts, and why, is in docs/paper_methods_b.md.

Fig. 1 as the authors compute it: scores joined to the Big Two nouns, ranked within model ×
prompt (1 = best, ties averaged), median rank per model × category × prompt; a linear mixed
model ``median ~ base * category * framing`` with a random intercept per model (nlme ``lme``,
REML; here statsmodels MixedLM with R's reference levels and nlme's degrees of freedom); and
per category × framing panel ``MKinfer::perm.t.test(median ~ base)`` over all 270 model ×
prompt rows, Bonferroni × 4 — whose reported p is the parametric Welch p
(:mod:`rmfast.analysis.permutation`). rmfast's own test averages each model over prompts first
and permutes the model labels (10 models, every relabelling).

Fig. 4 from the published checkpoint ranks (:mod:`rmfast.analysis.trajectory`): per run, base
model and category the median rank over steps (4a) and at the final step per data size (4b).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import UserError
from ..io import atomic_write, write_csv
from . import deps
from .categories import categories
from .iclr2026 import load_big2_rewards, load_checkpoint_ranks
from .permutation import MKINFER_R
from .trajectory import trajectory, write_trajectory

CLAIM_FIG1 = ("Llama-based RMs rank Agency words higher and Gemma-based RMs Communion words "
              "(a 'robust preference of Llama RMs for agency and ... of Gemma RMs for communion'; "
              "Fig. 1a, permutation t-tests per category × framing, Bonferroni-corrected)")
CLAIM_LMM = ("The linear mixed model median rank ~ base model × category × framing with a random "
             "intercept per model shows the base model × category interaction (Fig. 1 stats)")
CLAIM_FIG4A = ("RMs trained from Gemma and Llama on the same preference data differ the same way "
               "at every checkpoint: Llama ranks Agency higher, Gemma Communion (Fig. 4a; the "
               "effect 'holds even when the preference data and finetuning process are identical')")
CLAIM_FIG4B = ("The effect is 'not only repeatable but surprisingly durable' across preference data "
               "sources and quantities (Fig. 4b, final checkpoints, 13k-550k pairs)")


def _direction_ok(row_gemma: float, row_llama: float, category: str, framing: str) -> bool:
    """Does the panel show the claimed direction? Lower median rank = ranked higher. On positive
    prompts Llama ranks Agency higher and Gemma Communion; on negative prompts ('worst thing')
    ranking a word higher means disfavouring it, so the direction flips."""
    llama_better = row_llama < row_gemma
    want_llama_better = (category == "Agency") == (framing == "positive")
    return llama_better == want_llama_better


def paper_mixed(med: pd.DataFrame) -> pd.DataFrame:
    """The paper's ``lme(sum_value ~ base_model*Category*prompt_framing, random = ~1|model_id)``.

    R's reference levels (Gemma, Agency, positive), REML, coefficients named as R prints them;
    ``p_value`` uses nlme's t with its containment degrees of freedom (between-model terms:
    models - between terms - 1; the rest: rows - models - within terms), ``p_z`` the normal
    approximation statsmodels reports.
    """
    smf = deps.require("statsmodels.formula.api", "the mixed model")
    tdist = deps.require("scipy.stats", "the mixed model").t
    d = pd.DataFrame({"y": med["median_rank"].to_numpy(),
                      "base_modelLlama": (med["group"] == "Llama").astype(float).to_numpy(),
                      "CategoryCommunion": (med["category"] == "Communion").astype(float).to_numpy(),
                      "prompt_framingnegative": (med["framing"] == "negative").astype(float).to_numpy(),
                      "model": med["model"].to_numpy()})
    formula = "y ~ base_modelLlama * CategoryCommunion * prompt_framingnegative"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = smf.mixedlm(formula, d, groups=d["model"]).fit(reml=True)
    names = list(fit.fe_params.index)
    n, n_groups = len(d), d["model"].nunique()
    between = [t for t in names[1:] if all(d.groupby("model")[c].nunique().max() == 1
                                           for c in t.split(":"))]
    within = [t for t in names[1:] if t not in between]
    df_between, df_within = n_groups - len(between) - 1, n - n_groups - len(within)
    dfs = [df_within if t == "Intercept" or t in within else df_between for t in names]
    t = fit.fe_params[names] / fit.bse_fe[names]
    return pd.DataFrame({
        "term": [x.replace("Intercept", "(Intercept)") for x in names],
        "coef": fit.fe_params[names].to_numpy(), "se": fit.bse_fe[names].to_numpy(),
        "df": dfs, "t": t.to_numpy(), "p_value": 2 * tdist.sf(np.abs(t.to_numpy()), dfs),
        "p_z": fit.pvalues[names].to_numpy(),
        "model_sd": float(np.sqrt(fit.cov_re.iloc[0, 0])), "residual_sd": float(np.sqrt(fit.scale)),
    })


def _fig1_png(med: pd.DataFrame, path: Path) -> None:
    from .plots import new_figure, to_png

    colours = {"Gemma": "#DB4437", "Llama": "#0064E0"}
    fig = new_figure(6.0, 6.0)
    axes = fig.subplots(2, 2)
    for i, fr in enumerate(["positive", "negative"]):
        for j, cat in enumerate(["Agency", "Communion"]):
            ax = axes[i, j]
            sub = med[(med["framing"] == fr) & (med["category"] == cat)]
            for x, base in enumerate(["Gemma", "Llama"]):
                vals = sub.loc[sub["group"] == base, "median_rank"].to_numpy()
                jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(vals))
                ax.scatter(x + jitter, vals, s=4, alpha=0.25, color=colours[base])
                per_model = sub[sub["group"] == base].groupby("model")["median_rank"].mean()
                ax.scatter(np.full(len(per_model), x + 0.3), per_model, s=18, marker="o",
                           facecolors="none", edgecolors=colours[base])
                ax.errorbar(x, vals.mean(), yerr=vals.std(ddof=1) / np.sqrt(len(vals)),
                            fmt="D", color="black", ms=4)
            ax.set_xticks([0, 1], ["Gemma", "Llama"])
            ax.invert_yaxis()
            ax.set_title(f"{cat}, {fr}", fontsize=9)
            if j == 0:
                ax.set_ylabel("median rank (1 = best of 263)")
    atomic_write(path, lambda tmp, b=to_png(fig): Path(tmp).write_bytes(b))


def _fig1(data_dir: Path, dictionary: Path, out: Path) -> list[dict]:
    scans = load_big2_rewards(data_dir)
    groups = dict(zip(scans["model"], scans["base"]))
    framing = dict(zip(scans["prompt"], scans["framing"]))
    common = dict(group_by=groups, framing=framing, mixed=False, seed=42)
    paper = categories(scans, dictionary, method="paper", n_perm=MKINFER_R, **common)
    ours = categories(scans, dictionary, method="rmfast", **common)
    med = paper.medians
    write_csv(out / "B_fig1_medians.csv", med)
    write_csv(out / "B_fig1_tests_paper.csv", paper.permutation)
    write_csv(out / "B_fig1_tests_rmfast.csv", ours.permutation)
    mixed = paper_mixed(med)
    write_csv(out / "B_fig1_mixed.csv", mixed)
    _fig1_png(med, out / "B_fig1.png")

    pt = paper.permutation
    ok = [_direction_ok(r.mean_a, r.mean_b, r.category, r.framing) for r in pt.itertuples()]
    sig = (pt["p_bonferroni"] < 0.05).tolist()
    panels = "; ".join(f"{r.category}/{r.framing} Gemma {r.mean_a:.1f} vs Llama {r.mean_b:.1f} "
                       f"(p_bonf {r.p_bonferroni:.2g})" for r in pt.itertuples())
    rt = ours.permutation[ours.permutation["framing"] != "all"]
    ok_r = [_direction_ok(r.mean_a, r.mean_b, r.category, r.framing) for r in rt.itertuples()]
    n_sig_r = int((ours.permutation["p_bonferroni"] < 0.05).sum())
    inter = mixed.set_index("term").loc["base_modelLlama:CategoryCommunion"]
    three = mixed.set_index("term").loc["base_modelLlama:CategoryCommunion:prompt_framingnegative"]
    files1 = ["B_fig1.png", "B_fig1_medians.csv", "B_fig1_tests_paper.csv"]
    return [
        {"id": "B-fig1", "title": "Fig. 1a: Big Two median ranks by base model (paper's test)",
         "paper_claim": CLAIM_FIG1, "holds": bool(all(ok) and all(sig)),
         "summary": (f"claimed direction in {sum(ok)}/4 panels, Bonferroni p < .05 in {sum(sig)}/4 "
                     f"(Welch t over 270 model × prompt rows, as the script reports): {panels}"),
         "files": files1},
        {"id": "B-fig1-rmfast", "title": "Fig. 1a with models as the units (rmfast's test)",
         "paper_claim": CLAIM_FIG1, "holds": bool(all(ok_r) and n_sig_r == len(ours.permutation)),
         "summary": (f"same direction in {sum(ok_r)}/4 framing panels, but with each model "
                     f"averaged over prompts (4 Gemma vs 6 Llama RMs, all 210 relabellings) "
                     f"{n_sig_r}/{len(ours.permutation)} tests reach Bonferroni p < .05 (smallest "
                     f"p_bonf {ours.permutation['p_bonferroni'].min():.2g})"),
         "files": ["B_fig1_tests_rmfast.csv", "B_fig1_medians.csv"]},
        {"id": "B-fig1-lmm", "title": "Fig. 1 mixed model (base × category × framing)",
         "paper_claim": CLAIM_LMM, "holds": bool(inter["p_value"] < 0.05),
         "summary": (f"base Llama × Communion {inter['coef']:+.2f} ranks (t({int(inter['df'])}) = "
                     f"{inter['t']:.2f}, p = {inter['p_value']:.2g}); three-way with negative "
                     f"framing {three['coef']:+.2f} (p = {three['p_value']:.2g}); REML, "
                     f"{med['model'].nunique()} models, {len(med)} rows"),
         "files": ["B_fig1_mixed.csv"]},
    ]


def fig4_shape(cat: pd.DataFrame) -> pd.DataFrame:
    """Per run × step (Gemma and Llama present): the two bases' median ranks per category and
    whether the claimed shape holds (Llama ranks Agency higher, Gemma Communion)."""
    keys = [c for c in ("run", "data_size", "data_source", "method", "step") if c in cat.columns]
    two = cat[cat["base"].isin(["Gemma", "Llama"])]
    wide = two.pivot_table(index=keys, columns=["category", "base"], values="median_rank")
    wide.columns = [f"{c}_{b}" for c, b in wide.columns]
    wide = wide.dropna().reset_index()
    wide["agency_llama_higher"] = wide["Agency_Llama"] < wide["Agency_Gemma"]
    wide["communion_gemma_higher"] = wide["Communion_Gemma"] < wide["Communion_Llama"]
    wide["holds"] = wide["agency_llama_higher"] & wide["communion_gemma_higher"]
    return wide


def _fig4(data_dir: Path, out: Path) -> list[dict]:
    from .ledger import Ledger

    ledger = Ledger()
    table = load_checkpoint_ranks(data_dir, ledger=ledger)
    res = trajectory(table)
    files = write_trajectory(res, out, prefix="B_fig4_")
    shape = fig4_shape(res.categories)
    write_csv(out / "B_fig4_shape.csv", shape)
    files.append("B_fig4_shape.csv")
    sky = shape[shape["run"] == "sky_80k"]
    final = shape.sort_values("step").groupby("run", as_index=False).last()
    final = final.sort_values(["method", "data_size", "run"])
    fails = final[~final["holds"]]
    per_run = "; ".join(f"{r.run} ({r.data_size:g}k): Agency L {r.Agency_Llama:g} vs G "
                        f"{r.Agency_Gemma:g}, Communion G {r.Communion_Gemma:g} vs L "
                        f"{r.Communion_Llama:g}" for r in final.itertuples())
    dup = [n for n in ledger.notes if "identical" in n]
    return [
        {"id": "B-fig4a", "title": "Fig. 4a: median rank over training checkpoints (Skywork 77k run)",
         "paper_claim": CLAIM_FIG4A,
         "holds": bool(len(sky) and sky["holds"].all()) if len(sky) else None,
         "summary": (f"the shape holds at {int(sky['holds'].sum())}/{len(sky)} checkpoints of the "
                     "sky_80k run (the run whose model ids match Fig. 4a's; the per-token parquet "
                     "behind Fig. 4a is not in the published snapshot, so the match is by id); "
                     f"all runs: {int(shape['holds'].sum())}/{len(shape)} run × checkpoint rows"),
         "files": files},
        {"id": "B-fig4b", "title": "Fig. 4b: final checkpoint per data source and size",
         "paper_claim": CLAIM_FIG4B, "holds": bool(final["holds"].all()),
         "summary": (f"holds at the final checkpoint of {int(final['holds'].sum())}/{len(final)} "
                     f"runs; fails for {', '.join(fails['run']) or 'none'}. {per_run}"
                     + (f". Note: {dup[0]}" if dup else "")),
         "files": ["B_fig4_shape.csv", "B_fig4_categories.csv", "B_fig4_categories.png"]},
    ]


def reproduce_paper_b(data_dir: Path, out_dir: Path) -> list[dict]:
    """Every paper B finding the published data allow, as CSV + PNG in ``out_dir``.

    ``data_dir``: the iclr2026 folder (its ``dict_big2_nouns/`` and ``reward_model_training/``) or the
    shared data folder holding it (as :func:`rmfast.analysis.reproduce.run` passes); the Big Two
    dictionary is ``<iclr2026>/../lexicons/big2_nouns.csv`` (or ``<iclr2026>/big2_nouns.csv``). A missing
    folder gives one finding saying so.

    >>> import tempfile  # doctest: +SKIP
    >>> f = reproduce_paper_b(Path("../shared/data/iclr2026"), Path(tempfile.mkdtemp()))  # doctest: +SKIP
    >>> [x["id"] for x in f]  # doctest: +SKIP
    ['B-fig1', 'B-fig1-rmfast', 'B-fig1-lmm', 'B-fig4a', 'B-fig4b']
    """
    data_dir, out = Path(data_dir), Path(out_dir)
    if (data_dir / "iclr2026").is_dir():
        data_dir = data_dir / "iclr2026"
    if not (data_dir / "dict_big2_nouns").is_dir():
        return [{"id": "B-data", "title": "Paper B data", "paper_claim": "(paper B's published data)",
                 "holds": None, "summary": f"not available: no folder {data_dir / 'dict_big2_nouns'}",
                 "files": []}]
    dictionary = next((p for p in (data_dir.parent / "lexicons" / "big2_nouns.csv",
                                   data_dir / "big2_nouns.csv") if p.exists()), None)
    if dictionary is None:
        raise UserError(f"no Big Two dictionary beside {data_dir}; expected "
                        f"{data_dir.parent / 'lexicons' / 'big2_nouns.csv'}")
    out.mkdir(parents=True, exist_ok=True)
    return _fig1(data_dir, dictionary, out) + _fig4(data_dir, out)


__all__ = ["fig4_shape", "paper_mixed", "reproduce_paper_b"]
