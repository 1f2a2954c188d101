"""The progress of :func:`rmfast.analysis.representations.similarity.similarity`: the work said up front, a bar over its steps,
and after the first step what the whole run takes at that pace (issue 37, item 7)."""

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


def progress_bar(tiles, variants, n: int, la, lb, enabled: bool) -> Bar:
    """Say the work up front (passes, candidates, layer pairs) and return its bar."""
    total = sum(math.ceil(len(variants) / per) for _, _, per in tiles)
    if enabled:
        print(f"rmfast: similarity: {len(variants)} passes (1 + bootstrap + permutations) over {n:,} candidates × "
              f"{len(la)} × {len(lb)} layer pairs, in {total} steps", file=sys.stderr, flush=True)
    return Bar(total, enabled)
