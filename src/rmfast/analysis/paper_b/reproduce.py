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
(:mod:`rmfast.analysis.stats.permutation`). rmfast's own test averages each model over prompts first
and permutes the model labels (10 models, every relabelling).

Fig. 4 from the published checkpoint ranks (:mod:`rmfast.analysis.paper_b.trajectory`): per run, base
model and category the median rank over steps (4a) and at the final step per data size (4b).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ...io import atomic_write, write_csv
from .categories import FAMILY_PANELS, FAMILY_POOLED, POOLED, categories, diff_column
from .mixed_model import paper_mixed
from .published import load_big2_rewards, load_checkpoint_ranks, load_published_scores
from ..stats.permutation import MKINFER_R
from .plots import fig1_figure, fig4a_figure, fig4b_figure
from .trajectory import trajectory

CLAIM_FIG1 = ("Llama-based RMs rank Agency words higher and Gemma-based RMs Communion words "
              "(a 'robust preference of Llama RMs for agency and ... of Gemma RMs for communion'; "
              "Fig. 1a, permutation t-tests per category × framing, Bonferroni-corrected)")
CLAIM_FIG1B = ("RMs differ by base model on the moral foundations too (Fig. 1b: MFD 2.0, five "
               "foundations, permutation t-tests per foundation × framing, Bonferroni-corrected)")
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


def r_avg_ranks(summaries: pd.DataFrame) -> pd.DataFrame:
    """The authors' R "avg ranks" block as it prints: prompt_framing, Category, one column per
    group (each model's median over all its word × prompt ranks, averaged over the group's
    models), and the second group − first (``llama_minus_gemma``, the R block's ``diff``)."""
    s = summaries[summaries["statistic"] == "r_avg_ranks"]
    if s.empty:
        return pd.DataFrame(columns=["prompt_framing", "Category", diff_column(summaries)])
    dcol = diff_column(s)
    first = s.iloc[0]
    s = s[(s["group_a"] == first["group_a"]) & (s["group_b"] == first["group_b"])]
    out = pd.DataFrame({"prompt_framing": s["framing"].to_numpy(), "Category": s["category"].to_numpy(),
                        first["group_a"]: s["value_a"].to_numpy(),
                        first["group_b"]: s["value_b"].to_numpy(), dcol: s[dcol].to_numpy()})
    order = {"positive": 0, "negative": 1}  # R's factor levels
    return out.sort_values(["prompt_framing", "Category"], key=lambda c: c.map(order)
                           if c.name == "prompt_framing" else c).reset_index(drop=True)


def _write_png(fig, path: Path) -> None:
    from ..render.plots import to_png

    atomic_write(path, lambda tmp, b=to_png(fig): Path(tmp).write_bytes(b))


def _try_mixed(med: pd.DataFrame, random_slope: bool) -> tuple[pd.DataFrame, str | None]:
    """:func:`paper_mixed`, or an empty table and why it could not be fitted (a singular design:
    too few models for the random effects' covariance, or no variation between models)."""
    try:
        return paper_mixed(med, random_slope=random_slope), None
    except (np.linalg.LinAlgError, ValueError) as exc:
        empty = pd.DataFrame(columns=["term", "meaning", "coef", "se", "df", "t", "p_value", "p_z",
                                      "random_effects", "model_sd", "residual_sd", "converged", "fit_check",
                                      "test", "reference"])
        return empty, str(exc).splitlines()[0] or type(exc).__name__


def _fmt_p(p: float) -> str:
    return f"{p:.2g}"


def _floor(t: pd.DataFrame) -> str:
    """'smallest attainable p ...' of a family of rmfast's permutation tests (their min_p columns)."""
    if not len(t):
        return "no tests"
    lo, lo_b, n = t["min_p"].min(), t["min_p_bonferroni"].min(), int(t["n_perm"].min())
    m = int(t["p_value"].notna().sum())
    cant = " — no test in this family can reach .05 whatever the data" if lo_b >= 0.05 else ""
    return (f"smallest attainable p {_fmt_p(lo)} ({n:,} relabellings), {_fmt_p(lo_b)} after "
            f"Bonferroni ×{m}{cant}")


