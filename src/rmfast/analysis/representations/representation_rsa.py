"""RSA at the representation level (issue 24 part 4): the models × models agreement matrix from CKA / RV2
of their hidden states on the candidates all of them share, tested against metadata predictors
with a permutation over models (:mod:`rmfast.analysis.stats.rsa`), beside the Kendall-τ matrix of scores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ...states import canonical_layer
from ..stats.permutation import N_PERM
from ..data.results import Result
from .similarity import MEASURES, _as_set, _check_n, _shifts, _variant_values, align
from .similarity_guards import LAYER0_WHY, dominance_note, layer_defect, small_n_note


LICENSE = (
    "What the representation RSA licenses: a small p means that, among these models, pairs that share "
    "the predictor (e.g. a base family) have more similar representations than the same models with "
    "their labels shuffled; the Mantel test permutes model labels, not pairs, because pairs sharing a "
    "model are not independent. It does not license a claim about other models (these models are not "
    "a random sample), nor that the predictor causes the similarity, nor a choice between correlated "
    "predictors (base family, developer and size travel together); with few models the exact test "
    "has few attainable p-values, and a large p is not evidence of no association.")


@dataclass(kw_only=True)
class RepresentationAgreementResult(Result):
    """pairs: model_a, model_b, layer, n, cka, cka_debiased, rv, rv2, rv_null_mean (plain RV/CKA's chance level),
    undefined (why the measures are NaN, "" where defined) (one row per unordered pair).
    rsa: measure, predictor, r, p_value, n_perm, exact, n_models, n_pairs.
    alignment: set, rows, duplicated, not_shared, shared (the candidates every model shares).
    """

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    rsa: pd.DataFrame = field(default_factory=pd.DataFrame)
    alignment: pd.DataFrame = field(default_factory=pd.DataFrame)
    layer: str = "last_prenorm"

    def matrix(self, measure: str = "rv2") -> pd.DataFrame:
        """Model × model matrix of a measure (diagonal 1)."""
        if measure not in MEASURES:
            raise UserError(f"unknown measure {measure!r}; use one of {MEASURES}")
        models = list(dict.fromkeys(list(self.pairs["model_a"]) + list(self.pairs["model_b"])))
        mat = pd.DataFrame(np.eye(len(models)), index=models, columns=models)
        for x, y, v in self.pairs[["model_a", "model_b", measure]].itertuples(index=False):
            mat.loc[x, y] = mat.loc[y, x] = v
        return mat


def representation_agreement(sets: Mapping[str, object], *, layer: str = "last_prenorm",
                             measures_: Sequence[str] = ("rv2", "cka"), metadata=None,
                             scores: pd.DataFrame | None = None, n_perm: int = N_PERM, seed: int = 0,
                             join: str = "auto", chunk_rows: int = 4096) -> RepresentationAgreementResult:
    """Models × models CKA/RV2 at one layer, on the candidates every model shares, and its RSA.

    ``sets``: model name -> states path or :class:`StatesSet`. ``metadata``: as for
    :func:`~rmfast.analysis.paper_a.agreement.agreement` (the same predictors, :mod:`..stats.rsa`).
    ``scores``: a models × models matrix from score agreement (e.g.
    ``agreement(...).matrix("kendall_tau_b")``), compared as one more predictor,
    "kendall_tau_b": do models that represent alike also score alike?
    Each RSA is :func:`~rmfast.analysis.stats.rsa.rsa_test` (Spearman, permutation over models).
    ``layer``: a name of :mod:`rmfast.states.names` (the old ``last`` is ``last_prenorm``, with a warning).

    >>> import tempfile; from pathlib import Path; from rmfast.states import write_states
    >>> rng = np.random.default_rng(0); d = Path(tempfile.mkdtemp()); base = rng.normal(size=(80, 5))
    >>> sets = {m: write_states(d / m, np.arange(80), {"last_prenorm": base + s * rng.normal(size=(80, 5))})
    ...         for m, s in [("a", .1), ("b", .2), ("c", 3.0)]}
    >>> r = representation_agreement(sets)
    >>> m = r.matrix("rv2"); bool(m.loc["a", "b"] > m.loc["a", "c"])
    True
    """
    from ..data.metadata import load_model_metadata, match_metadata
    from ..stats.rsa import predictor_matrices, rsa_test

    bad = [m for m in measures_ if m not in MEASURES]
    if bad:
        raise UserError(f"unknown measure(s) {bad}; use {MEASURES}")
    names = list(sets)
    if len(names) < 2:
        raise UserError("representation agreement needs at least 2 state sets")
    if metadata is not None and len(names) >= 4:  # its RSA ranks with scipy: checked before the matrix is computed
        from ..data.deps import require

        require("scipy.stats", "the representation RSA (--metadata)")
    opened = [_as_set(sets[k]) for k in names]
    layer = canonical_layer(layer)
    for s in opened:
        s.check_layer(layer)
    al = align(opened, join, names)
    _check_n(al.n)
    rows = []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            a, b = opened[i], opened[j]
            ra, rb = al.rows[i], al.rows[j]
            sh = (_shifts(a, [layer], ra), _shifts(b, [layer], rb))
            o = _variant_values(a, b, ra, rb, [layer], [layer], ["obs"], seed=seed,
                                chunk_rows=chunk_rows, shifts=sh)["obs"][(layer, layer)]
            rows.append({"model_a": names[i], "model_b": names[j], "layer": layer, "n": al.n,
                         **{m: o[m] for m in MEASURES}, "rv_null_mean": o["rv_null_mean"]})
    res = RepresentationAgreementResult(pairs=pd.DataFrame(rows), alignment=al.counts, layer=layer)
    _say_undefined(res, dict(zip(names, zip(opened, al.rows))), layer)
    # the pairwise table's two notes, for the matrix: plain CKA near its chance level, one candidate setting a layer
    for note in (small_n_note(res.pairs, al.n, {k: s.hidden_size for k, s in zip(names, opened)}),
                 dominance_note([(k, s, [layer], r) for k, s, r in zip(names, opened, al.rows)])):
        res.notes += [note] if note else []
    preds: dict[str, pd.DataFrame] = {}
    if metadata is not None:
        matched, unmatched = match_metadata(names, load_model_metadata(metadata))
        if unmatched:
            res.notes.append(f"RSA: no metadata for {unmatched}; left out of the metadata RSA")
        preds.update(predictor_matrices(matched))
    if scores is not None:
        missing = [m for m in names if m not in scores.index]
        if missing:
            raise UserError(f"the score matrix has no row for {missing}")
        preds["kendall_tau_b"] = scores.loc[names, names]
    rsa_rows = []
    for measure in measures_:
        obs = res.matrix(measure)
        for pname, pm in preds.items():
            ms = [m for m in names if m in pm.index]
            if len(ms) < 4:
                res.notes.append(f"RSA {measure} ~ {pname}: {len(ms)} models; needs at least 4")
                continue
            got = rsa_test(obs.loc[ms, ms], pm, n_perm=n_perm, seed=seed)
            if np.isnan(got["r"]) and not np.isfinite(obs.loc[ms, ms].to_numpy(dtype="float64")).all():
                res.notes.append(f"RSA {measure} ~ {pname}: undefined, no p: the {measure} of some pairs is NaN (a "
                                 "layer that is constant or not finite in a set)")
            rsa_rows.append({"measure": measure, "predictor": pname, **got})
    res.rsa = pd.DataFrame(rsa_rows, columns=["measure", "predictor", "r", "p_value", "n_perm", "exact", "seed",
                                              "n_models", "n_pairs"])
    if not preds:
        res.notes.append("no metadata and no score matrix: RSA not run")
    if len(res.rsa):  # how to read an RSA's p: said only where one was computed
        res.notes.append(LICENSE)
    return res


def _say_undefined(res: RepresentationAgreementResult, sets: dict, layer: str) -> None:
    """The ``undefined`` column and a note: which models' states make a pair's measures NaN at ``layer``, and why
    (constant across candidates, as layer 0 of a token scan is, or NaN/inf values). ``sets``: name -> (set, rows)."""
    ok = np.isfinite(res.pairs[list(MEASURES)].to_numpy(dtype=float)).all(axis=1) if len(res.pairs) else []
    if all(ok):
        res.pairs["undefined"] = ""
        return
    bad = set(res.pairs.loc[~ok, "model_a"]) | set(res.pairs.loc[~ok, "model_b"])
    why = {m: d for m in sets if m in bad and (d := layer_defect(sets[m][0], layer, sets[m][1]))}
    res.pairs["undefined"] = ["" if good else "; ".join(f"{m} ({why[m]})" for m in (x, y) if m in why)
                              or "a measure divides by zero on these candidates"
                              for good, x, y in zip(ok, res.pairs["model_a"], res.pairs["model_b"])]
    res.notes.append(f"{int((~ok).sum())} of {len(ok)} model pairs have undefined measures (NaN) at layer {layer} "
                     "(the table's column undefined says why)" + (": " + ", ".join(f"{m} ({d})" for m, d in why.items())
                                                                  if why else "")
                     + (f"; {LAYER0_WHY}; choose another layer" if layer == "0" and why else ""))
