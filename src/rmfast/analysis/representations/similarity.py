r"""Similarity between two sets of hidden states: linear CKA, debiased CKA, RV and RV2.

Streaming, in O(d²) memory: never the n × n Gram matrix. Notation: X (n × p) and Y
(n × q) hold the states of the same n candidates (rows aligned), Xc = HX, Yc = HY the
column-centred matrices (H = I − 11'/n), K = XcXc', L = YcYc' (n × n, never formed),
a_i = K_ii = ‖xc_i‖², b_i = L_ii = ‖yc_i‖², A = Σa_i = tr K, B = Σb_i.

The measures, as n × n definitions (:func:`gram_measures` computes exactly these):

- RV (Escoufier 1973) = tr(KL) / √(tr(K²) tr(L²)).
- linear CKA (Kornblith et al. 2019) = HSIC(K, L) / √(HSIC(K, K) HSIC(L, L)) with the
  biased HSIC tr(KHLH)/(n−1)²; for linear kernels on centred features this is *identical*
  to RV (both columns are reported; they agree to rounding).
- RV2, the modified RV (Smilde et al. 2009): RV with the diagonals of K and L removed,
  vec(K̃)'vec(L̃) / √(‖K̃‖²‖L̃‖²), K̃ = K − diag(K).
- debiased CKA: CKA with the unbiased HSIC estimator of Song et al. (2012), as used by
  Kornblith et al. and Nguyen et al.: for raw Gram matrices K, L with zeroed diagonals,
  HSIC_u = [tr(K̃L̃) + 1'K̃1·1'L̃1/((n−1)(n−2)) − 2/(n−2)·1'K̃L̃1] / (n(n−3)).

Closed forms from p × p / p × q cross-products (this module computes only these):

  tr(KL) = ‖Xc'Yc‖²_F,  tr(K²) = ‖Xc'Xc‖²_F,  Σ_i K_ii L_ii = Σ_i a_i b_i =: D_xy.

So RV = T_xy/√(T_xx T_yy) with T = ‖C‖²_F of the centred cross-products, and, since
vec(K̃)'vec(L̃) = tr(KL) − Σ_i K_ii L_ii, RV2 = (T_xy − D_xy)/√((T_xx − D_xx)(T_yy − D_yy)).
For debiased CKA, HSIC_u is invariant to a shift of the features (U-centring removes the
a_i + a_j + c terms a shift adds), so take the centred K: then K1 = 0, hence with
K̃ = K − diag(a): 1'K̃1 = −A, K̃1 = −a, 1'K̃L̃1 = a'b = D_xy and tr(K̃L̃) = T_xy − D_xy, so

  n(n−3)·HSIC_u = T_xy − n/(n−2)·D_xy + A·B/((n−1)(n−2))

(Kornblith's feature-space formula). The diagonal terms need the centred row norms, but
the mean m is known only at the end. With z_i the (shifted) rows, r_i = ‖z_i‖²,
a_i = r_i − 2 z_i·m + ‖m‖², and expanding the product and summing (Σ z_i·m = n‖m‖²):

  D_xy = Σr_i t_i − 2 (Σ r_i w_i)·μ − 2 (Σ t_i z_i)·m + 4 m'(Σ z_i w_i')μ
         + ‖μ‖² Σr_i + ‖m‖² Σt_i − 3n‖m‖²‖μ‖²

(w_i, t_i = ‖w_i‖², μ: the same for Y; D_xx is the case Y = X). So one pass accumulates,
in float64, n, Σz, Z'Z, Σr, Σr², Σ r_i z_i per set and Z'W, Σ r_i t_i, Σ r_i w_i, Σ t_i z_i
per pair: O(p² + q² + pq) memory whatever n is. Rows are shifted by the mean of the first
1,024 aligned rows before accumulating (every measure is shift-invariant), which keeps the
uncentred sums from cancelling catastrophically when states have a large common offset.
A bootstrap replicate is the same accumulation with multinomial row weights (each sum
weighted by the copy count, n → Σw), which equals the definitions applied to the
resampled rows, duplicates included; for RV2 the resample's rows are first centred by its
own mean (a cheap O(n·d) first read) and every pair of copies of one candidate is left out,
Σ_i w_i² a_i b_i in place of D (copies of a candidate are the resample's analogue of the
diagonal; counting them as distinct items inflates RV2 the way the diagonal inflates RV). Without the copy pairs a
measure is not shift-invariant: centring by the resample's mean is part of its definition. A permutation replicate pairs row i of X with row
π(i) of Y; only the cross terms change.

Chance level (Josse, Pagès & Husson 2008): under row permutation E[RV] = √(β_x β_y)/(n−1),
β_x = (tr K)²/tr(K²) (the effective dimensionality). It is reported as ``rv_null_mean``:
with n small relative to the effective dimension, plain RV/CKA sit far above 0 for
unrelated representations, RV2 and debiased CKA near 0 (docs/representations.md).

Example:
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 8)); Y = X @ rng.normal(size=(8, 5))   # (200, 8), (200, 5)
    >>> m = measures(X, Y, chunk_rows=64)
    >>> g = gram_measures(X, Y)
    >>> all(abs(getattr(m, k) - g[k]) < 1e-12 for k in MEASURES)
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...errors import UserError
from ...states import StatesSet, canonical_layer, open_states
from ..data.results import Result
from ..stats.permutation import holm
from .similarity_guards import MEASURES, NULL_NOTE, check_replicates, dominance_note, small_n_note, undefined_reasons  # noqa: F401
from .similarity_progress import progress_bar, timed
from .similarity_bootstrap import (MIN_TRUSTED_BOOTSTRAP, bootstrap_interval,  # noqa: F401 (re-exported)
                                   bca_gaps_note, check_interval, interval_note, jackknife_blocks, jackknife_count,
                                   lost_note, permutation_note, rv2_note)

JOINS = ("auto", "id", "text")
SHIFT_ROWS = 1024


# ---------------------------------------------------------------- n × n definitions (tests)

def gram_measures(X, Y) -> dict[str, float]:
    """The four measures from their n × n definitions in float64 (small n only; see module doc).

    >>> X = np.eye(4)[:, :3]; gram_measures(X, X)["rv2"]
    1.0
    """
    X = np.asarray(X, dtype=np.float64)  # (n, p)
    Y = np.asarray(Y, dtype=np.float64)  # (n, q)
    n = len(X)
    H = np.eye(n) - 1.0 / n  # (n, n) centring matrix
    K, L = X @ X.T, Y @ Y.T  # (n, n) raw linear Gram matrices
    Kc, Lc = H @ K @ H, H @ L @ H  # (n, n) centred

    def hsic_b(k, l):
        return np.trace(k @ H @ l @ H) / (n - 1) ** 2

    def hsic_u(k, l):  # Song et al. 2012, eq. (5), on the raw Gram matrices
        k = k - np.diag(np.diag(k))
        l = l - np.diag(np.diag(l))
        one = np.ones(n)
        return (np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
                - 2.0 / (n - 2) * (one @ k @ l @ one)) / (n * (n - 3))

    def off(m):
        return m - np.diag(np.diag(m))

    Kt, Lt = off(Kc), off(Lc)
    hu = hsic_u(K, K) * hsic_u(L, L)
    return {
        "cka": hsic_b(K, L) / math.sqrt(hsic_b(K, K) * hsic_b(L, L)),
        "cka_debiased": hsic_u(K, L) / math.sqrt(hu) if hu > 0 else math.nan,
        "rv": np.trace(Kc @ Lc) / math.sqrt(np.trace(Kc @ Kc) * np.trace(Lc @ Lc)),
        "rv2": float((Kt * Lt).sum() / math.sqrt((Kt * Kt).sum() * (Lt * Lt).sum())),
    }


# ---------------------------------------------------------------- streaming accumulators

@dataclass
class _Side:
    """Weighted sums over the rows z_i (shifted) of one set and layer; r_i = ‖z_i‖²."""

    n: float
    s: np.ndarray  # (p,) Σ w z
    S: np.ndarray  # (p, p) Σ w z z'
    r1: float  # Σ w r
    r2: float  # Σ w r²
    rz: np.ndarray  # (p,) Σ w r z
    q2: float = 0.0  # Σ w² r² (bootstrap, rows centred exactly: Σ over copy pairs of K_ij²)
    q1: float = 0.0  # Σ w² r (bootstrap: Σ over copy pairs of K_ij, the copy blocks' share of 1'K1)
    q3: float = 0.0  # Σ w³ r² (bootstrap: ‖(copy blocks of K) 1‖²)

    @classmethod
    def zeros(cls, p: int) -> "_Side":
        return cls(0.0, np.zeros(p), np.zeros((p, p)), 0.0, 0.0, np.zeros(p))

    def add(self, Z: np.ndarray, r: np.ndarray, w: np.ndarray | None) -> None:
        # Z: (c, p) float64, r: (c,), w: (c,) or None (all ones)
        Zw = Z if w is None else Z * w[:, None]  # (c, p)
        rw = r if w is None else r * w  # (c,)
        self.n += len(Z) if w is None else float(w.sum())
        self.s += Zw.sum(0)
        self.S += Z.T @ Zw
        self.r1 += float(rw.sum())
        self.r2 += float(rw @ r)
        self.rz += rw @ Z
        if w is not None:
            self.q2 += float((rw * w) @ r)
            self.q1 += float(rw @ w)
            self.q3 += float((rw * w * w) @ r)


@dataclass
class _Cross:
    """Weighted cross sums of a pair of sets: rows z_i (X) and w_i (Y), r_i, t_i their norms²."""

    S: np.ndarray  # (p, q) Σ z w'
    rt: float  # Σ r t
    rw: np.ndarray  # (q,) Σ r w
    tz: np.ndarray  # (p,) Σ t z
    q2: float = 0.0  # Σ w² r t (bootstrap, rows centred exactly)
    q3: float = 0.0  # Σ w³ r t (bootstrap: 1'(copy blocks of K)(copy blocks of L)1)

    @classmethod
    def zeros(cls, p: int, q: int) -> "_Cross":
        return cls(np.zeros((p, q)), 0.0, np.zeros(q), np.zeros(p))

    def add(self, Z, r, W, t, w: np.ndarray | None) -> None:
        # Z: (c, p), W: (c, q), r, t, w: (c,)
        Zw = Z if w is None else Z * w[:, None]  # (c, p)
        rw = r if w is None else r * w
        tw = t if w is None else t * w
        self.S += Zw.T @ W
        self.rt += float(rw @ t)
        self.rw += rw @ W
        self.tz += tw @ Z
        if w is not None:
            self.q2 += float((rw * w) @ t)
            self.q3 += float((rw * w * w) @ t)


@dataclass
class _Centred:
    m: np.ndarray  # (p,) mean of the shifted rows
    cm: float  # ‖m‖²
    A: float  # Σ a_i = tr K
    T: float  # ‖Xc'Xc‖²_F = tr K²
    D: float  # Σ a_i²
    Dw: float = math.nan  # Σ w_i² a_i² (bootstrap: every copy pair of a candidate)
    A2: float = math.nan  # Σ w_i² a_i (bootstrap)
    D3: float = math.nan  # Σ w_i³ a_i² (bootstrap)


def _centre(side: _Side) -> _Centred:
    n = side.n
    m = side.s / n
    cm = float(m @ m)
    Sc = side.S - n * np.outer(m, m)  # (p, p) Xc'Xc
    D = (side.r2 - 4.0 * float(side.rz @ m) + 4.0 * float(m @ side.S @ m)
         + 2.0 * cm * side.r1 - 3.0 * n * cm * cm)
    return _Centred(m, cm, float(np.trace(Sc)), float((Sc * Sc).sum()), D, side.q2, side.q1, side.q3)


def _finish(n: float, x: _Centred, y: _Centred, sx: _Side, sy: _Side, c: _Cross,
            copies: bool = False) -> dict:
    """The measures (and rv_null_mean) from the accumulated sums; formulas in the module doc.

    ``copies`` (a bootstrap resample, rows centred by its exact mean): every measure leaves out the pairs of
    copies of one candidate (i ≠ j, both copies of one candidate: K_ij = a_i), which are not pairs of distinct
    candidates and would count each candidate's own similarity again. RV2 leaves out the copy blocks with the
    diagonal (Σ w_i² a_i b_i instead of D); CKA/RV keep each copy's own diagonal and leave out the rest
    (T − Σ w_i² a_i b_i + Σ w_i a_i b_i); debiased CKA removes the copy blocks as it removes the diagonal
    (its K̃ = K − blockdiag(a_i J_{w_i}): 1'K̃1 = −Σ w_i² a_i, 1'K̃L̃1 = Σ w_i³ a_i b_i). Without this, copies
    inflate plain and debiased CKA (issue 52 §4: n = 40, no replicate below the estimate).
    """
    C = c.S - n * np.outer(x.m, y.m)  # (p, q) Xc'Yc
    T = float((C * C).sum())
    D = (c.rt - 2.0 * float(c.rw @ y.m) - 2.0 * float(c.tz @ x.m) + 4.0 * float(x.m @ c.S @ y.m)
         + y.cm * sx.r1 + x.cm * sy.r1 - 3.0 * n * x.cm * y.cm)

    def ratio(num, a, b):
        return num / math.sqrt(a * b) if a > 0 and b > 0 else math.nan

    def h(t, d, a, b):  # n(n−3)·HSIC_u of centred Gram matrices
        return t - n / (n - 2) * d + a * b / ((n - 1) * (n - 2))

    def hc(t, q2, q3, a2, b2):  # the same with every copy block removed like the diagonal
        return t - q2 + a2 * b2 / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * q3

    if copies:
        rv = ratio(T - c.q2 + D, x.T - x.Dw + x.D, y.T - y.Dw + y.D)
        out = {"cka": rv, "rv": rv, "rv2": ratio(T - c.q2, x.T - x.Dw, y.T - y.Dw),
               "cka_debiased": ratio(hc(T, c.q2, c.q3, x.A2, y.A2), hc(x.T, x.Dw, x.D3, x.A2, x.A2),
                                     hc(y.T, y.Dw, y.D3, y.A2, y.A2)) if n > 3 else math.nan}
    else:
        rv = ratio(T, x.T, y.T)
        out = {"cka": rv, "rv": rv, "rv2": ratio(T - D, x.T - x.D, y.T - y.D),
               "cka_debiased": ratio(h(T, D, x.A, y.A), h(x.T, x.D, x.A, x.A), h(y.T, y.D, y.A, y.A))
               if n > 3 else math.nan}
    bx = x.A ** 2 / x.T if x.T > 0 else math.nan
    by = y.A ** 2 / y.T if y.T > 0 else math.nan
    out["rv_null_mean"] = math.sqrt(bx * by) / (n - 1)
    return out


@dataclass
class Measures:
    """The four measures of one pair, plus RV's permutation-null mean √(β_x β_y)/(n−1)."""

    n: int
    cka: float
    cka_debiased: float
    rv: float
    rv2: float
    rv_null_mean: float