def _floor_paper(pt: pd.DataFrame, n_perm: int) -> str:
    """The paper's test has no floor on its reported (parametric Welch) p; its permutation p's floor is 1/R."""
    k = len(pt)
    return (f"(smallest attainable p: none for the parametric Welch p the paper reports; its permutation p's "
            f"floor is 1/{n_perm:,}, ×{k} = {_fmt_p(min(1.0, k / n_perm))})")


def _pooled_line(pooled: pd.DataFrame) -> str:
    """The exploratory pooled tests, apart from the paper's family."""
    if not len(pooled):
        return ""
    n_sig = int((pooled["p_bonferroni"] < 0.05).sum())
    dcol = diff_column(pooled)
    rows = "; ".join(f"{r.category} {getattr(r, dcol):+.2f} ranks [{r.statistic}], p = {r.p_value:.3g}"
                     + (f" ({int(round(r.p_value * r.n_perm))}/{r.n_perm})" if r.exact else "")
                     + f", p_bonf {_fmt_p(r.p_bonferroni)}" for r in pooled.itertuples())
    return (f"Exploratory, rmfast's addition chosen after the data (not the paper's family; corrected apart, "
            f"×{len(pooled)}): both framings pooled with the framing's sign (positive − negative): "
            f"{n_sig}/{len(pooled)} reach Bonferroni p < .05 ({_floor(pooled)}): {rows}")


def _fig1_tables(out: Path, tag: str, paper, ours):
    """Fig. 1's tables as CSVs (medians, both tests, summaries, R avg ranks, the mixed models); returns
    (file names by table, random-intercept fit, why it failed, random-slope fit, why it failed)."""
    med = paper.medians
    files = {}
    for name, table in (("medians", med), ("tests_paper", paper.permutation),
                        ("tests_rmfast", ours.permutation), ("summaries", paper.summaries),
                        ("avg_ranks", r_avg_ranks(paper.summaries))):
        write_csv(out / f"{tag}_{name}.csv", table)
        files[name] = f"{tag}_{name}.csv"
    mixed, mixed_failed = _try_mixed(med, False)
    slope, slope_failed = _try_mixed(med, True) if not mixed_failed else (mixed, mixed_failed)
    write_csv(out / f"{tag}_mixed.csv", pd.concat([mixed, slope], ignore_index=True))
    files["mixed"] = f"{tag}_mixed.csv"
    return files, mixed, mixed_failed, slope, slope_failed


def _lmm_parts(mixed, slope, slope_failed):
    """The base × category interaction terms and their line for the index, from both mixed models: the base
    coefficient named for what it is (one cell's contrast), the base effect as a marginal contrast, and a
    random-slope fit that did not converge (or is degenerate) said so, its numbers not quoted."""
    inter_terms = [t for t in mixed["term"] if t.startswith("base_model") and ":Category" in t
                   and "framing" not in t]
    mi, ms = mixed.set_index("term"), slope.set_index("term")
    slope_ok = not slope_failed and bool(slope["converged"].all())
    lmm_parts = "; ".join(
        f"{t} {mi.loc[t, 'coef']:+.2f} (random intercept: SE {mi.loc[t, 'se']:.2f}, "
        f"t({int(mi.loc[t, 'df'])}) = {mi.loc[t, 't']:.2f}, p = {_fmt_p(mi.loc[t, 'p_value'])}"
        + ("" if not slope_ok else f"; + random category slope: SE {ms.loc[t, 'se']:.2f}, z = "
           f"{ms.loc[t, 't']:.2f}, p_z = {_fmt_p(ms.loc[t, 'p_z'])}") + ")" for t in inter_terms)
    base = [t for t in mixed["term"] if t.startswith("base_model") and ":" not in t]
    for t in base:
        r = mi.loc[t]
        if t.endswith("(marginal)"):
            lmm_parts += (f"; the model effect as a marginal contrast ({r['meaning']}): {r['coef']:+.2f} ranks, "
                          f"SE {r['se']:.2f}, t({int(r['df'])}) = {r['t']:.2f}, p = {_fmt_p(r['p_value'])}")
        else:
            lmm_parts += (f"; {t} {r['coef']:+.2f} is {r['meaning']} (t({int(r['df'])}) = {r['t']:.2f}, "
                          f"p = {_fmt_p(r['p_value'])})")
    if slope_failed:
        slope_note = f" (the random-slope check could not be fitted: {slope_failed})"
    elif not slope_ok:
        why = "; ".join(sorted(set(slope["fit_check"]))) if "fit_check" in slope else "not converged"
        slope_note = (f" (the random-slope check did NOT converge, so it cannot say whether the interaction holds "
                      f"with models as the units; its numbers are not quoted: {why})")
    else:
        slope_note = " (random-slope fit converged; variance components and Hessian checked)"
    return inter_terms, mi, ms, lmm_parts, slope_note


