"""Agreement between models: rank correlations on the shared vocabulary, MDS and RSA.

Per prompt, models are joined on their shared vocabulary (:mod:`..data.shared_vocab`), then
for every pair: Kendall tau-b (``scipy.stats.kendalltau``), Spearman rho and
rank-biased overlap (p = 0.9 by default), Spearman's footrule similarity and NDCG both ways
(:mod:`..stats.rank_stats`). The models are mapped in 2-D by metric MDS of 1 − tau, and, with
metadata, the tau matrix is compared with metadata similarity matrices by RSA (:mod:`..stats.rsa`).

``method="paper"`` computes RBO, footrule and NDCG as paper A's ``analysis_support.py``:
RBO truncated at depth 132 (p = 0.9, threshold 1e-6) without extrapolation, each model's
items ranked by pandas' default sort over its rows in token-id order (the order its ties
come out in); footrule normalised by n²/2; NDCG's top-k ideal from the first k rows.
rmfast's default: extrapolated RBO over the full ranking (1 for identical rankings; ties
broken by the shared-vocabulary order), footrule by ⌊n²/2⌋, NDCG's ideal from the k best.
Kendall tau-b and Spearman are the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data import deps
from ..data.ledger import Ledger
from ..stats.mds import mds
from ..data.metadata import load_model_metadata, match_metadata
from ..data.methods import check_method
from ..stats.permutation import N_PERM
from ..stats.rank_stats import footrule, ndcg, ndcg_baselines, note_underflow, spearman_p
from ..stats.rbo import n_tied, paper_ranking, rbo, rbo_truncated
from ..data.results import Result
from ..stats.rsa import predictor_matrices, rsa_test
from ..data.scans import check_balance, select, validate_scans
from ..data.shared_vocab import shared_vocabulary

STATS = ("kendall_tau_b", "spearman_rho", "rbo", "footrule", "ndcg", "kendall_p",
         "spearman_p")


@dataclass(kw_only=True)
class AgreementResult(Result):
    """Tables (all tidy):

    pairs:      prompt, model_a, model_b, n_shared, kendall_tau_b, kendall_p,
                spearman_rho, spearman_p, rbo, footrule, ndcg_a_b, ndcg_b_a (one row per
                unordered pair, a before b; ndcg_a_b: a's scores as gains, b's order; NaN where
                undefined: the paper's raw gains with an ideal DCG <= 0), ndcg_random_a_b,
                ndcg_reversed_a_b, ndcg_random_b_a, ndcg_reversed_b_a (the same gains under a random
                order, its expectation, and under the reversed order: the scale to read NDCG on)
    mds:        prompt, model, x, y, stress1      (MDS of 1 − tau)
    rsa:        prompt, predictor, r, p_value, n_perm, exact, n_models, n_pairs
    vocabulary: prompt, model, rows, duplicated, not_shared, shared
    """

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    mds: pd.DataFrame = field(default_factory=pd.DataFrame)
    rsa: pd.DataFrame = field(default_factory=pd.DataFrame)
    vocabulary: pd.DataFrame = field(default_factory=pd.DataFrame)
    join: str = "text"
    rbo_p: float = 0.9
    method: str = "rmfast"

    def matrix(self, stat: str = "kendall_tau_b", prompt: str | None = None) -> pd.DataFrame:
        """Model × model matrix of ``stat`` for one prompt (diagonal: the value of a model
        with itself: 1, p-values 0). "ndcg" is not symmetric: row = gains, column = order.

        >>> x = np.arange(30.0)
        >>> d = pd.DataFrame({"model": np.repeat(["a", "b", "c"], 30), "prompt": "Best?",
        ...                   "text": [f"w{i}" for i in range(30)] * 3, "score": np.r_[x, x, -x]})
        >>> agreement(d, n_perm=0).matrix("spearman_rho", "Best?")
             a    b    c
        a  1.0  1.0 -1.0
        b  1.0  1.0 -1.0
        c -1.0 -1.0  1.0
        """
        if stat not in STATS:
            raise UserError(f"unknown agreement statistic {stat!r}; use one of {STATS}")
        prompts = list(dict.fromkeys(self.pairs["prompt"]))
        if prompt is None:
            if len(prompts) != 1:
                raise UserError(f"several prompts {prompts}; name one")
            prompt = prompts[0]
        if prompt not in prompts:
            raise UserError(f"prompt {prompt!r} not in the agreement results; have {prompts}")
        sub = self.pairs[self.pairs["prompt"] == prompt]
        models = list(dict.fromkeys(list(sub["model_a"]) + list(sub["model_b"])))
        diag = 0.0 if stat.endswith("_p") else 1.0
        mat = pd.DataFrame(np.eye(len(models)) * diag, index=models, columns=models)
        if stat == "ndcg":
            for a, b, ab, ba in sub[["model_a", "model_b", "ndcg_a_b", "ndcg_b_a"]].itertuples(
                    index=False):
                mat.loc[a, b], mat.loc[b, a] = ab, ba
            return mat
        for a, b, v in sub[["model_a", "model_b", stat]].itertuples(index=False):
            mat.loc[a, b] = mat.loc[b, a] = v
        return mat


def _spearman_matrix(values: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return np.corrcoef(rankdata(values, axis=0), rowvar=False)


def agreement(df: pd.DataFrame, *, join: str = "text", metadata=None, rbo_p: float = 0.9,
              n_perm: int = N_PERM, seed: int = 0, rsa_alternative: str = "greater",
              models=None, prompts=None, method: str = "rmfast") -> AgreementResult:
    """Pairwise Kendall tau-b, Spearman and RBO per prompt, MDS map, RSA with metadata.

    ``join`` is "text" (papers' rule) or "id" (token id and text must both match);
    ``metadata`` a path or frame for :func:`~rmfast.analysis.data.metadata.load_model_metadata`.
    ``method``: "rmfast" or "paper" (RBO, footrule, NDCG as paper A's code; module docstring).

    >>> rng = np.random.default_rng(0); base = rng.normal(size=200)
    >>> d = pd.concat([pd.DataFrame({"model": m, "prompt": "p", "text": [str(i) for i in range(200)],
    ...     "score": base + s * rng.normal(size=200)}) for m, s in [("a", .1), ("b", .1), ("c", 9)]])
    >>> res = agreement(d, n_perm=100)
    >>> bool(res.matrix().loc["a", "b"] > res.matrix().loc["a", "c"])
    True
    """
    check_method(method)
    stats = deps.stats()
    ledger = Ledger()
    df = select(validate_scans(df, ledger=ledger), models=models, prompts=prompts)
    check_balance(df, ledger)
    meta = None
    if metadata is not None:
        meta = load_model_metadata(metadata)
    pair_rows, mds_rows, rsa_rows, vocab = [], [], [], []
    for prompt in pd.unique(df["prompt"]):
        n_models = df.loc[df["prompt"] == prompt, "model"].nunique()
        if n_models < 2:
            ledger.note(f"prompt {prompt!r} has one model; no agreement to compute")
            continue
        sv = shared_vocabulary(df, prompt, on=join, ledger=ledger)
        vocab.append(sv.counts.assign(prompt=prompt))
        ms = list(sv.wide.columns)
        vals = sv.wide.to_numpy(dtype="float64")
        n = len(vals)
        if n < 3:
            ledger.note(f"prompt {prompt!r}: only {n} shared strings; correlations not computed")
            continue
        rho = _spearman_matrix(vals)
        tau = np.eye(len(ms))
        order = _paper_orders(df, prompt, ms, sv.wide.index, join) if method == "paper" else None
        for i in range(len(ms)):
            for j in range(i + 1, len(ms)):
                kt = stats.kendalltau(vals[:, i], vals[:, j], variant="b")
                tau[i, j] = tau[j, i] = kt.statistic
                pair_rows.append({"prompt": prompt, "model_a": ms[i], "model_b": ms[j],
                                  "n_shared": n, "kendall_tau_b": float(kt.statistic),
                                  "kendall_p": float(kt.pvalue),
                                  "spearman_rho": float(rho[i, j]),
                                  "spearman_p": spearman_p(vals[:, i], vals[:, j]),
                                  **_pair_stats(vals, i, j, order, rbo_p, method),
                                  "tied_a": n_tied(vals[:, i]), "tied_b": n_tied(vals[:, j])})
        if len(ms) >= 3 and not np.isnan(tau).any():
            fit = mds(1.0 - tau)
            for k, m in enumerate(ms):
                mds_rows.append({"prompt": prompt, "model": m, "x": fit.coords[k, 0],
                                 "y": fit.coords[k, 1], "stress1": fit.stress1})
        elif len(ms) < 3:
            ledger.note(f"prompt {prompt!r}: MDS needs at least 3 models, this prompt has {len(ms)}")
        else:
            ledger.note(f"prompt {prompt!r}: MDS not computed: a Kendall tau is undefined "
                        "(a model gives every shared string the same score)")
        if meta is not None:
            rsa_rows.extend(_rsa_rows(prompt, pd.DataFrame(tau, ms, ms), meta, ledger,
                                      n_perm=n_perm, seed=seed, alternative=rsa_alternative))
    if not pair_rows:
        raise UserError("no prompt has two models sharing at least 3 scored strings (the fewest a rank correlation "
                        "reads); scan the same --token-ids (or candidates) with each model")
    pairs = pd.DataFrame(pair_rows)
    note_underflow(pairs, ["kendall_p", "spearman_p"], ledger)
    tied = pairs[(pairs["tied_a"] > 0) | (pairs["tied_b"] > 0)]
    if len(tied):  # RBO reads a ranking: tied scores are ordered by the shared vocabulary's order, arbitrary
        order = "each model's own token-id order" if method == "paper" else "the shared vocabulary's order"
        ledger.note(f"{len(tied)} of {len(pairs)} pairs rank tied scores (up to {int(tied[['tied_a', 'tied_b']].max().max()):,} "
                    f"shared strings of one model share a score): their RBO breaks the ties in {order}, which can "
                    "move it in the second decimal; tied_a/tied_b count them")
    res = AgreementResult(
        pairs=pairs,
        mds=pd.DataFrame(mds_rows, columns=["prompt", "model", "x", "y", "stress1"]),
        rsa=pd.DataFrame(rsa_rows, columns=["prompt", "predictor", "r", "p_value", "n_perm",
                                            "exact", "seed", "n_models", "n_pairs"]).assign(alternative=rsa_alternative),
        vocabulary=pd.concat(vocab, ignore_index=True)[
            ["prompt", "model", "rows", "duplicated", "not_shared", "shared"]],
        join=join, rbo_p=rbo_p, method=method)
    if meta is None:
        ledger.note("no model metadata given: RSA not run (pass metadata= / --metadata)")
    elif rsa_rows:
        sides = "two-sided" if rsa_alternative == "two-sided" else f"one-sided ({rsa_alternative})"
        ledger.note(f"RSA p-values: {sides}, each test alone: {len(rsa_rows)} tests (predictors × prompts), "
                    "no correction over them")
    res.take_ledger(ledger)
    return res


def _paper_orders(df: pd.DataFrame, prompt: str, models: list[str], keys: pd.Index,
                  join: str) -> list[np.ndarray]:
    """Per model: positions of the shared rows in that model's own row order, sorted by
    token id when every row has one (the paper's per-model order, which decides ties)."""
    out = []
    pos = pd.Series(np.arange(len(keys)), index=keys)
    for m in models:
        sub = df[(df["prompt"] == prompt) & (df["model"] == m)]
        if sub["token_id"].notna().all():
            sub = sub.sort_values("token_id", kind="stable")
        k = sub["text"] if join == "text" else (sub["token_id"].astype("int64").astype(str)
                                                 + ":" + sub["text"])
        out.append(pos.reindex(k.to_numpy()).dropna().astype("int64").to_numpy())
    return out


def _pair_stats(vals: np.ndarray, i: int, j: int, order, rbo_p: float, method: str) -> dict:
    """RBO, footrule and NDCG both ways for models i, j (columns of ``vals``)."""
    if method == "paper":  # each model ranks its own rows; NDCG runs in model a's row order
        oi, oj = order[i], order[j]
        ra = paper_ranking(vals[oi, i], oi)
        rb = paper_ranking(vals[oj, j], oj)
        return {"rbo": rbo_truncated(ra, rb, p=rbo_p),
                "footrule": footrule(vals[:, i], vals[:, j], method="paper"),
                "ndcg_a_b": ndcg(vals[oi, i], vals[oi, j], method="paper"),
                "ndcg_b_a": ndcg(vals[oj, j], vals[oj, i], method="paper"),
                **_baselines(vals[oi, i], vals[oj, j], "paper")}
    return {"rbo": rbo(vals[:, i], vals[:, j], p=rbo_p),
            "footrule": footrule(vals[:, i], vals[:, j]),
            "ndcg_a_b": ndcg(vals[:, i], vals[:, j]), "ndcg_b_a": ndcg(vals[:, j], vals[:, i]),
            **_baselines(vals[:, i], vals[:, j], "rmfast")}


def _baselines(gains_a, gains_b, method: str) -> dict:
    """NDCG of a random order (its expectation) and of the reversed order, on the same gains, both ways."""
    a, b = ndcg_baselines(gains_a, method=method), ndcg_baselines(gains_b, method=method)
    return {"ndcg_random_a_b": a["random"], "ndcg_reversed_a_b": a["reversed"],
            "ndcg_random_b_a": b["random"], "ndcg_reversed_b_a": b["reversed"]}


def _rsa_undefined(observed: pd.DataFrame, predictor: pd.DataFrame) -> str:
    """Why an RSA correlation is undefined: the models whose agreement is NaN (constant or NaN scores), else which
    matrix is constant."""
    o = observed.to_numpy(dtype="float64")
    bad = [m for m, row in zip(observed.index, o) if np.isnan(np.delete(row, list(observed.index).index(m))).any()]
    if bad:
        worst = sorted(bad, key=lambda m: -int(np.isnan(observed.loc[m].drop(m).to_numpy(dtype="float64")).sum()))
        return f"the agreement of {', '.join(map(str, worst[:3]))} with other models is NaN (constant or NaN scores)"
    return "the predictor is constant over the models" if np.ptp(predictor.to_numpy(dtype="float64")) == 0 else \
        "the agreement is equal for every pair of models"


def _rsa_rows(prompt, tau: pd.DataFrame, meta, ledger, **kw) -> list[dict]:
    matched, unmatched = match_metadata(list(tau.index), meta)
    if unmatched:
        ledger.note(f"RSA: no metadata for model(s) {unmatched}; they are left out of the RSA")
    ms = list(matched.index)
    if len(ms) < 4:
        ledger.note(f"RSA for {prompt!r}: {len(ms)} models with metadata; needs at least 4")
        return []
    preds = predictor_matrices(matched)
    rows = []
    for name, mat in preds.items():
        out = rsa_test(tau.loc[ms, ms], mat, **kw)
        if np.isnan(out["r"]):
            ledger.note(f"RSA {name} for {prompt!r}: {_rsa_undefined(tau.loc[ms, ms], mat)}; no correlation, no p")
        rows.append({"prompt": prompt, "predictor": name, **out})
    return rows