def measures(X, Y, *, chunk_rows: int | None = 4096, shift_rows: int = SHIFT_ROWS) -> Measures:
    """The measures of two in-memory row-aligned arrays, by the same streaming sums as files.

    X: (n, p), Y: (n, q) (numpy or torch, any float dtype); ``chunk_rows``: rows per step;
    ``shift_rows``: the rows whose mean is subtracted first (any choice gives the same measures).

    >>> X = np.random.default_rng(1).normal(size=(50, 4))
    >>> round(measures(X, 3 * X @ np.linalg.qr(np.ones((4, 4)) + np.eye(4))[0]).rv2, 12)
    1.0
    """
    X = np.asarray(X, dtype=np.float64)  # (n, p)
    Y = np.asarray(Y, dtype=np.float64)  # (n, q)
    if X.ndim != 2 or Y.ndim != 2 or len(X) != len(Y):
        raise UserError(f"X and Y must be (n, p) and (n, q) with the same n; got {X.shape}, {Y.shape}")
    n = len(X)
    _check_n(n)
    if shift_rows < 1:
        raise UserError(f"shift_rows={shift_rows}; give at least 1")
    shx, shy = X[:shift_rows].mean(0), Y[:shift_rows].mean(0)  # (p,), (q,)
    sx, sy, c = _Side.zeros(X.shape[1]), _Side.zeros(Y.shape[1]), _Cross.zeros(X.shape[1], Y.shape[1])
    step = chunk_rows or n
    for lo in range(0, n, step):
        Z, W = X[lo:lo + step] - shx, Y[lo:lo + step] - shy  # (c, p), (c, q)
        r, t = (Z * Z).sum(1), (W * W).sum(1)
        sx.add(Z, r, None)
        sy.add(W, t, None)
        c.add(Z, r, W, t, None)
    return Measures(n=n, **_finish(n, _centre(sx), _centre(sy), sx, sy, c))