def fig1_findings(scans: pd.DataFrame, dictionary, out: Path, *, fig: str = "1",
                  label: str = "Big Two", n_perm: int = MKINFER_R) -> list[dict]:
    """Fig. 1 (``fig="1"``, Big Two) or Fig. 1b (``fig="1b"``, MFD 2.0: Virtue/Vice merged into the
    five foundations) from published scores ``scans`` (:func:`load_published_scores`): tables and
    figure into ``out`` (``B_fig1_*`` / ``B_fig1b_*``) and the findings for the index."""
    tag, fid = f"B_fig{fig}", f"B-fig{fig}"
    groups = {m: (b if isinstance(b, str) else "unknown")
              for m, b in zip(scans["model"], scans["base"])}
    framing = dict(zip(scans["prompt"], scans["framing"]))
    common = dict(group_by=groups, framing=framing, mixed=False)  # the default seed: `analyze categories` draws the same
    paper = categories(scans, dictionary, method="paper", n_perm=n_perm, **common)
    ours = categories(scans, dictionary, method="rmfast", virtue_vice="merge", **common)
    med = paper.medians
    n_words = int(paper.words.groupby(["model", "prompt"]).size().max())
    files, mixed, mixed_failed, slope, slope_failed = _fig1_tables(out, tag, paper, ours)
    _write_png(fig1_figure(med, paper.permutation, fig_id=fig, dictionary=label,
                           n_words=n_words), out / f"{tag}.png")
    big_two = set(med["category"]) == {"Agency", "Communion"}
    n_models = med.groupby("group")["model"].nunique().to_dict()
    rows_per = med.groupby(["framing", "category", "group"]).size()
    pt = paper.permutation
    sig = (pt["p_bonferroni"] < 0.05).tolist()
    ok = [_direction_ok(r.mean_a, r.mean_b, r.category, r.framing) for r in pt.itertuples()] \
        if big_two else []
    ga, gb = (pt["group_a"].iloc[0], pt["group_b"].iloc[0]) if len(pt) else ("Gemma", "Llama")
    panels = "; ".join(f"{r.category}/{r.framing} {r.group_a} {r.mean_a:.1f} vs {r.group_b} "
                       f"{r.mean_b:.1f} (p_bonf {_fmt_p(r.p_bonferroni)})" for r in pt.itertuples())
    n_rows = int(rows_per.groupby(["framing", "category"]).sum().iloc[0]) if len(rows_per) else 0
    stat_name = ("mean of model × prompt median ranks [mean_of_model_prompt_medians], "
                 f"{n_rows} rows per panel")
    rt, pooled, ok_r, n_sig_r, n_relabel = _rmfast_parts(ours.permutation, big_two)
    inter_terms, mi, ms, lmm_parts, slope_note = _lmm_parts(mixed, slope, slope_failed)
    k = len(pt)
    if big_two:
        paper_claim, holds = CLAIM_FIG1, bool(all(ok) and all(sig))
        head = (f"claimed direction in {sum(ok)}/{k} panels, Bonferroni p < .05 (×{k}) in {sum(sig)}/{k} "
                f"{_floor_paper(pt, n_perm)}")
        head_r = f"same direction in {sum(ok_r)}/{len(rt)} framing panels, but"
    else:
        paper_claim, holds = CLAIM_FIG1B, None
        head = (f"Bonferroni p < .05 (×{k}) in {sum(sig)}/{k} foundation × framing panels "
                f"{_floor_paper(pt, n_perm)}; no direction per foundation is stated in the paper to check against")
        head_r = "models as the units,"
    findings = [
        {"id": fid, "title": f"Fig. {fig}: {label} median ranks by base model (paper's test)",
         "paper_claim": paper_claim, "holds": holds,
         "summary": (f"{head} (Welch t over the model × prompt rows, as the script reports; "
                     f"statistic: {stat_name}): {panels}"),
         "files": [f"{tag}.png", files["medians"], files["tests_paper"]]},
        {"id": f"{fid}-rmfast", "title": f"Fig. {fig} with models as the units (rmfast's test)",
         "paper_claim": paper_claim,
         "holds": bool(all(ok_r) and n_sig_r == len(rt)) if big_two else None,
         "summary": (f"{head_r} with each model averaged over prompts (statistic: mean over "
                     f"models of each model's mean over prompts [mean_of_model_means]; "
                     f"{n_models.get(ga, 0)} {ga} vs {n_models.get(gb, 0)} {gb} RMs, "
                     f"{n_relabel} relabellings) {n_sig_r}/{len(rt)} of the paper's panel tests reach "
                     f"Bonferroni p < .05 (the paper's family, ×{len(rt)}; "
                     f"{_floor(rt)}; smallest p_bonf {_fmt_p(rt['p_bonferroni'].min())}). "
                     + _pooled_line(pooled)),
         "files": [files["tests_rmfast"], files["medians"]]},
        {"id": f"{fid}-lmm", "title": f"Fig. {fig} mixed model (base × category × framing)",
         "paper_claim": CLAIM_LMM,
         "holds": (bool((mi.loc[inter_terms, "p_value"] < 0.05).any())
                   if inter_terms and bool(mixed["converged"].all()) else None),
         "summary": (f"not fitted: {mixed_failed}" if mixed_failed else
                     ("" if bool(mixed["converged"].all()) else "the random-intercept fit did NOT converge "
                      f"({'; '.join(sorted(set(mixed['fit_check'])))}), so no verdict: ")
                     + f"{lmm_parts}{slope_note}; REML, {med['model'].nunique()} models, "
                     f"{len(med)} rows. The paper fits the random intercept only"),
         "files": [files["mixed"]]},
        {"id": f"{fid}-summaries", "title": f"Fig. {fig}: four summaries of the same medians (three distinct values)",
         "paper_claim": ("the text quotes average ranks per base model (the R script's 'avg "
                         "ranks' block, under '# summary stats for main text')"),
         "holds": None, "summary": _summaries_line(paper.summaries, ga, gb, big_two),
         "files": [files["summaries"], files["avg_ranks"]]},
    ]
    if big_two and not slope_failed and bool(slope["converged"].all()):
        findings.append({"id": f"{fid}-units", "title": "Why the verdicts differ: what each "
                         "test treats as independent", "paper_claim": CLAIM_FIG1, "holds": None,
                         "summary": _units_paragraph(pt, rt, mi, ms, inter_terms,
                                                     n_models, n_rows),
                         "files": [files["tests_paper"], files["tests_rmfast"], files["mixed"]]})
    return findings


