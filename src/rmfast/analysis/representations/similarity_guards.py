"""Guards of a similarity computation (:func:`rmfast.analysis.representations.similarity.similarity`): how many resamples
may be asked for, and which layers have no defined measure, and why.

Example:
    >>> check_replicates(50, 49, pass_s=0.4)         # within the bound: nothing to say
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...errors import UserError

#: the measures of a layer pair, in the order of the result's columns
MEASURES = ("cka", "cka_debiased", "rv", "rv2")
#: at most this many bootstrap replicates, and as many permutations (p-values down to ~1e-4): each one
#: is another pass over every shared candidate's states
MAX_REPLICATES = 10_000


def check_replicates(bootstrap: int, permutations: int, pass_s: float) -> None:
    """Refuse more than :data:`MAX_REPLICATES` of either, in one line with the time they would take here:
    ``pass_s``, the measured seconds of one pass (the observed measures), is about each replicate's cost."""
    if bootstrap <= MAX_REPLICATES and permutations <= MAX_REPLICATES:
        return
    t = pass_s
    est = t * (1 + bootstrap + permutations)
    when = f"{est / 3600:,.1f} h" if est >= 3600 else f"{est:,.0f} s"
    raise UserError(f"--bootstrap {bootstrap:,} / --permutations {permutations:,}: at most {MAX_REPLICATES:,} each "
                    f"(p-values down to {1 / (1 + MAX_REPLICATES):.0e}); each replicate is a pass over the states, "
                    f"{t:.3g} s here, so these would take about {when}")


#: why layer 0 is constant in a token scan, said beside the layer's name
LAYER0_WHY = ("layer 0 is the input embedding at the scored position, the template's last token in every row, "
              "so it cannot vary across candidates")