def _check_n(n: int) -> None:
    if n < 4:
        raise UserError(f"{n} shared candidates; the measures need at least 4 (debiased CKA divides by n − 3)")


# ---------------------------------------------------------------- alignment

@dataclass
class Alignment:
    """Rows of each set that hold the same candidates, in one order.

    rows: per set, (n,) int64 row numbers; join: "id" or "text"; counts: one row per set
    with rows, duplicated (dropped: key occurs more than once in the set), not_shared, shared.
    """

    rows: list[np.ndarray]
    join: str
    counts: pd.DataFrame

    @property
    def n(self) -> int:
        return len(self.rows[0])


def _tokenizers_agree(sets: Sequence[StatesSet]) -> bool:
    """Do the sets' token ids mean the same strings? Their vocabularies' content hashes (``vocab_sha256``)
    where every set records one (two folders with one vocabulary agree), else the tokenizers' names."""
    scans = [s.manifest.get("scan") if isinstance(s.manifest.get("scan"), dict) else {} for s in sets]
    hashes = [sc.get("vocab_sha256") for sc in scans]
    if all(hashes):
        return len(set(hashes)) == 1
    tok = [sc.get("tokenizer") for sc in scans]
    known = [t for t in tok if t is not None]
    return len(known) == len(tok) and len(set(map(str, known))) == 1 if known else True