def _rmfast_parts(perm: pd.DataFrame, big_two: bool):
    """rmfast's tests split by family: (the paper's panels, the exploratory pooled rows, direction per panel,
    panels with Bonferroni p < .05, relabellings)."""
    rt = perm[perm["family"] == FAMILY_PANELS]
    pooled = perm[perm["family"] == FAMILY_POOLED]
    ok_r = [_direction_ok(r.mean_a, r.mean_b, r.category, r.framing) for r in rt.itertuples()] \
        if big_two else []
    return rt, pooled, ok_r, int((rt["p_bonferroni"] < 0.05).sum()), len(perm) and int(perm["n_perm"].iloc[0])


def _summaries_line(summ: pd.DataFrame, ga: str, gb: str, big_two: bool) -> str:
    parts = []
    for (fr, cat), g in summ.groupby(["framing", "category"], sort=True):
        v = g.set_index("statistic")[diff_column(summ)]
        parts.append(f"{cat}/{fr} {v.get('mean_of_model_prompt_medians', np.nan):+.2f} / "
                     f"{v.get('mean_of_model_medians_over_prompts', np.nan):+.2f} / "
                     f"{v.get('r_avg_ranks', np.nan):+.2f} / {v.get('mean_of_model_means', np.nan):+.2f}")
    return (f"{gb} − {ga} in ranks, as four statistics: mean of the model × prompt medians "
            "[mean_of_model_prompt_medians] / mean over models of each model's median over "
            "prompts [mean_of_model_medians_over_prompts] / mean over models of each model's "
            "median over all its word × prompt ranks [r_avg_ranks, "
            + ("the R script's 'avg ranks' block exactly" if big_two else
               "the computation of the R script's Big Two 'avg ranks' block applied to this "
               "dictionary: the script has no such block for it")
            + "] / mean over models of each model's mean over prompts of its medians [mean_of_model_means, "
            "rmfast's group test's]: " + "; ".join(parts))


