"""The progress of :func:`rmfast.analysis.representations.similarity.similarity`: the work and its cost said up front
(one timed pass times the replicates; issue 51, item 4), a bar over its steps, and after the first step what the
whole run takes at that pace (issue 37, item 7)."""

from __future__ import annotations

import math
import sys
import time


class Bar:
    """similarity's progress: a tqdm bar over its steps and, after the first, the whole run's estimate."""

    def __init__(self, total: int, enabled: bool):
        from tqdm.auto import tqdm

        self.total, self.enabled, self.t0, self.done = total, enabled, time.perf_counter(), 0
        self.tqdm = tqdm(total=total, unit="step", desc="similarity", disable=not enabled, dynamic_ncols=True)

    def step(self) -> None:
        self.done += 1
        if self.done == 1 and self.enabled and self.total > 1:
            first = time.perf_counter() - self.t0
            print(f"rmfast: similarity: the first of {self.total} steps took {first:.1f} s: about "
                  f"{first * self.total / 60:.1f} min in all", file=sys.stderr, flush=True)
        self.tqdm.update(1)

    def close(self) -> None:
        self.tqdm.close()


def timed(step):
    """``step()`` and the seconds it took.

    >>> timed(lambda: 7)[0]
    7
    """
    t0 = time.perf_counter()
    return step(), time.perf_counter() - t0


def _duration(s: float) -> str:
    """Seconds in words, to the precision an estimate has.

    >>> _duration(7.3), _duration(95), _duration(5400)
    ('7 s', '1.6 min', '1.5 h')
    """
    return f"{s:.0f} s" if s < 60 else f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.1f} h"


def cost_line(n_boot: int, n_perm: int, n: int, la, lb, pass_s: float) -> str:
    """What the replicates will do and about how long, before they start (issue 51, item 4): each bootstrap
    replicate or permutation costs about one pass like the observed one, timed here (``pass_s``).

    >>> cost_line(0, 19, 1000, ["8", "16"], ["8", "16"], 0.5)[:64]
    'rmfast: similarity: 0 bootstrap replicates and 19 permutations o'
    """
    return (f"rmfast: similarity: {n_boot} bootstrap replicates and {n_perm} permutations over {n:,} candidates × "
            f"{len(la)} × {len(lb)} layer pairs: one pass (the observed measures) took {pass_s:.2g} s here and each "
            f"replicate costs about one more, so about {_duration(pass_s * (n_boot + n_perm))} to go "
            "(--bootstrap, --permutations set how many)")


def progress_bar(tiles, variants, n: int, la, lb, enabled: bool, pass_s: float) -> Bar:
    """Say the work up front (replicates, candidates, layer pairs; about how long at ``pass_s`` seconds a pass)
    and return its bar."""
    total = sum(math.ceil(len(variants) / per) for _, _, per in tiles) if variants else 0
    if enabled:
        n_perm = sum(v[0] == "perm" for v in variants)
        print(cost_line(len(variants) - n_perm, n_perm, n, la, lb, pass_s) + f", in {total} steps",
              file=sys.stderr, flush=True)
    return Bar(total, enabled)
