"""Dictionary categories (Paper B): do model groups prefer different kinds of words?

1. Each dictionary word is found among the scored texts (stripped, lower-cased; several
   tokens with the same word are combined by ``word_agg``) and ranked within model ×
   prompt (1 = best): among the matched words (``rank_within="matched"``, as when the
   dictionary itself was scored) or among everything scored (``"all"``).
2. The unit of analysis is the median rank per category per model × prompt.
3. Groups of models (e.g. base family Gemma vs Llama) are compared per category (and
   framing) by a permutation test on the models' mean median rank: Welch t, group labels
   permuted over models (exactly when few), two-sided, Bonferroni over the category × framing panels (the
   paper's family: ×4 Big Two, ×10 MFD); with both framings, also per category both pooled with the
   framing's sign (:data:`POOLED`: each model's mean over positive prompts − over negative ones, since on a
   "worst" prompt ranking a word higher disfavours it), an exploratory addition chosen after the data and
   corrected as its own family (``method="rmfast"``, the default). ``min_p`` says the smallest p each test can
   reach (1/210 for 4 vs 6 models). ``method="paper"`` is paper B's test instead: R's
   ``MKinfer::perm.t.test`` per category × framing panel over ALL model × prompt medians
   (~270 rows per panel), reporting its parametric Welch p as the paper's script does (the
   permutation p beside it), Bonferroni over the panels. rmfast's is the default because the
   prompts of one model are not independent replicates: the paper's test counts each model
   ~27 times and so overstates the evidence (see docs/paper_methods_b.md).
4. A linear mixed model ``median_rank ~ group * category * framing`` with a random
   intercept per model: rmfast's (statsmodels' coding, every factor's first sorted level as
   reference; t with nlme's containment df as the paper's, the Wald z beside it as ``p_z``) or,
   with ``method="paper"``, the paper's exactly
   (:func:`~.mixed_model.paper_mixed`: positive framing as reference, nlme's t and df). The
   table's ``test`` and ``reference`` columns say which.

``method="paper"`` also ranks as the authors' R script does: over the rows of the word ×
category join within model × prompt (a word listed under k categories is ranked k times), and
merges MFD 2.0's ``<Foundation>_Virtue`` / ``<Foundation>_Vice`` categories into the five
foundations (``virtue_vice="merge"``; ``"keep"`` keeps the ten) after ranking, as the script
does.

Every number is named by its statistic (:data:`STATISTICS`): the ``summaries`` table gives, per
framing × category × group, the three summaries that differ on paper B's data (positive
framing, Agency, Llama − Gemma: −4.17 / −5.81 / −4.21 ranks).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data import deps
from ..data.framing import NEGATIVE, POSITIVE, framing_map
from ..data.ledger import Ledger
from ..data.lexicons import as_dictionary, dictionary_notes, match_dictionary, normalize_word
from ..data.metadata import load_model_metadata, match_metadata, model_families
from .mixed_model import containment_df, paper_mixed
from ..stats.permutation import N_PERM, bonferroni, mkinfer_perm_t_test, no_test_why, permutation_test
from ..data.results import Result
from ..data.scans import check_balance, select, validate_scans

#: The group summaries of median ranks, by the key the tables' ``statistic`` column holds; the
#: ``meaning`` column spells each out.
STATISTICS = {
    "mean_of_model_prompt_medians": "mean over the model × prompt rows of the median rank over "
    "the category's words (paper B's permutation test and Fig. 1 black diamond)",
    "mean_of_model_medians_over_prompts": "mean over models of each model's median over prompts "
    "of its median ranks over words",
    "r_avg_ranks": "mean over models of each model's median over all its word × prompt ranks "
    "(the computation of the R script's 'avg ranks' block, which it runs for the Big Two; "
    "applied the same way to any dictionary)",
    "mean_of_model_means": "mean over models of each model's mean over prompts of its median "
    "ranks over words (rmfast's models-as-units test)",
}
#: The statistics of rmfast's exploratory pooled tests (the permutation table's ``statistic`` on its pooled rows;
#: not group summaries of one framing, so not in the summaries table).
POOLED_STATISTICS = {
    "mean_of_model_framing_differences": "mean over models of each model's (mean over positive prompts − mean over "
    "negative prompts) of its median ranks over words: a mean of within-model differences (the pooled rows of "
    "rmfast's test; not a mean of model means)",
    "mean_of_model_category_contrasts": "mean over models of each model's signed pool (positive − negative) of "
    "the second category minus that of the first (e.g. Communion − Agency): a within-model contrast, free of how "
    "far each model's whole ranking moves between positive and negative prompts",
}
#: What the medians table's ``median_rank`` is.
MEDIAN_STATISTIC = "median over the category's words of their ranks (1 = best)"


def diff_name(group_a, group_b) -> str:
    """The name of the column holding ``group_b − group_a``: its direction, spelled out.

    >>> diff_name("Gemma", "Llama")
    'llama_minus_gemma'
    """
    def slug(g) -> str:
        return re.sub(r"[^0-9a-z]+", "_", str(g).lower()).strip("_") or "group"

    return f"{slug(group_b)}_minus_{slug(group_a)}"


def diff_column(table: pd.DataFrame) -> str:
    """The difference column of a permutation or summaries table (``<b>_minus_<a>``)."""
    return next(c for c in table.columns if "_minus_" in c)


def _name_diff(table: pd.DataFrame) -> pd.DataFrame:
    """Rename ``diff`` (``value_b − value_a``) after its direction: ``llama_minus_gemma`` when the
    table compares one pair of groups, ``b_minus_a`` when it compares several."""
    pairs = table[["group_a", "group_b"]].drop_duplicates() if len(table) else table
    name = diff_name(*pairs.iloc[0]) if len(pairs) == 1 else "b_minus_a"
    return table.rename(columns={"diff": name})


_VV = re.compile(r"^(?P<f>.+?)[ _.-](virtue|vice)$", re.I)


def merge_virtue_vice(categories) -> dict[str, str]:
    """Reported category per dictionary category: ``<Foundation>_Virtue``/``_Vice`` → the
    foundation (as paper B's script: ``sub("_.*", "", category)``), others unchanged.

    >>> merge_virtue_vice(["Care_Virtue", "Care_Vice", "Agency"])
    {'Care_Virtue': 'Care', 'Care_Vice': 'Care', 'Agency': 'Agency'}
    """
    out = {}
    for c in categories:
        m = _VV.match(str(c))
        out[c] = m.group("f") if m else c
    return out


@dataclass(kw_only=True)
class CategoryResult(Result):
    """Tables:

    medians:     model, group, prompt, framing, category, n_words, median_rank,
                 median_rank_pct (median of rank / words ranked), statistic (what median_rank is)
    permutation: [family,] framing, category, group_a, group_b, n_a, n_b, statistic, mean_a, mean_b,
                 <b>_minus_<a> (mean_b − mean_a, e.g. llama_minus_gemma), t (Welch t of b − a:
                 the same sign), p_value, p_bonferroni, [min_p, min_p_bonferroni: the smallest p
                 the test can give, raw and after its family's correction,] n_perm, exact, test,
                 correction. method="rmfast": ``family`` is :data:`FAMILY_PANELS` (the paper's
                 category × framing panels, Bonferroni over them: ×4 Big Two, ×10 MFD) or
                 :data:`FAMILY_POOLED` (the signed pooled rows, rmfast's exploratory addition,
                 corrected apart; their statistic is ``mean_of_model_framing_differences``)
                 (method="paper" adds df, perm_p_value, perm_p_bonferroni; its p_value is the
                 Welch p)
    mixed:       method="rmfast": term, meaning (what the treatment-coded term is: a contrast at the
                 reference levels of the factors it leaves out, not a main effect), coef, se, z,
                 p_value, ci_low, ci_high, test, reference;
                 method="paper": :func:`~.mixed_model.paper_mixed`'s table (the paper's model)
    summaries:   framing, category, statistic, meaning, group_a, group_b, value_a, value_b,
                 <b>_minus_<a> (value_b − value_a), n_models_a, n_models_b
                 (statistics: :data:`STATISTICS`)

    One direction everywhere: every difference and t is the second group minus the first
    (groups in sorted order: Llama − Gemma), and its column says so.
    words:       model, prompt, word, category, score, rank, n_ranked

    The permutation table's ``statistic`` column names what mean_a/mean_b are.
    """

    medians: pd.DataFrame = field(default_factory=pd.DataFrame)
    permutation: pd.DataFrame = field(default_factory=pd.DataFrame)
    mixed: pd.DataFrame = field(default_factory=pd.DataFrame)
    summaries: pd.DataFrame = field(default_factory=pd.DataFrame)
    words: pd.DataFrame = field(default_factory=pd.DataFrame)
    measure: str = "median_rank"


def _groups(models, group_by, metadata) -> dict[str, str]:
    if isinstance(group_by, dict):
        missing = [m for m in models if m not in group_by]
        if missing:
            raise UserError(f"group mapping lacks model(s) {missing}; give every model a group")
        return {m: str(group_by[m]) for m in models}
    meta = load_model_metadata(metadata) if metadata is not None else None
    if group_by in (None, "base_family"):
        return model_families(models, meta)
    if meta is None:
        raise UserError(f"grouping by {group_by!r} needs model metadata (--metadata)")
    matched, unmatched = match_metadata(models, meta)
    if unmatched:
        raise UserError(f"no metadata for model(s) {unmatched}; add them to the metadata file")
    if group_by not in matched.columns:
        raise UserError(f"metadata has no column {group_by!r}; have {list(matched.columns)}")
    return {m: str(matched.loc[m, group_by]) for m in models}


def _check_options(rank_within, word_agg, method, virtue_vice, measure) -> str:
    """Validate :func:`categories`' options; returns ``virtue_vice`` with its default filled in."""
    if rank_within not in ("matched", "all"):
        raise UserError(f"rank_within={rank_within!r}; use 'matched' or 'all'")
    if word_agg not in ("mean", "max", "first"):
        raise UserError(f"word_agg={word_agg!r}; use mean, max or first")
    if method not in ("rmfast", "paper"):
        raise UserError(f"method={method!r}; use 'rmfast' (models as units) or 'paper' "
                        "(paper B's test over every model × prompt)")
    if virtue_vice is None:
        virtue_vice = "merge" if method == "paper" else "keep"
    if virtue_vice not in ("merge", "keep"):
        raise UserError(f"virtue_vice={virtue_vice!r}; use 'merge' (five foundations) or 'keep'")
    if measure not in ("median_rank", "median_rank_pct"):
        raise UserError(f"measure={measure!r}; use median_rank or median_rank_pct")
    return virtue_vice


def _rank_words(words, df, cats, method, rank_within, ledger) -> pd.DataFrame:
    """Each matched word's rank among its model × prompt's rows (the matched words, or all rows), joined
    to its categories: the authors' ranking over the word × category join for ``method="paper"``."""
    if method == "paper" and rank_within == "matched":
        # the authors' script ranks the rows of the word × category join (R: rank(-score))
        words = words.merge(cats, on="word")
        g = words.groupby(["model", "prompt"], sort=False)["score"]
        words["rank"] = g.rank(ascending=False, method="average")
        words["n_ranked"] = g.transform("size")
        multi = int((cats.groupby("word").size() > 1).sum())
        if multi:
            ledger.note(f"method='paper': {multi} words are listed under several categories and "
                        "are ranked once per category, as the authors' script does")
    elif rank_within == "matched":
        g = words.groupby(["model", "prompt"], sort=False)["score"]
        words["rank"] = g.rank(ascending=False, method="average")
        words["n_ranked"] = g.transform("size")
        words = words.merge(cats, on="word")
    else:
        ranks, totals = [], []
        full = {k: np.sort(g["score"].to_numpy()) for k, g in df.groupby(["model", "prompt"])}
        for m, p, s in words[["model", "prompt", "score"]].itertuples(index=False):
            arr = full[(m, p)]
            hi, lo = np.searchsorted(arr, s, side="right"), np.searchsorted(arr, s, side="left")
            ranks.append(1 + len(arr) - hi + (max(hi - lo, 1) - 1) / 2)  # ties: their average rank, as "matched"
            totals.append(len(arr))
        words["rank"] = np.asarray(ranks, dtype="float64")
        words["n_ranked"] = totals
        words = words.merge(cats, on="word")
    return words


def categories(df: pd.DataFrame, dictionary, *, group_by="base_family", metadata=None,
               rank_within: str = "matched", word_agg: str = "mean", measure: str = "median_rank",
               framing=None, n_perm: int = N_PERM, seed: int = 0, mixed: bool = True,
               models=None, prompts=None, method: str = "rmfast",
               virtue_vice: str | None = None) -> CategoryResult:
    """Median rank per dictionary category per model × prompt; group tests; mixed model.

    ``dictionary``: a path (CSV, .dicx, LIWC .dic) or a frame (term, category, wildcard).
    ``group_by``: "base_family" (metadata, else guessed from the name), another metadata
    column, or a {model: group} mapping. ``method``: the group test, "rmfast" (default;
    models are the units) or "paper" (paper B's, over all model × prompt rows, with its
    ranking; see above). ``virtue_vice``: "merge" MFD-style ``X_Virtue``/``X_Vice`` categories
    into X, or "keep" them (default: merge for ``method="paper"``, keep for rmfast).

    >>> words = ["kind", "warm", "bold", "brave"]
    >>> dic = pd.DataFrame({"term": words, "category": ["C", "C", "A", "A"], "wildcard": False})
    >>> d = pd.DataFrame({"model": "m", "prompt": "best?", "text": words,
    ...                   "score": [4.0, 3.0, 2.0, 1.0]})
    >>> med = categories(d, dic, mixed=False).medians
    >>> sorted(med.set_index("category")["median_rank"].items())
    [('A', 3.5), ('C', 1.5)]
    """
    virtue_vice = _check_options(rank_within, word_agg, method, virtue_vice, measure)
    ledger = Ledger()
    dic = as_dictionary(dictionary)
    for n in dictionary_notes(dic):
        ledger.note(n)
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    frame = framing_map(df["prompt"].unique(), framing)
    groups = _groups(list(pd.unique(df["model"])), group_by, metadata)
    df = df.assign(word=df["text"].map(normalize_word))
    cats = match_dictionary(df["word"], dic)
    hit = df["word"].isin(set(cats["word"]))
    if not hit.any():
        raise UserError(f"no scored text is a word of the dictionary ({dic['term'].nunique()} terms, categories "
                        f"{', '.join(map(str, pd.unique(dic['category'])[:6]))}); is it the dictionary these scans "
                        "scored? (a scan of the vocabulary holds single tokens: --candidates scores its words)")
    for (m, p), n in df[~hit].groupby(["model", "prompt"], sort=False).size().items():
        ledger.drop("dictionary match", n, "text is not a dictionary word", model=m, prompt=p)
    if (~hit).any():  # the words themselves: "1,080 rows left out" beside "1,080 rows written" had read as a fault
        other = sorted(pd.unique(df.loc[~hit, "text"].astype(str)))
        ledger.note(f"{len(other):,} scored text(s) are not words of the dictionary, left out in every model × prompt "
                    f"they were scored in: {', '.join(map(repr, other[:5]))}{' ...' if len(other) > 5 else ''}")
    gone = [m for m in pd.unique(df["model"]) if not hit[df["model"] == m].any()]
    if gone:  # a whole model left out: named, not only counted among the dropped rows
        ledger.note(f"left out: {', '.join(map(str, gone))}: no scored text of {'it' if len(gone) == 1 else 'theirs'} is a "
                    "dictionary word (a vocabulary scan holds single tokens: --candidates scores the dictionary's words)")
    _coverage_notes(cats, dic, ledger)
    words = df[hit]
    agg = {"mean": "mean", "max": "max", "first": "first"}[word_agg]
    n_before = len(words)
    words = words.groupby(["model", "prompt", "word"], sort=False, as_index=False)["score"].agg(agg)
    if len(words) < n_before:
        ledger.note(f"{n_before - len(words)} rows were variants of a word already seen "
                    f"(e.g. ' Love' and 'love'); combined per word by {word_agg}")
    words = _rank_words(words, df, cats, method, rank_within, ledger)
    if virtue_vice == "merge":
        to = merge_virtue_vice(pd.unique(words["category"]))
        if any(k != v for k, v in to.items()):
            words["category"] = words["category"].map(to)
            if method != "paper":  # one row per word and reported category
                words = words.drop_duplicates(["model", "prompt", "word", "category"])
            ledger.note(f"{sum(k != v for k, v in to.items())} Virtue/Vice categories merged into "
                        f"{len(set(v for k, v in to.items() if k != v))} foundations "
                        f"({', '.join(sorted(set(v for k, v in to.items() if k != v)))}); "
                        "virtue_vice='keep' keeps them apart")
    words["rank_pct"] = words["rank"] / words["n_ranked"]
    med = (words.groupby(["model", "prompt", "category"], sort=False)
           .agg(n_words=("word", "size"), median_rank=("rank", "median"),
                median_rank_pct=("rank_pct", "median")).reset_index())
    med["group"] = med["model"].map(groups)
    med["framing"] = med["prompt"].map(frame)
    med = med[["model", "prompt", "category", "median_rank", "framing", "group", "n_words",
               "median_rank_pct"]].assign(statistic=MEDIAN_STATISTIC)
    res = CategoryResult(medians=med, words=words[["model", "prompt", "word", "category",
                                                   "score", "rank", "n_ranked"]],
                         measure=measure)
    tests = _permutations if method == "rmfast" else _permutations_paper
    res.permutation = tests(med, measure, n_perm, seed, ledger)
    res.summaries = group_summaries(med, res.words.assign(framing=res.words["prompt"].map(frame),
                                                          group=res.words["model"].map(groups)),
                                    measure)
    fit = _mixed if method == "rmfast" else _mixed_paper
    res.mixed = fit(med, measure, ledger) if mixed else pd.DataFrame()
    res.take_ledger(ledger)
    return res


#: a category whose scans hold fewer of its dictionary's words than this (count, or share) is named in a note: its
#: medians and tests rest on those few (a dictionary of other words matched 2 of 104 Agency words, tested at p 1e-8)
FEW_WORDS, FEW_SHARE = 10, 0.25


def _coverage_notes(cats: pd.DataFrame, dic: pd.DataFrame, ledger) -> None:
    """A note per category with few of its dictionary's words in the scans (:data:`FEW_WORDS`, :data:`FEW_SHARE`)."""
    found = cats.groupby("category")["word"].nunique()
    for cat, n_terms in dic.groupby("category")["term"].nunique().items():
        n = int(found.get(cat, 0))
        if n < FEW_WORDS or n < FEW_SHARE * n_terms:
            ledger.note(f"category {cat}: {n} of its {n_terms} dictionary words are in the scans; its medians and "
                        f"tests rest on those {n}")


#: the group test of both framings pooled (a row per category): a preference is signed by the framing, so a model's
#: value is its mean over positive prompts minus its mean over negative prompts (lower rank = ranked higher: on "worst"
#: prompts ranking a word higher disfavours it). rmfast's EXPLORATORY addition, chosen after the data (the unsigned
#: pool gave Big Two Communion p 0.72, the signed one 2/210; review 48d): it is its own Bonferroni family
#: (:data:`FAMILY_POOLED`), apart from the paper's category × framing panels (:data:`FAMILY_PANELS`), so it neither
#: enlarges nor penalises the paper's family. It also carries how far each model's ranking moves between positive
#: and negative prompts, which differs by base model.
POOLED = "positive − negative"
POOLED_UNIT = " (each model's mean over positive prompts − its mean over negative prompts)"
#: The family of the paper's own tests: one per category × framing panel, Bonferroni over the panels (×4 Big Two,
#: ×10 MFD 2.0's five foundations), as paper B corrects them.
FAMILY_PANELS = "paper's panels (category × framing)"
#: The family of the signed pooled tests: rmfast's exploratory addition, chosen after seeing the data.
FAMILY_POOLED = ("rmfast's exploratory addition, chosen after the data: both framings pooled with the framing's "
                 "sign (positive − negative)")


def smallest_p(n_perm: int, exact: bool, m: int = 1, *, equal_groups: bool = False) -> float:
    """The smallest p a permutation test can give, times a Bonferroni factor ``m`` (capped at 1): ``1/C`` when every
    one of the C relabellings is enumerated (two-sided Welch t of two groups of different sizes: the observed split
    alone can reach |t|; ``2/C`` for equal groups, whose swapped split has the same |t|), ``1/(1 + n_perm)`` when
    they are drawn at random. With 4 vs 6 models C = 210: 0.0048,
    ×15 = 0.071, so a family of 15 cannot reach .05 whatever the data.

    >>> round(smallest_p(210, True, 15), 4), round(smallest_p(210, True, 4), 4)
    (0.0714, 0.019)
    """
    if not n_perm:
        return float("nan")
    return min(1.0, m * (2 if exact and equal_groups else 1) / (n_perm if exact else n_perm + 1))


def _signed_pool(med: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Per category × model: its mean ``measure`` over positive prompts − over negative prompts (a model without
    both framings in a category: left out of that category's test)."""
    m = med.groupby(["category", "model", "group", "framing"])[measure].mean().unstack("framing")
    return (m[POSITIVE] - m[NEGATIVE]).rename(measure).dropna().reset_index()


def _contrast_rows(med, measure, cats, group_names, n_perm, seed, ledger) -> list[dict]:
    """With two categories: the group test of each model's within-model contrast, its signed pool of the second
    category minus the first's (Big Two: Communion − Agency). A model whose whole ranking moves more between
    positive and negative prompts moves both categories' signed pools alike; the contrast removes that."""
    sp = _signed_pool(med, measure).pivot(index=["model", "group"], columns="category", values=measure)
    sp = (sp[cats[1]] - sp[cats[0]]).dropna().reset_index(name=measure)
    rows = []
    for ga, gb in combinations(group_names, 2):
        g2 = sp[sp["group"].isin([ga, gb])]
        in_b = (g2["group"] == gb).to_numpy()
        vals = g2[measure].to_numpy()
        out = permutation_test(vals, in_b, n_perm=n_perm, seed=seed)
        if np.isnan(out["t"]):
            ledger.note(f"group test {ga} vs {gb} ({cats[1]} − {cats[0]}, pooled): " + no_test_why(vals, in_b))
        how = (f"every one of the {out['n_perm']:,} relabellings" if out["exact"]
               else f"{out['n_perm']:,} random relabellings")
        rows.append({"family": FAMILY_POOLED, "framing": POOLED, "category": f"{cats[1]} − {cats[0]}",
                     "group_a": ga, "group_b": gb, "n_a": int((~in_b).sum()), "n_b": int(in_b.sum()),
                     "mean_a": vals[~in_b].mean() if (~in_b).any() else np.nan,
                     "mean_b": vals[in_b].mean() if in_b.any() else np.nan, **out,
                     "statistic": "mean_of_model_category_contrasts",
                     "test": f"Welch t of {gb} − {ga} over models (each model's signed pool of {cats[1]} − that of "
                     f"{cats[0]}); permutation p (group labels permuted over models, {how}, two-sided)"})
    return rows


#: what the default mixed model's ``test`` column says
TEST = "t with nlme's containment df (p_value, ci); p_z: Wald z, the normal approximation (statsmodels)"


def _permutations(med, measure, n_perm, seed, ledger) -> pd.DataFrame:
    group_names = sorted(med["group"].unique())
    cols = ["family", "framing", "category", "group_a", "group_b", "n_a", "n_b", "statistic", "mean_a",
            "mean_b", "diff", "t", "p_value", "p_bonferroni", "min_p", "min_p_bonferroni", "n_perm", "exact",
            "test", "correction"]
    if len(group_names) < 2:
        ledger.note(f"all models are in one group ({group_names}); no group test")
        return _name_diff(pd.DataFrame(columns=cols))
    framings = list(pd.unique(med["framing"]))
    levels = (framings + [POOLED]) if {POSITIVE, NEGATIVE} <= set(framings) else framings
    rows = []
    for fr in levels:
        per_model = (_signed_pool(med, measure) if fr == POOLED else
                     med[med["framing"] == fr].groupby(["category", "model", "group"])[measure].mean().reset_index())
        for cat, g in per_model.groupby("category", sort=True):
            for ga, gb in combinations(group_names, 2):
                g2 = g[g["group"].isin([ga, gb])]
                in_b = (g2["group"] == gb).to_numpy()
                vals = g2[measure].to_numpy()
                out = permutation_test(vals, in_b, n_perm=n_perm, seed=seed)  # t of b − a
                if np.isnan(out["t"]):
                    ledger.note(f"group test {ga} vs {gb} ({cat}, {fr}): " + no_test_why(vals, in_b))
                how = (f"every one of the {out['n_perm']:,} relabellings" if out["exact"]
                       else f"{out['n_perm']:,} random relabellings")
                rows.append({"family": FAMILY_POOLED if fr == POOLED else FAMILY_PANELS,
                             "framing": fr, "category": cat, "group_a": ga, "group_b": gb,
                             "n_a": int((~in_b).sum()), "n_b": int(in_b.sum()),
                             "mean_a": vals[~in_b].mean() if (~in_b).any() else np.nan,
                             "mean_b": vals[in_b].mean() if in_b.any() else np.nan, **out,
                             "statistic": "mean_of_model_framing_differences" if fr == POOLED
                             else "mean_of_model_means",
                             "test": f"Welch t of {gb} − {ga} over models{POOLED_UNIT if fr == POOLED else ''}; "
                             f"permutation p (group labels permuted over models, {how}, two-sided)"})
    cats = sorted(med["category"].unique())
    if POOLED in levels and len(cats) == 2:
        rows += _contrast_rows(med, measure, cats, group_names, n_perm, seed, ledger)
    res = pd.DataFrame(rows)
    res["diff"] = res["mean_b"] - res["mean_a"]
    for fam, idx in res.groupby("family", sort=False).groups.items():
        m = int(res.loc[idx, "p_value"].notna().sum())
        res.loc[idx, "p_bonferroni"] = bonferroni(res.loc[idx, "p_value"], m)
        res.loc[idx, "correction"] = (f"Bonferroni ×{m} ({'the category × framing panels, as paper B' if fam == FAMILY_PANELS else 'the pooled tests only, apart from the panels'})")
        res.loc[idx, "min_p"] = [smallest_p(r.n_perm, r.exact, equal_groups=r.n_a == r.n_b)
                                 for r in res.loc[idx].itertuples()]
        res.loc[idx, "min_p_bonferroni"] = [smallest_p(r.n_perm, r.exact, m, equal_groups=r.n_a == r.n_b)
                                            for r in res.loc[idx].itertuples()]
    floor = res["min_p_bonferroni"].min()
    if floor > 0.05:  # e.g. --n-perm 1: every p is 0.5; said, not only in a column
        ledger.note(f"no test here can reach p < .05 after its correction: the smallest p these permutations allow is "
                    f"{floor:.3g} (min_p_bonferroni); raise --n-perm")
    return _name_diff(res[cols])


def _permutations_paper(med, measure, n_perm, seed, ledger) -> pd.DataFrame:
    """Paper B's tests: ``perm.t.test(median ~ group)`` per category × framing over all rows."""
    group_names = sorted(med["group"].unique())
    cols = ["framing", "category", "group_a", "group_b", "n_a", "n_b", "statistic", "mean_a",
            "mean_b", "diff", "t", "df", "p_value", "p_bonferroni", "perm_p_value", "perm_p_bonferroni",
            "n_perm", "exact", "test", "correction"]
    if len(group_names) != 2:  # R's formula interface needs exactly two levels
        ledger.note(f"method='paper' compares exactly two groups; have {group_names}")
        return _name_diff(pd.DataFrame(columns=cols))
    ga, gb = group_names  # R's factor levels are sorted: x = the first level
    ledger.note("method='paper': p_value is the parametric Welch p that paper B's script reports "
                "(perm.t.test(...)$p.value); perm_p_value is its Monte-Carlo permutation p "
                f"(R = {n_perm:,}, not R's random stream); t is of {gb} − {ga} (R prints "
                f"{ga} − {gb}: the same |t| and p)")
    rows = []
    for (fr, cat), g in med.groupby(["framing", "category"], sort=True):
        a = g.loc[g["group"] == ga, measure].to_numpy()
        b = g.loc[g["group"] == gb, measure].to_numpy()
        out = mkinfer_perm_t_test(b, a, R=n_perm, seed=seed)  # t of b − a: one sign everywhere
        if np.isnan(out["t"]):
            why = no_test_why(np.r_[a, b], np.arange(len(a) + len(b)) < len(a))
            ledger.note(f"group test {ga} vs {gb} ({cat}, {fr}): {why}")
        rows.append({"framing": fr, "category": cat, "group_a": ga, "group_b": gb,
                     "n_a": len(a), "n_b": len(b), "mean_a": a.mean() if len(a) else np.nan,
                     "mean_b": b.mean() if len(b) else np.nan, **out,
                     "test": f"Welch t of {gb} − {ga} over the {len(a) + len(b)} model × prompt "
                     "rows; p_value: its parametric p (MKinfer::perm.t.test $p.value, as paper B "
                     f"reports); perm_p_value: {out['n_perm']:,} permutations"})
    res = pd.DataFrame(rows)
    res["statistic"] = "mean_of_model_prompt_medians"
    res["diff"] = res["mean_b"] - res["mean_a"]
    res["p_bonferroni"] = bonferroni(res["p_value"], len(res))  # R: pmin(p * n(), 1)
    res["perm_p_bonferroni"] = bonferroni(res["perm_p_value"], len(res))
    res["correction"] = f"Bonferroni ×{len(res)}"
    return _name_diff(res[cols])


def group_summaries(med: pd.DataFrame, words: pd.DataFrame,
                    measure: str = "median_rank") -> pd.DataFrame:
    """The group summaries of :data:`STATISTICS` per framing × category, for every pair of
    groups: value_a, value_b and their difference value_b − value_a in a column named after its
    direction (:func:`diff_name`: ``llama_minus_gemma`` for Gemma vs Llama, the R script's ``diff``).

    ``med``: the medians table; ``words``: per-word ranks with model, prompt, category, rank,
    framing, group (``r_avg_ranks`` needs them; with ``measure="median_rank_pct"`` it uses
    rank / words ranked).
    """
    cols = ["framing", "category", "statistic", "meaning", "group_a", "group_b", "value_a",
            "value_b", "diff", "n_models_a", "n_models_b"]
    names = sorted(med["group"].dropna().unique())
    if len(names) < 2:
        return _name_diff(pd.DataFrame(columns=cols))
    per_model = {
        "mean_of_model_prompt_medians": None,
        "mean_of_model_medians_over_prompts": med.groupby(
            ["framing", "category", "group", "model"])[measure].median(),
        "r_avg_ranks": (words.assign(_r=words["rank"] if measure == "median_rank"
                                     else words["rank"] / words["n_ranked"])
                        .groupby(["framing", "category", "group", "model"])["_r"].median()),
        "mean_of_model_means": med.groupby(["framing", "category", "group", "model"])[
            measure].mean(),
    }
    rows = []
    for (fr, cat), g in med.groupby(["framing", "category"], sort=True):
        for stat, pm in per_model.items():
            val, n = {}, {}
            for grp in names:
                if pm is None:
                    v = g.loc[g["group"] == grp, measure]
                    val[grp], n[grp] = v.mean(), g.loc[g["group"] == grp, "model"].nunique()
                else:
                    try:
                        v = pm.loc[(fr, cat, grp)]
                    except KeyError:
                        v = pd.Series(dtype=float)
                    val[grp], n[grp] = v.mean(), len(v)
            for ga, gb in combinations(names, 2):
                rows.append({"framing": fr, "category": cat, "statistic": stat,
                             "meaning": STATISTICS[stat], "group_a": ga,
                             "group_b": gb, "value_a": val[ga], "value_b": val[gb],
                             "diff": val[gb] - val[ga], "n_models_a": n[ga],
                             "n_models_b": n[gb]})
    return _name_diff(pd.DataFrame(rows, columns=cols))


def _mixed_paper(med, measure, ledger) -> pd.DataFrame:
    """Paper B's mixed model (:func:`paper_mixed`: R's coding, nlme's t), or why it cannot be fitted."""
    need = {"group": 2, "category": 2, "framing": 2, "model": 3}
    short = [k for k, n in need.items() if med[k].nunique() < n]
    if short:
        ledger.note(f"mixed model (paper's) not fitted: too few levels of {', '.join(short)} "
                    "(needs 2 groups, 2 categories, both framings and 3 models)")
        return pd.DataFrame()
    try:
        out = paper_mixed(med, measure=measure)
    except (np.linalg.LinAlgError, ValueError) as exc:
        ledger.note(f"mixed model (paper's) failed: {str(exc).splitlines()[0]}")
        return pd.DataFrame()
    ledger.note(f"mixed model: the paper's lme({measure} ~ base_model*Category*prompt_framing, "
                f"random = ~1|model_id), REML, references {out['reference'].iloc[0]}, t-tests "
                f"with nlme's containment df ({med['model'].nunique()} models, {len(med)} rows)")
    return out


def _mixed(med, measure, ledger) -> pd.DataFrame:
    """rmfast's mixed model: statsmodels' own coding (every factor's first level in sorted order
    is its reference, so the framing's is *negative*), t-tests with nlme's containment df (the Wald
    z's p beside them, ``p_z``: it had been the p, 26x too small for the group term on the Big Two);
    :func:`paper_mixed` is the paper's (positive framing as reference)."""
    cols = ["term", "meaning", "coef", "se", "df", "t", "p_value", "p_z", "ci_low", "ci_high", "test", "reference"]
    terms = [t for t in ("group", "category", "framing") if med[t].nunique() > 1]
    for t in ("group", "category", "framing"):
        if t not in terms:
            ledger.note(f"mixed model: {t} has one level; the term is left out")
    if med["model"].nunique() < 3 or "category" not in terms:
        ledger.note("mixed model not fitted: needs at least 3 models and 2 categories")
        return pd.DataFrame(columns=cols)
    smf = deps.require("statsmodels.formula.api", "the mixed model")
    formula = f"{measure} ~ " + " * ".join(f"C({t})" for t in terms)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit = smf.mixedlm(formula, med, groups=med["model"]).fit(reml=True)
        except (np.linalg.LinAlgError, ValueError) as exc:
            ledger.note(f"mixed model {formula} failed: {exc}")
            return pd.DataFrame(columns=cols)
    for w in caught:
        ledger.note(f"mixed model warning: {str(w.message).splitlines()[0]}")
    names = [n for n in fit.fe_params.index]
    dfs = np.array(containment_df(fit)[0], dtype=float)
    coef, se = fit.fe_params[names].to_numpy(), fit.bse_fe[names].to_numpy()
    half = deps.require("scipy.stats", "the mixed model").t.ppf(0.975, dfs) * se
    refs = {t: sorted(med[t].unique())[0] for t in terms}

    def meaning(name: str) -> str:  # a treatment-coded term: a contrast at the reference of every factor it omits
        if name == "Intercept":
            return "the reference cell's mean (" + ", ".join(f"{t} {r}" for t, r in refs.items()) + ")"
        parts = re.findall(r"C\((\w+)\)\[T\.(.+?)\]", name)
        what = " × ".join(f"({lvl} − {refs[t]})" for t, lvl in parts)
        at = [f"{t} {refs[t]}" for t in terms if t not in {p for p, _ in parts}]
        return (what + (f" at the reference ({', '.join(at)})" if at else "")
                + ("; not a main effect" if at and len(parts) == 1 else ""))

    tdist = deps.require("scipy.stats", "the mixed model").t
    out = pd.DataFrame({"term": names, "meaning": [meaning(n) for n in names], "coef": coef, "se": se,
                        "df": dfs.astype(int), "t": coef / se, "p_value": 2 * tdist.sf(np.abs(coef / se), dfs),
                        "p_z": fit.pvalues[names].to_numpy(), "ci_low": coef - half, "ci_high": coef + half,
                        "test": TEST,
                        "reference": ", ".join(f"{t} {sorted(med[t].unique())[0]}" for t in terms)})
    ledger.note(f"mixed model: {formula}, random intercept per model ({med['model'].nunique()} "
                f"models, {len(med)} rows)")
    if "group" in terms:
        ledger.note("mixed model: a term with group AND category (or framing) is judged against each model's own "
                    "prompts as replicates (its df counts model × prompt rows), which assumes every model of a group "
                    "shares the group's preference; a per-model category slope widened its SE ~4x on paper B's Big "
                    "Two (docs/paper_methods_b.md, 'Three verdicts'): for those terms read the permutation table, "
                    "models as units")
    return out