def _units_paragraph(pt, rt, mi, ms, inter_terms, n_models, n_rows) -> str:
    t = inter_terms[0] if inter_terms else None
    if t is None:
        return "no base × category term to compare"
    ratio = ms.loc[t, "se"] / mi.loc[t, "se"]
    total = sum(n_models.values())
    return (
        f"The three tests ask the same question with different independent units. The paper's "
        f"permutation t-test treats each of the {n_rows} model × prompt medians in a panel as an "
        f"independent observation, but they come from only {total} RMs: the prompts of one RM "
        f"share its weights, so the test counts each RM about {n_rows / max(total, 1):.0f} "
        f"times (Bonferroni p {_fmt_p(pt['p_bonferroni'].max())} at most). The mixed model "
        "with a random intercept per model lets each RM shift all its ranks, but still treats "
        "each RM's own Agency-vs-Communion preference as exact, so the base × category "
        f"interaction is judged against the within-model residual (df {int(mi.loc[t, 'df'])}, "
        f"p = {_fmt_p(mi.loc[t, 'p_value'])}). Letting each RM have its own category preference "
        f"(a random slope) leaves the estimate at {ms.loc[t, 'coef']:+.2f} but multiplies its "
        f"SE by {ratio:.1f} ({mi.loc[t, 'se']:.2f} → {ms.loc[t, 'se']:.2f}; p_z "
        f"{_fmt_p(ms.loc[t, 'p_z'])}): the evidence now comes from how the {total} RMs differ, "
        f"as in rmfast's test, where the RM is the unit ({n_models.get('Gemma', 0)} vs "
        f"{n_models.get('Llama', 0)}) and no panel test reaches Bonferroni p < .05 (smallest "
        f"{_fmt_p(rt['p_bonferroni'].min())}; smallest attainable {_fmt_p(rt['min_p_bonferroni'].min())}). All agree on the direction; they disagree on "
        "whether ten RMs are enough to call it more than these particular RMs.")


def _fig1(data_dir: Path, dictionary: Path, out: Path, *, allow_skipped: bool = False) -> list[dict]:
    from ..data.ledger import Ledger

    ledger = Ledger()
    scans = load_big2_rewards(data_dir, ledger=ledger, allow_skipped=allow_skipped)
    found = fig1_findings(scans, dictionary, out)
    found[0]["summary"] += ". " + " ".join(ledger.notes)
    return found