def align(sets: Sequence[StatesSet], join: str = "auto", names: Sequence[str] | None = None) -> Alignment:
    """Match rows across state sets: by token id (one tokenizer) or by decoded text.

    ``auto``: token id when every set is keyed by token id and the scans' vocabularies agree
    (their ``vocab_sha256``, else the ``tokenizer`` names where given), else text. Within each set every key that occurs more
    than once is dropped, all copies (the papers' de-duplication rule, as
    :func:`~rmfast.analysis.data.shared_vocab.dedupe_text`); the id join also requires the
    decoded strings to match when both scans give them (rmfast's id rule). Order: the
    first set's row order.
    """
    if join not in JOINS:
        raise UserError(f"unknown join {join!r}; use one of {JOINS}")
    names = list(names or [s.name for s in sets])
    if join == "auto":
        ids = all(s.key == "token_id" for s in sets) and _tokenizers_agree(sets)
        join = "id" if ids else "text"
    keyed = []
    all_texts = [s.texts() for s in sets]  # (n,) object arrays, or None without a scan Parquet
    with_text = all(t is not None for t in all_texts)  # the id join checks strings only if all have them
    for s, texts in zip(sets, all_texts):
        if join == "id":
            if s.key != "token_id":
                raise UserError(f"{s.path}: keyed by scan row, not token id; use the text join "
                                "(--join text) with the scan Parquet beside the states")
            k = (pd.Index(s.keys) if not with_text else
                 pd.Index(pd.Series(s.keys).astype(str).to_numpy(dtype=object) + ":" + texts.astype(str)))
        else:
            if texts is None:
                raise UserError(f"{s.path}: the text join needs the decoded strings: give the scan "
                                "Parquet (with the states folder beside it), or use --join id")
            k = pd.Index(texts.astype(str))
        keyed.append(pd.Series(np.arange(len(k)), index=k))
    counts, deduped = [], []
    for name, ser in zip(names, keyed):
        dup = ser.index.duplicated(keep=False)
        deduped.append(ser[~dup])
        counts.append({"set": name, "rows": len(ser), "duplicated": int(dup.sum())})
    common = deduped[0].index
    for ser in deduped[1:]:
        common = common[common.isin(ser.index)]
    for row, ser in zip(counts, deduped):
        row["not_shared"] = len(ser) - len(common)
        row["shared"] = len(common)
    if len(common) == 0:
        sizes = ", ".join(f"{c['set']}: {c['rows']} rows" for c in counts)
        raise UserError(f"the state sets share no candidates on the {join} join ({sizes}); "
                        "they are of different candidate sets" + ("; if their texts match, try the text join"
                                                                 " (analyze similarity --join text)" if join == "id" else ""))
    rows = [ser.reindex(common).to_numpy(dtype=np.int64) for ser in deduped]
    return Alignment(rows, join, pd.DataFrame(counts))


