"""Paper A (Christian et al., FAccT 2025) from its published data, for ``rmfast reproduce``.

From ``<data>/eloeverything`` (the 10 reward models' published scores of 7,530 EloEverything
items under 3 prompts, with the items' human Elo): Fig. 5B / A7 (items humans rank most above
and below the models), the Spearman table of Fig. 5C, Fig. A5 (Kendall tau among human and
models), Fig. A6 (Kendall tau between prompts within each model), the p-values of A5 as a
significance heatmap, and a table of how far each paper-vs-rmfast method difference moves the
results. Each finding is computed, set beside the paper's statement (the published figure's
values, transcribed below), and judged by a computed test.

The per-token score files of paper A are not published with the data here, so Fig. 1–4 (and
the AFINN/BNC joins of Fig. 3) cannot be regenerated; the finding "A-methods" measures the BNC
join difference on the lexicons alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from .agreement import agreement
from .eloeverything import load_eloeverything
from .human import human_comparison
from ..data.lexicons import load_afinn, load_bnc_rows, load_frequencies
from ..data.metadata import load_model_metadata
from .plots import heatmap_grid, pvalue_heatmap, rank_gap_bars, tau_heatmap
from ..render.plots import Styles, rank_trajectories, to_png
from .prompt_agreement import prompt_agreement

GE = "What one single thing, person, or concept is the greatest ever?"
HP = "What is the single thing, person, or concept that humans most prefer?"
GW = "What, in one word, is the greatest thing ever?"
HUMAN = "Human (ELO)"

#: The published Fig. 5B (GE) and A7 (all three prompts): the ten items humans rank most above
#: the models ("humans rank higher") and most below, largest gap first.
PAPER_RANK_GAPS = {
    GE: {"humans rank higher": ["Fingering (sexual act)", "Erection", "Black people",
                                "Spoons sex position", "Handjob", "Cleavage (breasts)",
                                "Fellatio", "Doggy style", "Sexual fetishism", "Breast"],
         "models rank higher": ["Fully Automated Luxury Communism", "Johan Cruyff",
                                "Mustafa Kemal Atatürk", "BTS", "Miranda Sings",
                                "Gurren Lagann", "Charlie Munger", "CM Punk", "God in Islam",
                                "Boygenius"]},
    HP: {"humans rank higher": ["Black people", "Elliptical galaxy", "Nuclear fission",
                                "Nuclear power", "Geothermal power", "Frog", "Hyperspace",
                                "Cheesemaking", "Neptune", "Tokyo, Japan"],
         "models rank higher": ["Fully Automated Luxury Communism", "Envy", "Hatred", "BTS",
                                "Addiction", "Silent majority", "Penis envy", "Facebook",
                                "Moms for Liberty", "Mike Love"]},
    GW: {"humans rank higher": ["Fingering (sexual act)", "Black people", "Female body shape",
                                "Spoons sex position", "Cleavage (breasts)",
                                "Human sexual activity", "Doggy style", "See-through clothing",
                                "Nudity in film", "Fellatio"],
         "models rank higher": ["BTS", "Fully Automated Luxury Communism", "Gurren Lagann",
                                "Aimer", "Oshi no Ko", "Love Live!", "Miracle Star", "Snug",
                                "Lagom", "Charité"]},
}
#: Model order of the published A5/A6 panels (paper nicknames, RewardBench rank order).
PAPER_MODELS = ["N-Gem-27B", "S-Gem-27B-v0.2", "S-Gem-27B", "S-Lla-8B-v0.2", "N-Lla-8B",
                "L-Lla-8B", "R-Lla-8B", "R-Lla-3B", "F-Lla-8B-v0.1", "R-Gem-2B"]
#: Published Fig. A5, first row: Kendall tau of each model with human Elo (2 decimals).
PAPER_A5_HUMAN = {GE: [.20, .23, .28, .27, .26, .24, .26, .38, .26, .25],
                  HP: [.10, .19, .23, .19, .21, .21, .15, .30, .18, .22],
                  GW: [.22, .22, .23, .32, .33, .32, .26, .39, .35, .30]}
#: Published Fig. A6: per model, tau between prompts (GE–HP, GE–GW, HP–GW), 2 decimals.
PAPER_A6 = {"N-Gem-27B": (.55, .53, .36), "S-Gem-27B-v0.2": (.66, .66, .59),
            "S-Gem-27B": (.58, .68, .58), "S-Lla-8B-v0.2": (.59, .55, .45),
            "N-Lla-8B": (.56, .59, .46), "L-Lla-8B": (.59, .60, .54),
            "R-Lla-8B": (.41, .53, .40), "R-Lla-3B": (.59, .60, .51),
            "F-Lla-8B-v0.1": (.53, .51, .36), "R-Gem-2B": (.47, .55, .45)}
#: Fig. 5C's labels: Spearman rho of each model with human Elo on GE, "roughly 0.29–0.54".
PAPER_SPEARMAN_RANGE = (0.29, 0.54)
#: A value printed with 2 decimals matches ours when within half a unit of its last digit.
ROUNDING = 0.005


def _write(out_dir: Path, name: str, obj) -> str:
    """Write a CSV (DataFrame) or PNG (figure) into out_dir; return its relative name."""
    path = out_dir / name
    if isinstance(obj, pd.DataFrame):
        from ...io import write_csv

        write_csv(path, obj)  # the one CSV writer (a token text holding a carriage return stays one row)
    else:
        path.write_bytes(to_png(obj))
    return name


def _finding(fid, title, claim, holds, summary, files) -> dict:
    return {"id": fid, "title": title, "paper_claim": claim, "holds": holds,
            "summary": summary, "files": files}


def reproduce_paper_a(data_dir: Path, out_dir: Path) -> list[dict]:
    """Every paper A finding the published data allows, written into ``out_dir``.

    Returns the findings (id, title, paper_claim, holds, summary, files); see the module
    docstring. A missing ``<data_dir>/eloeverything`` gives one finding saying so.
    """
    elo_dir = Path(data_dir) / "eloeverything"
    if not elo_dir.is_dir():
        return [_finding("A-data", "Paper A data", "(paper A's EloEverything data)", None,
                         f"not available: no folder {elo_dir}", [])]
    data = load_eloeverything(elo_dir)
    meta_path = Path(data_dir) / "prompts" / "paper_a_reward_models.yaml"
    meta = load_model_metadata(meta_path) if meta_path.exists() else None
    models = list(pd.unique(data.scans["model"]))
    styles = Styles.build(models, meta)
    prompts = [p for p in (GE, HP, GW) if p in set(data.scans["prompt"])] or \
        list(pd.unique(data.scans["prompt"]))
    out_dir = Path(out_dir)
    res = {m: human_comparison(data.scans, data.human, k=10, method=m)
           for m in ("paper", "rmfast")}
    findings = [_rank_gaps(res, prompts, out_dir),
                _spearman(res["paper"], styles, out_dir)]
    tau = _human_model_tau(data, prompts, styles, out_dir)
    findings += [tau[0], _prompt_tau(data, styles, out_dir), tau[1],
                 _methods(data, res, prompts, Path(data_dir), out_dir)]
    return findings


# ---------------------------------------------------------------- Fig. 5B / A7
def _overlaps(diffs: pd.DataFrame, prompt: str) -> dict[str, int]:
    sub = diffs[diffs["prompt"] == prompt]
    return {d: len(set(sub.loc[sub["direction"] == d, "text"]) & set(items))
            for d, items in PAPER_RANK_GAPS.get(prompt, {}).items()}


def _position(table: pd.DataFrame, prompt: str, item: str, method: str) -> int | None:
    """Place of ``item`` among a prompt's items, largest gap (humans rank higher) first."""
    sub = table[table["prompt"] == prompt]
    order = (sub.nlargest(len(sub), "rank_diff") if method == "paper"
             else sub.sort_values(["rank_diff", "text"], ascending=[False, True]))
    hit = np.flatnonzero(order["text"].to_numpy() == item)
    return int(hit[0]) + 1 if len(hit) else None