def _fig1b(data_dir: Path, out: Path, *, allow_skipped: bool = False) -> list[dict]:
    """Fig. 1b (MFD 2.0) when ``<iclr2026>/dict_MFD_20/`` holds the MFD score CSVs."""
    from ..data.ledger import Ledger

    folder = next((p for p in sorted(data_dir.glob("dict_*")) if p.is_dir()
                   and "mfd" in p.name.lower()), None)
    if folder is None:
        return [{"id": "B-fig1b", "title": "Fig. 1b: MFD 2.0 median ranks by base model",
                 "paper_claim": CLAIM_FIG1B, "holds": None,
                 "summary": (f"not available: no folder {data_dir / 'dict_MFD_20'} (the authors' "
                             "published MFD 2.0 score CSVs; put them there to get Fig. 1b)"),
                 "files": []}]
    dictionary = next((p for p in (*sorted(folder.glob("*.dicx")),
                                   data_dir.parent / "lexicons" / "mfd2.0.dicx",
                                   data_dir / "moral-foundations-dictionary-20.dicx",
                                   data_dir / "mfd2.0.dicx") if p.exists()), None)
    if dictionary is None:
        raise UserError(f"{folder} holds MFD scores but no MFD 2.0 dictionary was found; put "
                        f"mfd2.0.dicx in {data_dir.parent / 'lexicons'} or in {folder}")
    ledger = Ledger()
    scans = load_published_scores(folder, ledger=ledger, allow_skipped=allow_skipped)
    found = fig1_findings(scans, dictionary, out, fig="1b", label="MFD 2.0 (five foundations)")
    found[0]["summary"] += ". " + " ".join(ledger.notes)
    return found


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


#: Words ranked in the authors' Fig. 4 (its axis: "#1 = best, #1365 = worst").
FIG4_N_RANKED = 1365


def _fig4(data_dir: Path, out: Path) -> list[dict]:
    from ..data.ledger import Ledger

    if not (data_dir / "reward_model_training").is_dir():
        return [{"id": "B-fig4", "title": "Fig. 4: RM training runs", "paper_claim": CLAIM_FIG4B,
                 "holds": None, "files": [], "summary": "not available: no folder "
                 f"{data_dir / 'reward_model_training'}"}]
    ledger = Ledger()
    table = load_checkpoint_ranks(data_dir, ledger=ledger)
    same = table.drop_duplicates("run").set_index("run")["same_as"].dropna().to_dict()
    res = trajectory(table.drop(columns=["same_as", "file_data_size", "file_data_source"]))
    files = []
    for name, t in res.tables().items():
        if len(t):
            write_csv(out / f"B_fig4_{name}.csv", t)
            files.append(f"B_fig4_{name}.csv")
    shape = fig4_shape(res.categories)
    shape["same_as"] = shape["run"].map(same)
    per_run = table.drop_duplicates("run").set_index("run")
    for c in ("file_data_size", "file_data_source"):  # the file's own columns, where the manifest's differ
        shape[c] = shape["run"].map(per_run[c])
    write_csv(out / "B_fig4_shape.csv", shape)
    files.append("B_fig4_shape.csv")
    sky = shape[shape["run"] == "sky_80k"]
    final = shape.sort_values("step").groupby("run", as_index=False).last()
    final = final.sort_values(["method", "data_size", "run"])
    if len(sky):
        _write_png(fig4a_figure(res.categories, "sky_80k", "Skywork preferences, 77k pairs, "
                                "run sky_80k", FIG4_N_RANKED), out / "B_fig4a.png")
        files.insert(0, "B_fig4a.png")
    _write_png(fig4b_figure(final, same, FIG4_N_RANKED), out / "B_fig4b.png")
    distinct = final[final["same_as"].isna()]
    fails = distinct[~distinct["holds"]]
    own = table.drop_duplicates("run").set_index("run")

    def label(r) -> str:
        twin = [a for a, b in same.items() if b == r.run]
        name = "=".join([r.run, *twin])
        size = f"{r.data_size:g}k"
        o = own.loc[r.run]
        if pd.notna(o["file_data_size"]) and o["file_data_size"] != r.data_size:
            size += (f" per the authors' manifest; the file's own columns say "
                     f"{o['file_data_size']:g}k {o['file_data_source']}")
        return f"{name} ({size})"

    per_run = "; ".join(f"{label(r)}: Agency L {r.Agency_Llama:g} vs G {r.Agency_Gemma:g}, "
                        f"Communion G {r.Communion_Gemma:g} vs L {r.Communion_Llama:g}"
                        for r in distinct.itertuples())
    dup = "; ".join(f"{b} = {a}" for a, b in same.items())
    return [
        {"id": "B-fig4a", "title": "Fig. 4a: median rank over training checkpoints (Skywork 77k run)",
         "paper_claim": CLAIM_FIG4A,
         "holds": bool(len(sky) and sky["holds"].all()) if len(sky) else None,
         "summary": (f"the shape holds at {int(sky['holds'].sum())}/{len(sky)} checkpoints of the "
                     "sky_80k run (the run whose model ids match Fig. 4a's; the per-token parquet "
                     "behind Fig. 4a is not in the published snapshot, so the match is by id); "
                     f"all distinct runs: {int(shape.loc[shape['same_as'].isna(), 'holds'].sum())}"
                     f"/{int(shape['same_as'].isna().sum())} run × checkpoint rows; median rank "
                     f"of {FIG4_N_RANKED:,} words"),
         "files": files},
        {"id": "B-fig4b", "title": "Fig. 4b: final checkpoint per data source and size",
         "paper_claim": CLAIM_FIG4B, "holds": bool(distinct["holds"].all()),
         "summary": (f"holds at the final checkpoint of {int(distinct['holds'].sum())}/"
                     f"{len(distinct)} distinct runs ({len(final)} files"
                     + (f"; identical files counted once: {dup}" if dup else "") + "); fails for "
                     f"{', '.join(fails['run']) or 'none'}. {per_run}. Median rank of "
                     f"{FIG4_N_RANKED:,} words. Notes: " + " ".join(ledger.notes)),
         "files": ["B_fig4b.png", "B_fig4_shape.csv", "B_fig4_categories.csv"]},
    ]