# ---------------------------------------------------------------- the streaming engine

def _block_bytes(p: int, q: int, ga: int, gb: int) -> int:
    return 8 * (ga * (p * p + 2 * p) + gb * (q * q + 2 * q) + ga * gb * (p * q + p + q))


def _tiles(la: list[str], lb: list[str], p: int, q: int, max_bytes: int):
    ga, gb = len(la), len(lb)
    while _block_bytes(p, q, ga, gb) > max_bytes and (ga > 1 or gb > 1):
        if ga >= gb:
            ga = (ga + 1) // 2
        else:
            gb = (gb + 1) // 2
    for i in range(0, len(la), ga):
        for j in range(0, len(lb), gb):
            yield la[i:i + ga], lb[j:j + gb]


def _read(s: StatesSet, layer: str, rows: np.ndarray, shift: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    Z = s.take(layer, rows).astype(np.float64) - shift  # (c, d) shifted rows
    return Z, (Z * Z).sum(1)  # (c, d), (c,)


def _variant_values(a, b, ra, rb, la, lb, variants, *, seed, chunk_rows, shifts):
    """Measures of every layer pair of the tile for each variant ("obs", ("boot", b), ("perm", k)).

    Returns {variant: {(la, lb): dict of measures}}; obs must come first when perms are asked.
    """
    n = len(ra)
    p, q = a.hidden_size, b.hidden_size
    weights, perms = {}, {}
    blocks = jackknife_blocks(n, seed) if any(v[0] == "jack" for v in variants if v != "obs") else None  # one for all
    for v in variants:
        if v != "obs" and v[0] == "boot":  # (n,) multinomial copy counts of replicate v[1]
            weights[v] = np.bincount(np.random.default_rng([seed, 0, v[1]]).integers(0, n, n),
                                     minlength=n).astype(np.float64)
        elif v != "obs" and v[0] == "jack":  # (n,) 1, but 0 for block v[1] (the grouped jackknife, BCa's a)
            weights[v] = np.ones(n)
            weights[v][blocks[v[1]]] = 0.0
        elif v != "obs":  # (n,) partner of row i in Y
            perms[v] = np.random.default_rng([seed, 1, v[1]]).permutation(n)
    sides = {v: ({l: _Side.zeros(p) for l in la}, {l: _Side.zeros(q) for l in lb})
             for v in variants if v not in perms}
    # a resample's own mean, per layer, from a cheap first read (O(n·d) per replicate), so its rows
    # are centred exactly and RV2 can leave out the pairs of copies (Σ w_i² a_i b_i)
    means: dict = {v: ({l: np.zeros(p) for l in la}, {l: np.zeros(q) for l in lb}) for v in weights}
    if weights:
        kept = {v: w.sum() for v, w in weights.items()}  # a resample's rows (n; fewer for a jackknife replicate)
        for lo in range(0, n, chunk_rows):
            hi = min(n, lo + chunk_rows)
            for side, s, rows, ls in ((0, a, ra, la), (1, b, rb, lb)):
                for l in ls:
                    Z = _read(s, l, rows[lo:hi], shifts[side][l])[0]  # (c, d)
                    for v in weights:  # a replicate's own mean: over the rows it keeps
                        means[v][side][l] += weights[v][lo:hi] @ Z / kept[v]
    cross = {v: {(x, y): _Cross.zeros(p, q) for x in la for y in lb} for v in variants}
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        X = {l: _read(a, l, ra[lo:hi], shifts[0][l]) for l in la}
        Y = {l: _read(b, l, rb[lo:hi], shifts[1][l]) for l in lb}
        for v in variants:
            w = weights[v][lo:hi] if v in weights else None
            Xv = X
            if v in perms:
                Yv = {l: _read(b, l, rb[perms[v][lo:hi]], shifts[1][l]) for l in lb}
            elif v in weights:
                Xv = {l: _recentre(X[l][0], means[v][0][l]) for l in la}
                Yv = {l: _recentre(Y[l][0], means[v][1][l]) for l in lb}
                for l in la:
                    sides[v][0][l].add(*Xv[l], w)
                for l in lb:
                    sides[v][1][l].add(*Yv[l], w)
            else:
                Yv = Y
                for l in la:
                    sides[v][0][l].add(*X[l], w)
                for l in lb:
                    sides[v][1][l].add(*Y[l], w)
            for (x, y), acc in cross[v].items():
                acc.add(Xv[x][0], Xv[x][1], Yv[y][0], Yv[y][1], w)
    out = {}
    for v in variants:
        sa, sb = sides["obs" if v in perms else v]
        ca = {l: _centre(sa[l]) for l in la}
        cb = {l: _centre(sb[l]) for l in lb}
        nv = sa[la[0]].n
        out[v] = {(x, y): _finish(nv, ca[x], cb[y], sa[x], sb[y], acc, copies=v in weights)
                  for (x, y), acc in cross[v].items()}
    return out


def _recentre(Z: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    Zc = Z - m  # (c, d)
    return Zc, (Zc * Zc).sum(1)


def _shifts(s: StatesSet, layers, rows) -> dict[str, np.ndarray]:
    head = rows[:SHIFT_ROWS]
    return {l: s.take(l, head).astype(np.float64).mean(0) for l in layers}  # layer -> (d,)


def _pvalue(obs: float, perm: np.ndarray) -> float:
    if not np.isfinite(obs):
        return math.nan
    hits = int(np.sum(perm >= obs - 1e-12 * abs(obs)))
    return (1 + hits) / (1 + len(perm))


@dataclass(kw_only=True)
class SimilarityResult(Result):
    """pairs: one row per layer pair: layer_a, layer_b, n, cka, cka_debiased, rv, rv2, d_a, d_b, rv_null_mean, per
    measure ``<m>_lo``, ``<m>_hi`` (the bootstrap interval over candidates that ``interval`` names,
    :func:`bootstrap_interval`; median-recentred percentile by default),
    ``p_<m>`` (permutation p-value, "more similar than chance"), and ``undefined``: why the pair's measures are
    NaN ("" where defined, e.g. "A 0 (constant across candidates)"). alignment: set, rows, duplicated, not_shared, shared.
    """

    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    alignment: pd.DataFrame = field(default_factory=pd.DataFrame)
    join: str = "id"
    bootstrap: int = 0
    permutations: int = 0
    seed: int = 0
    level: float = 0.95
    interval: str = "recentred"


def _layers(s: StatesSet, layers) -> list[str]:
    if layers is None:
        return s.layers
    if isinstance(layers, str):
        layers = s.layers if layers.strip() == "all" else [x.strip() for x in layers.split(",") if x.strip()]
    layers = [canonical_layer(str(l)) for l in layers]  # the old 'last': last_prenorm, with a warning
    for l in layers:
        s.check_layer(l)
    if not layers:
        raise UserError(f"{s.path}: no layers asked for")
    return list(dict.fromkeys(layers))


def _as_set(x) -> StatesSet:
    return x if isinstance(x, StatesSet) else open_states(x)


def _all_values(a, b, ra, rb, la, lb, bootstrap, permutations, *, seed, chunk_rows, max_bytes, shifts,
                progress, n, jackknife: int = 0) -> dict:
    """variant -> {(layer_a, layer_b): measures} for the observed pairs, every bootstrap replicate and every
    permutation, streamed in batches of variants that fit ``max_bytes`` (after :func:`check_replicates`)."""
    p, q = a.hidden_size, b.hidden_size
    # replicates per step: what fits in max_bytes, but at most a tenth of them, so the bar moves (a step re-reads
    # the rows: cheap beside its products)
    most = max(1, math.ceil((1 + bootstrap + jackknife + permutations) / 10))
    tiles = [(ta, tb, min(most, max(1, max_bytes // _block_bytes(p, q, len(ta), len(tb)))))
             for ta, tb in _tiles(la, lb, p, q, max_bytes)]
    values: dict = {}
    # a constant layer (layer 0 of a token scan: one template token in every row) or NaN/inf states give
    # 0/0 or inf - inf: their measures are NaN, said once in a note below (no numpy warning per product)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        values["obs"], pass_s = timed(lambda: {k: v for ta, tb, _ in tiles for k, v in _variant_values(
            a, b, ra, rb, ta, tb, ["obs"], seed=seed, chunk_rows=chunk_rows, shifts=shifts)["obs"].items()})
        check_replicates(bootstrap, permutations, pass_s)  # the observed pass, first and timed, is the unit
        variants = ([("boot", i) for i in range(bootstrap)] + [("jack", g) for g in range(jackknife)]
                    + [("perm", i) for i in range(permutations)])
        bar = progress_bar(tiles, variants, n, la, lb, progress, pass_s)
        for ta, tb, per in tiles:
            for i in range(0, len(variants), per):
                batch = variants[i:i + per]
                batch = (["obs"] if any(v[0] == "perm" for v in batch) else []) + batch  # perms reuse obs's sides
                got = _variant_values(a, b, ra, rb, ta, tb, batch, seed=seed, chunk_rows=chunk_rows, shifts=shifts)
                for v, d in got.items():
                    values.setdefault(v, {}).update(d)
                bar.step()
        bar.close()
    return values


def similarity(a, b, *, layers_a=None, layers_b=None, bootstrap: int = MIN_TRUSTED_BOOTSTRAP,
               permutations: int = 49, interval: str = "recentred",
               seed: int = 0, level: float = 0.95, join: str = "auto", chunk_rows: int = 4096,
               max_bytes: int = 1 << 30, max_rows: int | None = None, progress: bool = False) -> SimilarityResult:
    """Layer × layer CKA, debiased CKA, RV and RV2 of two state sets (paths or :class:`StatesSet`).

    Compute: (1 + bootstrap + permutations) streaming passes' worth of products, each
    ~n·(p² + q² + pq)·(layers) multiply-adds; memory about ``max_bytes`` (at least one
    layer pair's O(p² + q² + pq), whatever n is). Same seed, same intervals and p-values.
    ``max_rows``: compute on at most this many of the shared candidates, a seeded random sample
    (``default_rng([seed, 2])``, kept in A's order; a note says so), e.g. for a quick look.
    ``interval``: which bootstrap interval (:func:`bootstrap_interval`: "recentred", "bca", "percentile", "basic");
    "bca" costs :data:`.similarity_bootstrap.JACKKNIFE_BLOCKS` more passes (its acceleration's grouped jackknife).
    ``bootstrap`` and ``permutations``: at most :data:`rmfast.analysis.representations.similarity_guards.MAX_REPLICATES` each (more
    is refused with the time they would take, measured on one pass). ``progress``: a line on stderr saying how
    much work there is, a bar over it (layer tiles × batches of replicates), and after its first step what the
    whole takes at that pace.

    >>> import tempfile; from pathlib import Path; from rmfast.states import write_states
    >>> rng = np.random.default_rng(0); d = Path(tempfile.mkdtemp())
    >>> X = rng.normal(size=(300, 6)).astype("float32")                     # (300, 6)
    >>> _ = write_states(d / "a.states", np.arange(300), {"last_prenorm": X})
    >>> Y = X[::-1] @ rng.normal(size=(6, 6)).astype("float32")
    >>> _ = write_states(d / "b.states", np.arange(299, -1, -1), {"last_prenorm": Y})
    >>> res = similarity(d / "a.states", d / "b.states", bootstrap=20, permutations=19)
    >>> row = res.pairs.iloc[0]
    >>> int(row.n), bool(row.rv2 > 0.5), float(row.p_rv2)
    (300, True, 0.05)
    """
    a, b = _as_set(a), _as_set(b)
    la, lb = _layers(a, layers_a), _layers(b, layers_b)
    if not 0 < level < 1:
        raise UserError(f"level {level}: give a number in (0, 1)")
    if bootstrap < 0 or permutations < 0 or chunk_rows < 1:
        raise UserError("bootstrap, permutations must be >= 0 and chunk_rows >= 1")
    check_interval(interval)
    names = [f"A: {a.name}", f"B: {b.name}"]
    al = align([a, b], join, names)
    ra, rb = al.rows
    n = al.n
    _check_n(n)
    shared = n
    if max_rows is not None and n > max_rows:
        if max_rows < 4:
            raise UserError(f"max_rows {max_rows}: give at least 4 (debiased CKA divides by n − 3)")
        keep = np.sort(np.random.default_rng([seed, 2]).choice(n, max_rows, replace=False))  # (max_rows,)
        ra, rb, n = ra[keep], rb[keep], max_rows
    p, q = a.hidden_size, b.hidden_size
    shifts = (_shifts(a, la, ra), _shifts(b, lb, rb))
    blocks = jackknife_count(n) if interval == "bca" and bootstrap else 0
    values = _all_values(a, b, ra, rb, la, lb, bootstrap, permutations, seed=seed, chunk_rows=chunk_rows,
                         max_bytes=max_bytes, shifts=shifts, progress=progress, n=n, jackknife=blocks)
    rows, lost = [], {}  # lost: per measure, the most replicates of one layer pair that came out NaN
    for x in la:
        for y in lb:
            o = values["obs"][(x, y)]
            row = {"layer_a": x, "layer_b": y, "n": n, **{m: o[m] for m in MEASURES},
                   "d_a": p, "d_b": q, "rv_null_mean": o["rv_null_mean"]}
            for m in MEASURES:
                boot = np.array([values[("boot", i)][(x, y)][m] for i in range(bootstrap)])
                jack = np.array([values[("jack", g)][(x, y)][m] for g in range(blocks)])
                row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_interval(o[m], boot, level, interval, jack)
                lost[m] = max(lost.get(m, 0), int((~np.isfinite(boot)).sum()))  # left out by bootstrap_interval
            for m in MEASURES:
                perm = np.array([values[("perm", i)][(x, y)][m] for i in range(permutations)])
                row[f"p_{m}"] = _pvalue(o[m], perm) if permutations else math.nan
            rows.append(row)
    pairs = pd.DataFrame(rows)
    res = SimilarityResult(pairs=pairs, alignment=al.counts, join=al.join, bootstrap=bootstrap,
                           permutations=permutations, seed=seed, level=level, interval=interval)
    res.notes.append(f"joined on {'token id' if al.join == 'id' else 'decoded text'}: {n:,} shared candidates; "
                     + "; ".join(f"{c.set}: {c.duplicated} duplicated, {c.not_shared} not shared"
                                 for c in al.counts.itertuples()))
    if n < shared:
        res.notes.append(f"measured on {n:,} of the {shared:,} shared candidates: a random sample (seed {seed}, "
                         "max_rows)")
    pairs["undefined"], undefined = undefined_reasons(pairs, a, b, la, lb, ra, rb)
    said = [undefined, dominance_note([("A", a, la, ra), ("B", b, lb, rb)]), small_n_note(pairs, n, {"A": p, "B": q})]
    if bootstrap:
        said += [interval_note(interval, level, bootstrap, seed, blocks),
                 bca_gaps_note(pairs) if interval == "bca" else None, rv2_note(interval, n, max(p, q)),
                 lost_note(lost, bootstrap)]
    res.notes += [x for x in said if x]
    if permutations:
        for m in MEASURES:  # the layer pairs are one family of tests per measure
            pairs[f"p_{m}_holm"] = holm(pairs[f"p_{m}"].to_numpy())
        res.notes.append(permutation_note(permutations, seed, len(pairs)))
    return res