def layer_defect(s, layer: str, rows: np.ndarray, chunk: int = 4096) -> str | None:
    """Why ``layer`` of state set ``s`` gives undefined measures on ``rows``: "k NaN/inf values", "constant
    across candidates" (every row the same, e.g. layer 0 of a token scan), or None. One read of those rows."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return None
    first, same, n_bad = s.take(layer, rows[:1])[0], True, 0  # first: (d,)
    for i in range(0, len(rows), chunk):
        x = s.take(layer, rows[i:i + chunk])  # (c, d)
        n_bad += int((~np.isfinite(x)).sum())
        same = same and bool((x == first).all())
    return f"{n_bad:,} NaN/inf values" if n_bad else "constant across candidates" if same else None


def undefined_reasons(pairs: pd.DataFrame, a, b, la, lb, ra, rb) -> tuple[list[str], str | None]:
    """Why each layer pair's measures are undefined (NaN), and one note naming the layers.

    Returns (per row of ``pairs``: the reason, "" where every measure is defined; the note, or None).
    A layer is named when it is in an undefined pair and is constant across the rows compared (layer 0 of a
    token scan: :data:`LAYER0_WHY`) or holds NaN/inf values there (e.g. a float16 overflow)."""
    ok = np.isfinite(pairs[list(MEASURES)].to_numpy(dtype=float)).all(axis=1)  # (pairs,)
    if ok.all():
        return [""] * len(pairs), None
    why = {}
    for side, s, layers, rows in (("A", a, la, ra), ("B", b, lb, rb)):
        bad = set(pairs.loc[~ok, f"layer_{side.lower()}"])
        why.update({(side, l): d for l in layers if l in bad and (d := layer_defect(s, l, rows))})
    reasons = []
    for good, x, y in zip(ok, pairs["layer_a"], pairs["layer_b"]):
        got = [f"{side} {l} ({why[(side, l)]})" for side, l in (("A", x), ("B", y)) if (side, l) in why]
        reasons.append("" if good else "; ".join(got) or "a measure divides by zero or a negative self-similarity "
                       "(debiased on few candidates)")
    named = [f"{side} {l} ({d})" for (side, l), d in why.items()]
    zero = any(l == "0" and d.startswith("constant") for (_, l), d in why.items())
    return reasons, (f"{int((~ok).sum())} of {len(pairs)} layer pairs have undefined measures (NaN, the "
                     "table's column undefined says why): " + (", ".join(named) if named else
                     "no layer is constant or NaN/inf; a measure divides by zero on these candidates")
                     + (f"; {LAYER0_WHY}" if zero else "") + ("; leave those layers out" if named else ""))


#: a note names a layer where one candidate carries at least this share of its variance (tr K of the centred Gram
#: matrix), or DOMINANT_TIMES / n where n is small: then that one row sets every measure of the layer's pairs
DOMINANT_SHARE = 0.1
DOMINANT_TIMES = 10


def dominant_row(s, layer: str, rows: np.ndarray, chunk: int = 4096) -> tuple[float, int]:
    """(the largest share of ``layer``'s variance over ``rows`` that one row carries, that row's place in ``rows``):
    each row's squared distance from the rows' mean over their sum, in float64 (NaN where every row is the mean).
    Two reads of those rows: the mean, then the distances."""
    rows = np.asarray(rows, dtype=np.int64)
    total = sum(s.take(layer, rows[i:i + chunk]).astype(np.float64).sum(0) for i in range(0, len(rows), chunk))
    m = total / max(1, len(rows))  # (d,)
    a = np.concatenate([((s.take(layer, rows[i:i + chunk]).astype(np.float64) - m) ** 2).sum(1)
                        for i in range(0, len(rows), chunk)])  # (n,) a_i = ‖x_i − m‖²
    i = int(np.argmax(a))
    return (float(a[i] / a.sum()) if a.sum() > 0 else float("nan")), i


def dominance_note(sides) -> str | None:
    """``sides``: (label, state set, layers, rows compared) each. One note naming every layer of any set where one
    candidate carries a large share of the variance
    (:data:`DOMINANT_SHARE`), and which candidate: e.g. ``<|endoftext|>`` at 95% of a SmolLM2 layer over 1,000 tokens,
    where plain CKA read 0.997 and debiased CKA 0.063 for one pair, and 0.81/0.80 without that token (a walkthrough
    of the README's own example); None where no layer has one."""
    n = len(sides[0][3])
    floor = max(DOMINANT_SHARE, DOMINANT_TIMES / max(n, 1))
    hits = []
    for side, s, layers, rows in sides:
        texts = None
        for l in layers:
            share, i = dominant_row(s, l, rows)
            if share >= floor:  # NaN (a constant layer) never is
                if texts is None:
                    texts = s.texts() if s.scan_path is not None else np.array([], dtype=object)
                key = int(s.keys[rows[i]])
                what = repr(texts[rows[i]]) if len(texts) else f"{s.key} {key}"
                hits.append(f"{side} {l}: {what} carries {share:.0%}")
    if not hits:
        return None
    return ("one candidate dominates a layer's variance (" + "; ".join(hits) + "): every measure of a pair with such "
            "a layer is set by that one row (CKA reads near 1 where both layers share it and near 0 where one does "
            "not; debiased CKA and RV2 can disagree widely), so read them without it: leave it out of the scan (a "
            "special token: --exclude-special) and compare again")


#: the note on small n: plain RV/CKA's chance level (rv_null_mean) at or above this
NULL_NOTE = 0.05


def small_n_note(pairs: pd.DataFrame, n: int, dims: dict) -> str | None:
    """The note where plain RV/CKA are inflated: the largest chance level of ``pairs`` (its ``rv_null_mean``) at or
    above :data:`NULL_NOTE`, or n at most a set's dimension (``dims``: label -> d); None otherwise."""
    null = pairs["rv_null_mean"].where(np.isfinite(pairs["rv_null_mean"]))
    if not null.notna().any():  # no pair is defined
        return None
    worst = pairs.loc[null.idxmax()]
    if worst["rv_null_mean"] < NULL_NOTE and n > max(dims.values()):
        return None
    at = " × ".join(str(worst[c]) for c in (("model_a", "model_b") if "model_a" in worst.index else ("layer_a", "layer_b")))
    d = ", ".join(f"d of {k} = {v}" for k, v in dims.items())
    why = (f"n = {n:,} is at most the dimension ({d})" if n <= max(dims.values()) else
           f"the layers' effective dimension against n = {n:,} ({d})")
    return (f"{why} gives plain RV/CKA a chance level up to {worst['rv_null_mean']:.3f} (at {at}): "
            "plain RV and CKA are inflated here; read rv2 and cka_debiased")