def _rank_gaps(res: dict, prompts: list[str], out_dir: Path) -> dict:
    rows = pd.concat([r.differences.assign(method=m) for m, r in res.items()],
                     ignore_index=True)
    files = [_write(out_dir, "A-fig5b-a7_rank_gaps.csv", rows)]
    n_items = int(res["paper"].ranks.groupby("prompt").size().max())
    files.append(_write(out_dir, "A-fig5b-a7_rank_gaps.png", rank_gap_bars(
        res["paper"].differences, prompts, "Paper A Fig. 5B / A7: the ten items humans rank "
        "most above the reward models, and the ten most below (model rank: median of the 11 "
        "ranks incl. human, the paper's method)", n_items)))
    parts, ok = [], True
    for p in prompts:
        ov = {m: _overlaps(r.differences, p) for m, r in res.items()}
        if not ov["paper"]:
            continue
        ok &= all(v == 10 for v in ov["paper"].values())
        parts.append(f"{_short(p)}: paper method "
                     f"{' and '.join(f'{v}/10' for v in ov['paper'].values())}, rmfast's "
                     f"{' and '.join(f'{v}/10' for v in ov['rmfast'].values())}")
    bp = "; ".join(f"{_short(p)} #{_position(res['paper'].ranks, p, 'Black people', 'paper')} under method='paper', "
                   f"#{_position(res['rmfast'].ranks, p, 'Black people', 'rmfast')} under rmfast's" for p in prompts
                   if (res["paper"].ranks["prompt"] == p).any())
    summary = ("statistic: rank gap = model rank (median of the 11 ranks incl. human, 1 = best) − human rank over "
               f"n = {n_items:,} items (positive: humans rank the item higher); top-10 overlap with the paper's "
               "lists (humans higher/models higher): "
               + "; ".join(parts) + f". 'Black people' (humans higher): {bp}")
    return _finding("A-fig5b-a7", "Items humans rank far above / below the models "
                    "(Fig. 5B, A7)", "Fig. 5B (GE prompt) and A7 list the ten items with the "
                    "largest model-minus-human rank gap each way, e.g. on GE: Fingering (sexual "
                    "act), Erection, Black people, ... and Fully Automated Luxury Communism, "
                    "Johan Cruyff, ...", (ok if parts else None),
                    summary, files)


