"""The reward lens: at which depth do the optimal and pessimal responses form?

A scan run with ``--lens`` holds, beside each candidate's score, ``lens_<layer>`` columns: the
model's own reward head read through its final norm at the final position after each layer
(``lens_0``: the embeddings; ``lens_k``: after decoder layer k; ``lens_last``: after the last
layer, which is the score itself, bit for bit on the fast engine). Per layer this module gives the
Spearman correlation of the lens with the final scores and the overlap of its top-k and bottom-k
with the final ones, and for each of the final top-k the layer where it first enters the layer's
top-k (``first_layer``) and the layer from which it stays there (``stays_from``).

Example:
    >>> df = pd.DataFrame({"token_id": [0, 1, 2, 3], "text": list("abcd"), "score": [4.0, 3.0, 2.0, 1.0],
    ...                    "lens_0": [1.0, 2.0, 3.0, 4.0], "lens_last": [4.0, 3.0, 2.0, 1.0]})
    >>> r = lens(df, k=1)
    >>> r.layers[["layer", "spearman", "top_k_overlap"]].values.tolist()
    [['0', -1.0, 0.0], ['last', 1.0, 1.0]]
    >>> r.entry[["text", "first_layer", "stays_from"]].values.tolist()
    [['a', 'last', 'last']]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ...errors import UserError
from ..data.ledger import Ledger
from ..data.results import Result

PREFIX = "lens_"


@dataclass(kw_only=True)
class LensResult(Result):
    """layers: layer, n, spearman, top_k_overlap, bottom_k_overlap (fractions of k), k.
    entry: the final top-k: final_rank, token_id, text, score, first_layer, stays_from."""

    layers: pd.DataFrame = field(default_factory=pd.DataFrame)
    entry: pd.DataFrame = field(default_factory=pd.DataFrame)


def lens_columns(df: pd.DataFrame) -> list[str]:
    """The lens columns of a scan table, in depth order (as the scan wrote them)."""
    return [c for c in df.columns if c.startswith(PREFIX)]


#: a lens column whose spread is within this many float32 ulps of its magnitude is constant: the same state in
#: every row (layer 0), read through the head in batches whose GEMMs may round a row's last bit by its place in
#: the batch (seen: 1 row of 1,365 one ulp off), so a rank correlation of it ranks rounding, not candidates
CONSTANT_ULPS = 16


def constant(v: np.ndarray) -> bool:
    """Whether a lens column is constant to float32 rounding (:data:`CONSTANT_ULPS`).

    >>> constant(np.array([1.0932901, 1.0932903], dtype=np.float32)), constant(np.array([1.0, 1.01]))
    (True, False)
    """
    v = np.asarray(v, dtype=np.float64)
    return bool(np.ptp(v) <= CONSTANT_ULPS * np.finfo(np.float32).eps * max(np.abs(v).max(), np.finfo(np.float32).tiny))


def _ranks(x: np.ndarray) -> np.ndarray:
    return pd.Series(x).rank(method="average").to_numpy()


def lens(df: pd.DataFrame, *, k: int = 10) -> LensResult:
    """The lens tables of one scan (a frame with ``score`` and ``lens_<layer>`` columns)."""
    cols = lens_columns(df)
    if not cols:
        raise UserError("this scan has no lens columns; rescan with --lens (a score head)")
    ledger = Ledger()
    keep = df[["score", *cols]].notna().all(axis=1)
    if (~keep).any():
        ledger.drop("lens", int((~keep).sum()),
                    "a NaN score or lens value (a non-finite score, or a row a gated head re-gated)")
    d = df[keep].reset_index(drop=True)
    n = len(d)
    if n < 2:
        raise UserError(f"the lens needs at least 2 scored rows; this scan has {n}")
    kk = min(k, n)
    if kk * 2 > n:  # the top and bottom k then overlap, and at k >= n every overlap is 1 whatever the lens
        ledger.note(f"k = {k:,} {'is cut to' if kk < k else 'is'} {kk:,} of the {n:,} rows: the top and bottom k "
                    "overlap, so the overlaps say little (every one is 1 at k = n); give k under half the rows")
    score = d["score"].to_numpy(np.float64)
    order = np.argsort(-score, kind="stable")
    top, bottom = set(order[:kk]), set(order[::-1][:kk])
    rs = _ranks(score)
    rows, in_top = [], []
    for c in cols:
        v = d[c].to_numpy(np.float64)
        o = np.argsort(-v, kind="stable")
        t = set(o[:kk])
        # constant (layer 0: the final position holds the same template token in every row): undefined
        const = constant(v)  # no top-k to speak of: overlaps undefined, nobody enters here
        rho = float(np.corrcoef(_ranks(v), rs)[0, 1]) if not const and np.ptp(score) > 0 else float("nan")
        if const:
            ledger.note(f"layer {c[len(PREFIX):]}: the lens is the same for every candidate, to float32 rounding "
                        "(at the final position the embeddings are the template's last token in every row); its "
                        "Spearman and overlaps are undefined")
        rows.append({"layer": c[len(PREFIX):], "n": n, "spearman": rho,
                     "top_k_overlap": np.nan if const else len(t & top) / kk,
                     "bottom_k_overlap": np.nan if const else len(set(o[::-1][:kk]) & bottom) / kk, "k": kk})
        in_top.append([not const and i in t for i in order[:kk]])
    names = [c[len(PREFIX):] for c in cols]
    hit = np.array(in_top)  # (layers, kk): final top-k row j in layer l's top-k
    entry = []
    for j, i in enumerate(order[:kk]):
        first = int(np.argmax(hit[:, j])) if hit[:, j].any() else None
        after = np.flatnonzero(~hit[:, j])
        stays = 0 if not len(after) else int(after[-1]) + 1
        entry.append({"final_rank": j + 1, "token_id": d["token_id"].iloc[i] if "token_id" in d else None,
                      "text": d["text"].iloc[i] if "text" in d else None, "score": float(score[i]),
                      "first_layer": None if first is None else names[first],
                      "stays_from": names[stays] if stays < len(names) else None})
    res = LensResult(layers=pd.DataFrame(rows), entry=pd.DataFrame(entry))
    res.take_ledger(ledger)
    return res


def lens_figure(res: LensResult, title: str | None = None):
    """Spearman with the final scores and top-/bottom-k overlap, by layer (a matplotlib Figure)."""
    from ..render.plots import new_figure

    t = res.layers
    fig = new_figure(7.5, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(t))
    ax.plot(x, t["spearman"], marker="o", label="Spearman with the final scores")
    k = int(t["k"].iloc[0])
    ax.plot(x, t["top_k_overlap"], marker="s", label=f"top-{k} overlap")
    ax.plot(x, t["bottom_k_overlap"], marker="^", label=f"bottom-{k} overlap")
    ax.set_xticks(x, t["layer"].tolist(), rotation=90 if len(t) > 24 else 0, fontsize=8)
    ax.set_xlabel("residual stream after layer (0 = embeddings; last = the score)")
    ax.set_ylim(-1.05, 1.05)
    ax.axhline(0, color="grey", lw=0.5)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title or "reward lens: the head read through the final norm after each layer", fontsize=10)
    return fig


def write_lens_figure(res: LensResult, path: str | Path, title: str | None = None) -> Path:
    """The lens figure as a PNG (atomically)."""
    from ...io import atomic_write
    from ..render.plots import to_png

    png = to_png(lens_figure(res, title))
    return atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(png))
