"""How far a token scan pads a short batch: the smallest row count whose rows come out bit for bit as in a
full batch, measured on this machine.

Why padding at all: a token's score must not depend on the job it is in (:mod:`rmfast.scoring.plan`).
GEMM libraries pick kernels by the row count M, and some kernels sum in another order, so a 7-row batch
can round differently from a 1,024-row one (``tests/test_job_independence.py`` shows it). Padding every
batch to the full row count keeps the guarantee but makes a job of 256 ids cost as much as one of 1,365.

Here a short batch of B rows runs as the smallest size of the ladder 32, 64, 128, ... (up to half the
full row count: above that a rung would save less than the probe costs) that is >= B and that was *measured* to give every row the full batch's bits: the same
deterministic ids scored in one full batch and in one batch of that size, compared with
``array_equal``. A size that differs, or that was never measured and cannot be now, is skipped (the
next one up, at worst the full batch). Verdicts are cached on disk per machine (CPU model, flags,
torch version, thread count: :func:`rmfast.cpu.machine_key`), dtype, model shapes, prompt and suffix
lengths, response length and full row count, in ``<rmfast cache>/cpu/pad-probe.json``; so the first
short batch of a new shape pays one full batch and one of the candidate size, later jobs none.

Measured: SmolLM2-135M fp32 on a 2-core AMD EPYC Zen 3 (AVX2, 1,365-row batches): every size 8-512
bit-identical to the full batch (a 7-row one is not: odd sizes take other kernels). The ladder's
smallest rung is 32, so a single id pays at most 32 rows.

Where it does not apply (the full row count, as before): CUDA (cuBLAS picks split-K kernels by shape;
not measured), the compiled CPU layer (one graph per batch shape), the plain-HF engine and rows with
their own template, and jobs without fixed shapes (text candidates).
"""

from __future__ import annotations

import hashlib
import json
import time

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
    fields = {"machine": machine_key(), "threads": torch.get_num_threads(), "dtype": str(eng.dtype), "head": eng.head,
              "head_kind": type(eng.row_head).__name__, "dims": dims, "P": eng.P, "suffix": len(eng.suffix),
              "continuation": len(eng.continuation), "n": int(n), "rows": int(rows)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:24]


class PadSizes:
    """Measured verdicts for one (engine, response length, full row count): which ladder sizes are bit-identical.

    ``cache``: the rmfast cache folder (None: verdicts live in this object only)."""

    def __init__(self, eng, n: int, rows: int, cache=None):
        self.eng, self.n, self.rows = eng, int(n), int(rows)
        self.key = shape_key(eng, n, rows)
        self.path = None if cache is None else cache / "cpu" / CACHE_NAME
        self.verdicts: dict[int, bool] = {int(s): bool(v) for s, v in self._read().get(self.key, {}).items()
                                          if str(s).isdigit()}
        self.measured: list[int] = []  # sizes measured by this object (not from the cache)
        self._full = None  # (rows,) fp32 scores of the probe ids in one full batch

    def _read(self) -> dict:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):  # a damaged cache is measured again, never an error
            return {}

    def _write(self) -> None:
        if self.path is None:
            return
        from ..io import write_json

        try:
            data = self._read()
            data[self.key] = {**{str(s): v for s, v in self.verdicts.items()},
                              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json(self.path, data)
        except OSError:  # a read-only cache: measure again next time
            pass

    def _probe_ids(self, m: int) -> torch.Tensor:
        """(m, n) deterministic candidate ids spread over the vocabulary (the first m of the full batch's)."""
        V = int(self.eng.model.get_input_embeddings().num_embeddings)
        ids = (torch.arange(self.rows * self.n, dtype=torch.long) * 7919) % V
        return ids.view(self.rows, self.n)[:m]

    def identical(self, size: int) -> bool:
        """Whether a batch of ``size`` rows gives each row the full batch's bits (cached, else measured now)."""
        if size not in self.verdicts:
            if self._full is None:
                self._full = self.eng.score(self._probe_ids(self.rows)).cpu().numpy()  # (rows,)
            part = self.eng.score(self._probe_ids(size)).cpu().numpy()  # (size,)
            self.verdicts[size] = bool(np.array_equal(part, self._full[:size], equal_nan=True))
            self.measured.append(size)
            self._write()
        return self.verdicts[size]

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
        src = "measured now" if self.measured else "measured earlier on this machine"
        parts = [f"short batches padded to the smallest of {same} rows >= the batch" if same else "no smaller size tried yet"]
        if differ:
            parts.append(f"{differ} differ from a full batch, so not used")
        return f"{'; '.join(parts)} (full batch {self.rows} rows; bit-identical rows, {src})"