def reproduce_paper_b(data_dir: Path, out_dir: Path, *, allow_skipped: bool = False) -> list[dict]:
    """Every paper B finding the published data allow, as CSV + PNG in ``out_dir``.

    ``data_dir``: the iclr2026 folder or the shared data folder holding it (as
    :func:`rmfast.analysis.reproduce.run` passes). Layout::

        iclr2026/dict_big2_nouns/<prefix>_rewards_<org>_<model>.csv   Fig. 1 (Big Two)
        iclr2026/dict_MFD_20/<prefix>_rewards_<org>_<model>.csv       Fig. 1b (optional; the
                                                                      authors name these files
                                                                      MFD20_rewards_* and big2_rewards_*)
        iclr2026/reward_model_training/rank_results_<run>.csv         Fig. 4
        lexicons/big2_nouns.csv (or iclr2026/big2_nouns.csv)          the Big Two dictionary
        lexicons/mfd2.0.dicx (or a .dicx in dict_MFD_20/)             the MFD 2.0 dictionary

    A missing folder gives one finding saying so. ``allow_skipped``: go on when a skipped score
    file drops a model (default: an error).

    >>> import tempfile  # doctest: +SKIP
    >>> f = reproduce_paper_b(Path("../shared/data/iclr2026"), Path(tempfile.mkdtemp()))  # doctest: +SKIP
    >>> [x["id"] for x in f]  # doctest: +SKIP
    ['B-fig1', 'B-fig1-rmfast', 'B-fig1-lmm', 'B-fig1-summaries', 'B-fig1-units', 'B-fig1b',
     'B-fig1b-rmfast', 'B-fig1b-lmm', 'B-fig1b-summaries', 'B-fig4a', 'B-fig4b']
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
    return (_fig1(data_dir, dictionary, out, allow_skipped=allow_skipped)
            + _fig1b(data_dir, out, allow_skipped=allow_skipped) + _fig4(data_dir, out))


__all__ = ["FIG4_N_RANKED", "fig1_findings", "fig4_shape", "paper_mixed", "r_avg_ranks",
           "reproduce_paper_b"]
