"""Agreement between models: rank correlations on the shared vocabulary, MDS and RSA.

Per prompt, models are joined on their shared vocabulary (:mod:`.shared_vocab`), then
for every pair: Kendall tau-b (``scipy.stats.kendalltau``), Spearman rho and
rank-biased overlap (p = 0.9 by default). The models are mapped in 2-D by metric MDS of
1 − tau, and, with metadata, the tau matrix is compared with metadata similarity
matrices by RSA (:mod:`.rsa`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import UserError
from . import deps
from .ledger import Ledger
from .mds import mds
from .metadata import load_model_metadata, match_metadata
from .rbo import rbo
from .results import Result
from .rsa import predictor_matrices, rsa_test
from .scans import check_balance, select, validate_scans
from .shared_vocab import shared_vocabulary

STATS = ("kendall_tau_b", "spearman_rho", "rbo")


@dataclass(kw_only=True)
class AgreementResult(Result):
    """Tables (all tidy):

    pairs:      prompt, model_a, model_b, n_shared, kendall_tau_b, kendall_p,
                spearman_rho, rbo   (one row per unordered pair, a before b)
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

    def matrix(self, stat: str = "kendall_tau_b", prompt: str | None = None) -> pd.DataFrame:
        """Symmetric model × model matrix of ``stat`` for one prompt (diagonal 1).

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
        mat = pd.DataFrame(np.eye(len(models)), index=models, columns=models)
        for a, b, v in sub[["model_a", "model_b", stat]].itertuples(index=False):
            mat.loc[a, b] = mat.loc[b, a] = v
        return mat


def _spearman_matrix(values: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return np.corrcoef(rankdata(values, axis=0), rowvar=False)


def agreement(df: pd.DataFrame, *, join: str = "text", metadata=None, rbo_p: float = 0.9,
              n_perm: int = 10_000, seed: int = 0, rsa_alternative: str = "greater",
              models=None, prompts=None) -> AgreementResult:
    """Pairwise Kendall tau-b, Spearman and RBO per prompt, MDS map, RSA with metadata.

    ``join`` is "text" (papers' rule) or "id" (token id and text must both match);
    ``metadata`` a path or frame for :func:`~rmfast.analysis.metadata.load_model_metadata`.

    >>> rng = np.random.default_rng(0); base = rng.normal(size=200)
    >>> d = pd.concat([pd.DataFrame({"model": m, "prompt": "p", "text": [str(i) for i in range(200)],
    ...     "score": base + s * rng.normal(size=200)}) for m, s in [("a", .1), ("b", .1), ("c", 9)]])
    >>> res = agreement(d, n_perm=100)
    >>> bool(res.matrix().loc["a", "b"] > res.matrix().loc["a", "c"])
    True
    """
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
        for i in range(len(ms)):
            for j in range(i + 1, len(ms)):
                kt = stats.kendalltau(vals[:, i], vals[:, j], variant="b")
                tau[i, j] = tau[j, i] = kt.statistic
                pair_rows.append({"prompt": prompt, "model_a": ms[i], "model_b": ms[j],
                                  "n_shared": n, "kendall_tau_b": float(kt.statistic),
                                  "kendall_p": float(kt.pvalue),
                                  "spearman_rho": float(rho[i, j]),
                                  "rbo": rbo(vals[:, i], vals[:, j], p=rbo_p)})
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
        raise UserError("no prompt has two models with shared strings; nothing to compare")
    res = AgreementResult(
        pairs=pd.DataFrame(pair_rows),
        mds=pd.DataFrame(mds_rows, columns=["prompt", "model", "x", "y", "stress1"]),
        rsa=pd.DataFrame(rsa_rows, columns=["prompt", "predictor", "r", "p_value", "n_perm",
                                            "exact", "n_models", "n_pairs"]),
        vocabulary=pd.concat(vocab, ignore_index=True)[
            ["prompt", "model", "rows", "duplicated", "not_shared", "shared"]],
        join=join, rbo_p=rbo_p)
    if meta is None:
        ledger.note("no model metadata given: RSA not run (pass metadata= / --metadata)")
    res.take_ledger(ledger)
    return res


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
            ledger.note(f"RSA {name} for {prompt!r}: predictor is constant over the models; "
                        "no correlation")
        rows.append({"prompt": prompt, "predictor": name, **out})
    return rows