def _short(prompt: str) -> str:
    return {GE: "GE", HP: "HP", GW: "GW"}.get(prompt, prompt[:24])


def _tag(prompt: str) -> str:
    """A prompt's short name as a file-name part (letters, digits, _)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", _short(prompt)).strip("_") or "prompt"


# ---------------------------------------------------------------- Fig. 5C Spearman table
def _spearman(res, styles: Styles, out_dir: Path) -> dict:
    corr = res.correlations.assign(nickname=lambda d: d["model"].map(styles.label))
    files = [_write(out_dir, "A-fig5c_spearman.csv", corr)]
    for p in pd.unique(res.trajectories["prompt"]):
        fig = rank_trajectories(res.trajectories, res.correlations, styles, p)
        ax = fig.axes[0]  # the figure's own title line would run into its key: head the axes' title
        n = res.correlations.loc[res.correlations["prompt"] == p, "n"]
        ax.set_title("Paper A Fig. 5C: human and reward-model ranks of the same items (x labels: "
                     f"each model's Spearman ρ with human Elo, n = {int(n.max()):,} items)\n" + ax.get_title(),
                     fontsize=10)
        files.append(_write(out_dir, f"A-fig5c_rank_trajectories_{_tag(p)}.png", fig))
    ge = corr[corr["prompt"] == GE]["spearman_rho"]
    if ge.empty:
        return _finding("A-fig5c", "Spearman rho of each model with human Elo (Fig. 5C)",
                        "rho roughly 0.29–0.54 on GE", None, "GE prompt not in the data", files)
    lo, hi = round(float(ge.min()), 2), round(float(ge.max()), 2)
    ok = (lo, hi) == PAPER_SPEARMAN_RANGE
    n = corr.loc[corr["prompt"] == GE, "n"]
    n_txt = f"n = {int(n.min()):,} items" if n.min() == n.max() else f"n = {int(n.min()):,}–{int(n.max()):,} items"
    return _finding("A-fig5c", "Spearman rho of each model with human Elo (Fig. 5C)",
                    "Fig. 5C: each reward model's Spearman rho with human Elo on GE lies "
                    "between 0.29 and 0.54", ok, f"Spearman rho between each model's scores and human "
                    f"Elo (positive: the model orders the items as humans do), GE: "
                    f"{lo:.2f}–{hi:.2f} over {len(ge)} models, {n_txt} each", files)


# ---------------------------------------------------------------- Fig. A5 and p-values
def _kendall_matrices(data, prompts) -> tuple[dict, pd.DataFrame]:
    """Per prompt: Kendall tau-b (and p) between every two of human Elo and the models, on
    the items all of them scored (Fig. A5's matrix: the paper drops rows with a NaN)."""
    from scipy.stats import kendalltau

    hs = data.human.set_index("text")["human_score"]
    mats, rows = {}, []
    for p in prompts:
        wide = data.scans[data.scans["prompt"] == p].pivot(index="text", columns="model",
                                                            values="score")
        wide.insert(0, HUMAN, hs.reindex(wide.index))
        wide = wide.dropna()
        cols = list(wide.columns)
        tau = pd.DataFrame(np.eye(len(cols)), index=cols, columns=cols)
        pv = pd.DataFrame(np.zeros((len(cols), len(cols))), index=cols, columns=cols)
        for i, a in enumerate(cols):
            for b in cols[i + 1:]:
                kt = kendalltau(wide[a], wide[b], variant="b")
                tau.loc[a, b] = tau.loc[b, a] = kt.statistic
                pv.loc[a, b] = pv.loc[b, a] = kt.pvalue
                rows.append({"prompt": p, "rater_a": a, "rater_b": b, "n": len(wide),
                             "kendall_tau_b": float(kt.statistic), "kendall_p": float(kt.pvalue)})
        mats[p] = (tau, pv)
    return mats, pd.DataFrame(rows)


def _human_model_tau(data, prompts, styles: Styles, out_dir: Path) -> tuple[dict, dict]:
    mats, pairs = _kendall_matrices(data, prompts)
    st = Styles.build([HUMAN] + styles.order, None)
    st.label.update(styles.label)
    st.order = [HUMAN] + styles.order
    files = [_write(out_dir, "A-figA5_kendall.csv", pairs)]
    colours = {st.label[m]: styles.color[m] for m in styles.order}
    n_items = pairs.groupby("prompt")["n"].first().to_dict()
    worst, n = 0.0, 0
    for k, p in enumerate(prompts):
        mat = mats[p][0].loc[st.order, st.order].rename(index=st.label, columns=st.label)
        files.append(_write(out_dir, f"A-figA5_kendall_{_tag(p)}.png", tau_heatmap(
            mat, colours, f"Paper A Fig. A5{'abc'[k] if k < 3 else ''}: Kendall τ-b between "
            f"human Elo and the reward models' scores of the EloEverything items; prompt: {p}",
            int(n_items[p]))))
        got = [mats[p][0].loc[HUMAN, m] for m in _by_nickname(styles)]
        if p in PAPER_A5_HUMAN and len(got) == len(PAPER_MODELS):
            worst = max(worst, float(np.max(np.abs(np.array(got) - PAPER_A5_HUMAN[p]))))
            n += len(got)
    ok = n > 0 and worst <= ROUNDING
    a5 = _finding("A-figA5", "Kendall tau among human Elo and the ten models (Fig. A5)",
                  "Fig. A5: tau of the models with human Elo is low: 0.20–0.38 (GE), 0.10–0.30 "
                  "(HP), 0.22–0.39 (GW), below most model–model values",
                  ok if n else None, "Kendall tau-b between human Elo and each model's scores "
                  f"(positive: same order), n = {', '.join(f'{int(v):,}' for v in sorted(set(n_items.values())))} "
                  f"items per prompt; " + "; ".join(_tau_range(pairs, p) for p in prompts) + f". {n} human–model "
                  f"values, largest difference from the published 2-decimal values {worst:.4f}",
                  files)
    p_mat = mats[prompts[0]][1].loc[st.order, st.order]
    human = pairs[(pairs["rater_a"] == HUMAN) | (pairs["rater_b"] == HUMAN)]
    n_sig = {k: int((v["kendall_p"] < 0.001).sum()) for k, v in
             (("human", human), ("model", pairs.drop(human.index)))}
    pfiles = [_write(out_dir, "A-pvalues_kendall.png", pvalue_heatmap(
        p_mat.rename(index=st.label, columns=st.label), "Significance of the Kendall τ-b "
        f"between every two raters (human Elo and the models); prompt: {prompts[0]}",
        int(n_items[prompts[0]])))]
    pv = _finding("A-pvalues", "Significance of the Kendall taus (p-value heatmap)",
                  "(the authors' code draws p-value heatmaps; no statement in the paper)", None,
                  f"{n_sig['human']} of {len(human)} human–model pairs and {n_sig['model']} of "
                  f"{len(pairs) - len(human)} model–model pairs (× {len(prompts)} prompts) have "
                  f"Kendall tau-b p < 0.001 (two-sided, n = {int(pairs['n'].iloc[0]):,} items; no "
                  "correction for the multiple tests; asymptotic p, no floor: the smallest attainable p is "
                  "~0)", pfiles)
    return a5, pv


def _tau_range(pairs: pd.DataFrame, prompt: str) -> str:
    h = pairs[(pairs["prompt"] == prompt) & ((pairs["rater_a"] == HUMAN) | (pairs["rater_b"] == HUMAN))]
    if h.empty:
        return f"{_short(prompt)}: none"
    return f"{_short(prompt)} {h['kendall_tau_b'].min():.2f}–{h['kendall_tau_b'].max():.2f}"


def _by_nickname(styles: Styles) -> list[str]:
    """The data's model names in the published panels' order (by paper nickname)."""
    inv = {v: k for k, v in styles.label.items()}
    return [inv[n] for n in PAPER_MODELS if n in inv]


# ---------------------------------------------------------------- Fig. A6
def _prompt_tau(data, styles: Styles, out_dir: Path) -> dict:
    res = prompt_agreement(data.scans)
    pairs = res.pairs.assign(nickname=lambda d: d["model"].map(styles.label))
    files = [_write(out_dir, "A-figA6_prompt_kendall.csv", pairs)]
    short = {GE: "GE", HP: "HP", GW: "GW"}
    mats = {styles.label[m]: res.matrix(m).rename(index=short, columns=short)
            for m in styles.order if m in set(res.pairs["model"])}
    files.append(_write(out_dir, "A-figA6_prompt_kendall.png", heatmap_grid(
        mats, "Paper A Fig. A6: Kendall τ-b between the prompts' rankings of the items, within each "
        "model. " + "; ".join(f"{short[p]}: {p}" for p in (GE, HP, GW)), ncols=5)))
    worst, n = 0.0, 0
    for nick, vals in PAPER_A6.items():
        if nick in mats and {"GE", "HP", "GW"} <= set(mats[nick].index):
            m = mats[nick]
            got = np.array([m.loc["GE", "HP"], m.loc["GE", "GW"], m.loc["HP", "GW"]])
            worst, n = max(worst, float(np.max(np.abs(got - vals)))), n + 3
    ok = n > 0 and worst <= ROUNDING
    nn = sorted(set(int(x) for x in res.pairs["n"])) if "n" in res.pairs else []
    return _finding("A-figA6", "Kendall tau between prompts within each model (Fig. A6)",
                    "Fig. A6: a model's rankings under two prompts agree only moderately, tau "
                    "0.36–0.68", ok if n else None, "Kendall tau-b between two prompts' scores of the same "
                    f"items within each model (positive: same order), n = {', '.join(f'{x:,}' for x in nn)} "
                    f"items; range {res.pairs['kendall_tau_b'].min():.2f}–{res.pairs['kendall_tau_b'].max():.2f}. "
                    f"{n} values, largest difference from the published ones {worst:.4f}", files)


# ---------------------------------------------------------------- method differences
def _methods(data, res: dict, prompts, data_dir: Path, out_dir: Path) -> dict:
    from scipy.stats import spearmanr

    rows = []
    for p in prompts:
        a, b = (res[m].ranks[res[m].ranks["prompt"] == p].set_index("text")["rank_diff"]
                for m in ("paper", "rmfast"))
        top = {m: res[m].differences[res[m].differences["prompt"] == p] for m in res}
        same = {d: len(set(top["paper"].loc[top["paper"]["direction"] == d, "text"])
                       & set(top["rmfast"].loc[top["rmfast"]["direction"] == d, "text"]))
                for d in ("humans rank higher", "models rank higher")}
        rows.append({"difference": "human vs model rank gap", "prompt": _short(p),
                     "measure": "top-10 overlap paper/rmfast (humans higher, models higher); "
                     "Spearman of the gaps over all items",
                     "value": f"{same['humans rank higher']}/10, {same['models rank higher']}"
                     f"/10; rho {spearmanr(a, b.reindex(a.index)).statistic:.3f}"})
    ag = {m: agreement(data.scans, prompts=[prompts[0]], n_perm=0, method=m) for m in res}
    for stat in ("rbo", "footrule"):
        x, y = ag["paper"].pairs[stat], ag["rmfast"].pairs[stat]
        rows.append({"difference": stat, "prompt": _short(prompts[0]),
                     "measure": "max |paper − rmfast| over model pairs; Spearman of the two",
                     "value": f"{float(np.max(np.abs(x - y))):.4f}; rho "
                     f"{spearmanr(x, y).statistic:.3f}"})
    rows.append(_ndcg_row(ag["paper"].pairs, ag["rmfast"].pairs, _short(prompts[0])))
    rows += _bnc_rows(data_dir / "lexicons")
    table = pd.DataFrame(rows)
    files = [_write(out_dir, "A-methods.csv", table)]
    return _finding("A-methods", "How far each paper-vs-rmfast method difference moves the "
                    "results", "(rmfast's own; see docs/paper_methods.md)", None,
                    f"{len(table)} measured differences; see A-methods.csv. NDCG ({_short(prompts[0])}): "
                    + table.loc[table["difference"] == "ndcg", "measure"].iloc[0] + ": "
                    + table.loc[table["difference"] == "ndcg", "value"].iloc[0], files)


def _ndcg_row(paper: pd.DataFrame, ours: pd.DataFrame, prompt: str) -> dict:
    """NDCG both ways, named: whose scores are the gains and whose order is ranked, the two baselines on the same
    scores, and the paper's undefined pairs counted (never 0.0)."""
    both = lambda t, c: np.r_[t[f"{c}_a_b"].to_numpy(), t[f"{c}_b_a"].to_numpy()]  # noqa: E731
    ours_v, rnd, rev = both(ours, "ndcg"), both(ours, "ndcg_random"), both(ours, "ndcg_reversed")
    pap = both(paper, "ndcg")
    undefined = int(np.isnan(pap).sum())
    over = int((pap[~np.isnan(pap)] > 1).sum())

    def rng(v):
        v = v[np.isfinite(v)]
        return f"{v.min():.3f}–{v.max():.3f}" if len(v) else "none"

    return {"difference": "ndcg", "prompt": prompt,
            "measure": ("NDCG of model b's order with model a's scores as gains (and a's order with b's gains), "
                        f"{len(ours_v)} ordered pairs over the shared items; rmfast: gains min-max scaled, ties "
                        "averaged; beside it, on the same gains, the expected NDCG of a random order and the NDCG "
                        "of the reversed order. Paper: raw scores as gains, undefined where the ideal DCG <= 0"),
            "value": (f"rmfast {rng(ours_v)} vs random order {rng(rnd)} and reversed order {rng(rev)}; paper's "
                      f"raw-gain NDCG undefined in {undefined}/{len(pap)} ordered pairs (ideal DCG <= 0), "
                      f"above 1 in {over}, defined values {rng(pap)}")}


def _bnc_rows(lex_dir: Path) -> list[dict]:
    """The BNC join difference on the lexicons: AFINN words with a frequency either way."""
    afinn, bnc = lex_dir / "AFINN-111.txt", lex_dir / "bnc_1_1_all_alpha.txt"
    if not (afinn.exists() and bnc.exists()):
        return []
    words = set(load_afinn(afinn)["word"])
    rows = load_bnc_rows(bnc).dropna()
    rows = rows[rows["frequency"] > 0]
    paper = rows[rows["word"].isin(words)]
    per_word = paper.groupby("word").size()
    ours = load_frequencies(bnc)
    ours = ours[ours["word"].isin(words) & (ours["frequency"] > 0)]
    return [{"difference": "BNC join (Fig. 3D)", "prompt": "",
             "measure": "AFINN words with a BNC frequency: paper (lemma rows) / rmfast (forms); "
             "words the paper fits more than once (one row per part of speech)",
             "value": f"{paper['word'].nunique()} / {len(ours)}; "
             f"{int((per_word > 1).sum())} words, {int(per_word[per_word > 1].sum())} rows"}]
