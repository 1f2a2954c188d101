"""Guards of a similarity computation (:func:`rmfast.analysis.representations.similarity.similarity`): how many resamples
may be asked for, and which layers have no defined measure.

Example:
    >>> check_replicates(50, 49, one_pass=lambda: None)         # within the bound: nothing to say
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd

from ...errors import UserError

#: the measures of a layer pair, in the order of the result's columns
MEASURES = ("cka", "cka_debiased", "rv", "rv2")
#: at most this many bootstrap replicates, and as many permutations (p-values down to ~1e-4): each one
#: is another pass over every shared candidate's states
MAX_REPLICATES = 10_000


def check_replicates(bootstrap: int, permutations: int, one_pass) -> None:
    """Refuse more than :data:`MAX_REPLICATES` of either, in one line with the time they would take here:
    ``one_pass()`` runs (and times) one pass, the cost of each replicate."""
    if bootstrap <= MAX_REPLICATES and permutations <= MAX_REPLICATES:
        return
    t0 = time.perf_counter()
    one_pass()
    t = time.perf_counter() - t0
    est = t * (1 + bootstrap + permutations)
    when = f"{est / 3600:,.0f} hours" if est >= 3600 else f"{est:,.0f} s"
    raise UserError(f"--bootstrap {bootstrap:,} / --permutations {permutations:,}: at most {MAX_REPLICATES:,} each "
                    f"(p-values down to {1 / (1 + MAX_REPLICATES):.0e}); each replicate is a pass over the states, "
                    f"{t:.3g} s here, so these would take about {when}")


def undefined_note(pairs: pd.DataFrame, a, b, la, lb) -> str | None:
    """A note naming the layers whose measures are undefined (NaN): constant across candidates (layer 0
    of a token scan), or holding NaN/inf states (counted in the states manifest, e.g. a float16 overflow).
    A layer is named when its pairs with every layer of the other side that has some defined pair are NaN."""
    ok = pd.Series(np.isfinite(pairs[list(MEASURES)].to_numpy(dtype=float)).all(axis=1), index=pairs.index)
    if ok.all():
        return None
    good = {"a": set(pairs.loc[ok, "layer_a"]), "b": set(pairs.loc[ok, "layer_b"])}  # layers with a defined pair
    why = []
    for side, other, s, layers in (("a", "b", a, la), ("b", "a", b, lb)):
        counts = s.manifest.get("n_nonfinite") if isinstance(s.manifest.get("n_nonfinite"), dict) else {}
        for l in layers:
            n_bad = counts.get(l) if isinstance(counts.get(l), int) else 0
            vs = pairs[(pairs[f"layer_{side}"] == l) & pairs[f"layer_{other}"].isin(good[other])]
            if n_bad or (len(vs) and not ok[vs.index].any()):
                why.append(f"{side.upper()} {l} ({f'{n_bad:,} NaN/inf values' if n_bad else 'constant across candidates'})")
    return (f"{int((~ok).sum())} of {len(pairs)} layer pairs have undefined measures (NaN): "
            + (", ".join(why) if why else "every pair holds a layer that is constant or has NaN/inf values")
            + "; leave those layers out")
