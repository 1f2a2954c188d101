"""Padding a short batch: the smallest row count whose rows come out bit for bit as in a full batch, measured on
this machine (:class:`PadSizes`; the why and the guarantee: :mod:`rmfast.scoring.batching`, docs/determinism.md)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
import weakref

import numpy as np
import torch


#: the ladder's smallest rung; sizes double from it up to half the full row count
PAD_MIN = 32
CACHE_NAME = "pad-probe.json"


def ladder(rows: int) -> list[int]:
    """The padded sizes tried for a full batch of ``rows`` rows, ascending: up to half of it (a batch of more
    rows runs full; a rung above half would save less than the probe's one full batch costs).

    >>> ladder(1365)
    [32, 64, 128, 256, 512]
    >>> ladder(63)
    []
    """
    out, s = [], PAD_MIN
    while s <= rows // 2:
        out.append(s)
        s *= 2
    return out


def shape_key(eng, n: int, rows: int) -> str:
    """What decides which kernels a batch runs, besides the machine: the model's shapes, dtype, head,
    the prompt's and the suffix's lengths, the response length and the full row count."""
    from ..cpu import machine_key

    cfg = eng.model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    dims = {k: getattr(cfg, k, None) for k in ("model_type", "hidden_size", "intermediate_size", "num_attention_heads",
                                               "num_key_value_heads", "head_dim", "num_hidden_layers", "vocab_size",
                                               "sliding_window")}
    w0, c0 = eng.layers[0]
    fields = {"machine": machine_key(), "threads": torch.get_num_threads(), "dtype": str(eng.dtype), "head": eng.head,
              "head_kind": type(eng.row_head).__name__, "dims": dims, "P": eng.P, "suffix": len(eng.suffix),
              "continuation": len(eng.continuation), "n": int(n), "rows": int(rows),
              # the engine's kernels: its attention form, fused projections and elementwise kernels, fp32 head
              "attention": eng.attention, "fused_qkv": len(w0.w_qkv) == 1, "elementwise": bool(c0.fused),
              "triton": bool(eng.triton), "fp32_head": eng.fp32_head}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


#: the probe's full-batch scores per model (weakly), shape key, template, head output and weights: a second plan of
#: one shape (GCG's random baseline after its search) measures another rung without scoring the full batch again
_FULL_SCORES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _about(seconds: float | None) -> str:
    """ ``, about 50 s`` / ``, about 3 min``: an estimate for a line that announces a wait ("" without one).

    >>> _about(52.4), _about(190), _about(0.3), _about(None)
    (', about 52 s', ', about 3 min', ', about 1 s', '')
    """
    if seconds is None:
        return ""
    return f", about {max(1, round(seconds))} s" if seconds < 120 else f", about {round(seconds / 60)} min"


class PadSizes:
    """Measured verdicts for one (engine, response length, full row count): which ladder sizes are bit-identical.

    ``cache``: the rmfast cache folder (None: verdicts live in this object only)."""

    def __init__(self, eng, n: int, rows: int, cache=None):
        self.eng, self.n, self.rows = eng, int(n), int(rows)
        self.key = shape_key(eng, n, rows)
        self.path = None if cache is None else cache / "cpu" / CACHE_NAME
        self.verdicts: dict[int, bool] = self._cached()
        self.measured: list[int] = []  # sizes measured by this object (not from the cache)
        self.probe_s = 0.0  # seconds this object spent measuring (a job's rate leaves them out)
        self._full = None  # (rows,) fp32 scores of the probe ids in one full batch

    def _cached(self) -> dict[int, bool]:
        """This key's verdicts from the cache file: {size: identical}. An entry of another shape (a list, a
        number: a damaged or hand-edited cache) is measured again, never an error."""
        from ..cpu import read_verdicts

        entry = read_verdicts(self.path).get(self.key)
        if not isinstance(entry, dict):
            return {}
        return {int(s): v for s, v in entry.items() if str(s).isdigit() and isinstance(v, bool)}

    def _write(self) -> None:
        from ..cpu import write_verdict

        write_verdict(self.path, self.key, {str(s): v for s, v in self.verdicts.items()})

    def _probe_ids(self, m: int) -> torch.Tensor:
        """(m, n) deterministic candidate ids spread over the vocabulary (the first m of the full batch's)."""
        V = int(self.eng.model.get_input_embeddings().num_embeddings)
        ids = (torch.arange(self.rows * self.n, dtype=torch.long) * 7919) % V
        return ids.view(self.rows, self.n)[:m]

    def identical(self, size: int) -> bool:
        """Whether a batch of ``size`` rows gives each row the full batch's bits (cached, else measured now)."""
        if size not in self.verdicts:
            t0 = time.perf_counter()
            ids = self._probe_ids(size)
            part = self.eng.score(ids).cpu().numpy()  # (size,)
            if self._full is None:  # the short batch first: its time estimates the full one's, said before it runs
                self._full = self._full_scores(estimate=lambda: self._warm_s(ids) * self.rows / size)
            self.verdicts[size] = bool(np.array_equal(part, self._full[:size], equal_nan=True))
            self.measured.append(size)
            self._write()
            self.probe_s += time.perf_counter() - t0
        return self.verdicts[size]

    def _warm_s(self, ids: torch.Tensor) -> float:
        """Seconds of a second, warm run of the short batch ``ids``: the first run of a shape pays its one-off set-up,
        which made the full batch's estimate 5-16x its time on a 2-core EPYC ("about 5 min" for 18 s)."""
        t0 = time.perf_counter()
        self.eng.score(ids)
        return time.perf_counter() - t0

    def _full_scores(self, estimate=None) -> np.ndarray:
        """(rows,) scores of the probe ids in one full batch: scored now, or by an earlier plan of this process.
        ``estimate``: () -> the estimated seconds of the full batch, asked only when it runs and said in the line
        before it (it can take a minute and ran without a word: a scan looked hung)."""
        t, memo = self.eng.template, _FULL_SCORES.setdefault(self.eng.model, {})
        # an optimizer step (in place: a version bump) or new .data (a new pointer) makes it another model
        weights = hash(tuple((p.data_ptr(), p._version) for p in self.eng.model.parameters()))
        k = (self.key, tuple(t.prefix_ids), tuple(t.suffix_ids), tuple(t.continuation_ids), self.eng.head_index, weights)
        if k not in memo:
            est_s = estimate() if estimate is not None else None
            print(f"rmfast: measuring once which short batches give a full batch's bits here: one batch of "
                  f"{self.rows} rows{_about(est_s)}, cached for later jobs of this shape, and left out of the rate",
                  file=sys.stderr, flush=True)
            memo[k] = self.eng.score(self._probe_ids(self.rows)).cpu().numpy()  # (rows,)
        return memo[k]

    def rows_for(self, B: int) -> int:
        """Rows to run a batch of B real rows as: the smallest bit-identical ladder size >= B, else the full count."""
        for s in ladder(self.rows):
            if s >= B and self.identical(s):
                return s
        return self.rows

    def summary(self) -> str:
        """One line for the manifest: which sizes were found identical, and where that came from."""
        same = sorted(s for s, v in self.verdicts.items() if v)
        differ = sorted(s for s, v in self.verdicts.items() if not v)
        src = f"measured now, {self.probe_s:.1f} s" if self.measured else "measured earlier on this machine"
        parts = [f"short batches padded to the smallest of {same} rows >= the batch" if same else "no smaller size tried yet"]
        if differ:
            parts.append(f"{differ} differ from a full batch, so not used")
        return f"{'; '.join(parts)} (full batch {self.rows} rows; bit-identical rows, {src})"
