"""How a job's rows become batches: how many rows a batch may hold, how far a short batch is padded, and the
loop that runs the batches.

**Rows per batch** (:func:`row_bytes`, :func:`auto_batch_size`, :func:`cap_batch_size`): estimated activation
bytes per row against the memory free. On CPU, memory pressure raises no out-of-memory error to back off from
(it swaps, or the process is killed), so every batch size, chosen or asked for, is bounded by an estimate made
up front.

**Padding** (:class:`PadSizes`): how far a token scan pads a short batch: the smallest row count whose rows come out bit for bit as in a
full batch, measured on this machine.

Why: a token's score must not depend on its job (:mod:`rmfast.scoring.plan`), and GEMM libraries pick kernels
by the row count, so a 7-row batch can round differently from a 1,024-row one (``tests/test_job_independence.py``).
A short batch of B rows runs as the smallest rung of 32, 64, 128, ... (up to half the full row count) that is
>= B and was *measured* here to give every row the full batch's bits (the same ids in one full batch and in one
of that size, ``array_equal``); a size that differs is never used (at worst the full batch). Verdicts are cached
per machine (:func:`rmfast.cpu.machine_key`), model shapes, lengths, row count and the engine's kernels in
``<rmfast cache>/cpu/pad-probe.json``; the full batch's probe scores are kept for the process. Not applied: CUDA
(not measured), the compiled CPU layer (one graph per shape), the plain-HF engine, rows with their own template
and text candidates. Measurements and the guarantee: docs/determinism.md.

**The loop** (:func:`score_groups`): the batching loop every scoring job runs: fixed batches, out-of-memory back-off, a checkpoint that
a rerun resumes from bit-identically, a progress bar, timing, and the count of non-finite scores.

A job hands it *groups* (:class:`Group`: rows of one shape and the function that scores them);
:func:`score_groups` runs them and returns the scores. The scan pipeline (:mod:`rmfast.scoring.pipeline`),
sweeps, torchrun shards and GCG's evaluator (:func:`oom_batches`) all come through here.
"""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..cpu import round_rate
from ..dims import model_dims
from ..errors import UserError, UserNote
from ..io import atomic_write, say_on_interrupt, then_always


# --------------------------------------------------------------------------------------------
# rows per batch: the memory a batch's activations take

#: a batch's estimated activations may take at most this fraction of the memory available when
#: the job starts (the rest: the allocator's slack, temporaries the estimate leaves out, other programs)
MEM_FRACTION = 0.5


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device``, or None where unknown.

    CUDA: ``torch.cuda.mem_get_info``. CPU (Linux): ``MemAvailable`` of /proc/meminfo, or less when
    a cgroup (a container) limits this process (memory.max - memory.current).
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type != "cpu":
        return None
    avail = None
    try:
        with open("/proc/meminfo") as f:  # closed here: a ResourceWarning in every caller's test run otherwise
            avail = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail, int(limit) - used) if avail is not None else int(limit) - used
    except (OSError, ValueError):
        pass
    return avail


def row_bytes(model, tokens_per_row: int, *, prefix_len: int = 0, head: str = "score", full_sequence: bool = False) -> int:
    """Estimated peak activation bytes one row of a batch needs (upper-bound style, from the config).

    One decoder layer's activations are live at a time (inference): per token the residual stream and
    its norm/attention outputs (4·hidden), q|k|v ((H + 2·Hkv)·D) and the MLP's gate, up and product
    (3·intermediate), in the model's dtype; the attention scores and their softmax (2·H·T·(P + T),
    fp32); with ``full_sequence`` (the plain-HF path) every layer's K/V cache; for the logprob head an
    fp32 logits block per token (a vocabulary chunk of 8,192 on the fast path, the whole vocabulary
    with ``full_sequence``).

    >>> from types import SimpleNamespace as NS
    >>> cfg = NS(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    ...          num_hidden_layers=3, vocab_size=1000)
    >>> m = NS(config=cfg, parameters=lambda: iter([torch.zeros(1, dtype=torch.float32)]))
    >>> row_bytes(m, 2, prefix_len=10)  # 2·(4·64 + (4+4)·16 + 3·96)·4 + 2·4·2·12·4
    6144
    """
    dm = model_dims(model.config)
    hid, inter, H, kv, D = dm.hidden, dm.intermediate, dm.heads, dm.kv_heads, dm.head_dim
    nbytes = next(model.parameters()).element_size()
    T = max(1, int(tokens_per_row)) + (int(prefix_len) if full_sequence else 0)
    keys = T + (0 if full_sequence else int(prefix_len))
    per = T * (4 * hid + (H + 2 * kv) * D + 3 * inter) * nbytes + 2 * H * T * keys * 4
    if full_sequence:
        per += dm.layers * T * 2 * kv * D * nbytes
    if head == "logprob":
        per += 2 * T * (int(dm.vocab) if full_sequence else min(8192, int(dm.vocab))) * 4
    return int(per)


def memory_cap(device: torch.device, per_row: int | None, available: int | None = None) -> int | None:
    """Most rows whose activations (``per_row`` bytes each) fit in MEM_FRACTION of the available
    memory (``available``, default :func:`available_memory`); None where unknown.

    >>> memory_cap(torch.device("cpu"), 1_000_000, available=100_000_000)
    50
    >>> memory_cap(torch.device("cpu"), 10**12, available=100_000_000)  # at least one row
    1
    """
    if not per_row:
        return None
    avail = available_memory(device) if available is None else available
    if avail is None:
        return None
    return max(1, int(MEM_FRACTION * avail) // int(per_row))


def auto_batch_size(device: torch.device, tokens_per_row: int, per_row: int | None = None,
                    available: int | None = None, vocab: int | None = None) -> int:
    """CPU: ~4k tokens per batch keeps GEMMs large and activations in cache. CUDA: start big; OOM halves it.

    With ``per_row`` (:func:`row_bytes`), never more rows than fit in memory (:func:`memory_cap`): on
    CPU memory pressure raises no out-of-memory error to back off from, it swaps or gets killed.
    ``vocab`` (a one-token scan's vocabulary, the model's embedding rows): on CUDA, rows that split it into
    equal batches (:func:`vocab_balanced`), since every short batch there runs padded to the full row count.

    >>> auto_batch_size(torch.device("cpu"), 4)
    1024
    >>> auto_batch_size(torch.device("cpu"), 4, per_row=1_000_000, available=100_000_000)
    50
    >>> auto_batch_size(torch.device("cuda"), 2), auto_batch_size(torch.device("cuda"), 2, vocab=128_256)
    (16384, 16128)
    """
    if device.type == "cuda":
        bs = max(64, min(16384, 131072 // max(1, tokens_per_row)))
    else:
        bs = max(32, min(2048, 4096 // max(1, tokens_per_row)))
    cap = memory_cap(device, per_row, available)
    bs = bs if cap is None else min(bs, cap)
    return vocab_balanced(bs, vocab) if vocab and device.type == "cuda" else bs


#: :func:`vocab_balanced` rounds a batch up to whole multiples of this many rows (GEMM tiles of 128 and 256)
BALANCE_GRAIN = 256


def vocab_balanced(rows: int, vocab: int, grain: int = BALANCE_GRAIN) -> int:
    """Rows per batch, at most ``rows``, for the fewest equal batches that cover ``vocab`` ids, rounded up to
    ``grain`` rows: a whole-vocabulary scan pads its last batch by less than ``grain`` rows per batch, not by
    up to a whole batch. A property of the model (its vocabulary), never of the job's candidate count, so a
    token's score is the same in a ten-id job and in the whole scan (docs/determinism.md). ``rows`` itself
    where rounding up would pass it, or where it is under one grain.

    >>> vocab_balanced(16384, 128_256), vocab_balanced(16384, 151_936), vocab_balanced(16384, 262_144)
    (16128, 15360, 16384)
    >>> vocab_balanced(5000, 128_256), vocab_balanced(100, 128_256)  # 26 batches of 4,933 -> 5,120 > 5,000
    (5000, 100)
    """
    if rows < grain or vocab <= 0:
        return rows
    n_batches = -(-vocab // rows)
    per = -(-vocab // n_batches)  # ceil: the batches' even share
    per = -(-per // grain) * grain
    return per if per <= rows else rows


def cap_batch_size(bs: int, device: torch.device, per_row: int | None, available: int | None = None) -> int:
    """A batch size the user chose, lowered (with a one-line warning) to what fits in memory."""
    cap = memory_cap(device, per_row, available)
    if cap is None or bs <= cap:
        return bs
    avail = available_memory(device) if available is None else available
    warnings.warn(UserNote(f"rmfast: --batch-size {bs} needs ~{bs * per_row / 2**30:.2g} GiB of activations, over "
                           f"{MEM_FRACTION:.0%} of the {avail / 2**30:.2g} GiB available on {device.type}; using {cap}"),
                  stacklevel=3)
    return cap


# padding: rmfast.scoring.padding (re-exported here, where callers have always found it)
from .padding import CACHE_NAME, PAD_MIN, PadSizes, ladder, shape_key  # noqa: E402,F401


# --------------------------------------------------------------------------------------------
# the batching loop


#: a long job saves its finished batches at least this often (seconds), so a kill loses at most
#: this much work plus one batch ...
CHECKPOINT_EVERY_S = 5.0
#: ... and after this many newly scored candidates (a CPU batch or a few), but ...
CHECKPOINT_EVERY_N = 1024
#: ... never twice within this many seconds: a save (the ids and scores so far, ~2 MB for a
#: 150k vocabulary) costs a few ms, which fast GPU batches must not pay every time.
CHECKPOINT_MIN_S = 0.5


#: rows of one ragged bucket are padded to its longest: at most this fraction longer than its shortest,
#: plus a few tokens (padding waste bounded, and short rows are never padded to long ones)
BUCKET_SPREAD = 0.25
BUCKET_SLACK = 4


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """Ascending response lengths cut into runs whose longest is at most (1 + BUCKET_SPREAD) x the
    shortest + BUCKET_SLACK tokens.

    >>> length_buckets([20, 21, 24, 25, 31, 60, 61, 200])
    [[20, 21, 24, 25], [31], [60, 61], [200]]
    """
    out: list[list[int]] = []
    for n in lengths:
        if out and n <= (1 + BUCKET_SPREAD) * out[-1][0] + BUCKET_SLACK:
            out[-1].append(n)
        else:
            out.append([n])
    return out


@dataclass
class Group:
    """Rows of one shape scored by one function.

    Attributes:
        rows: (n,) positions in the job's score array.
        batch_size: rows per batch (halved on out-of-memory).
        score: ``score(rows, batch_size) -> (len(rows),) float32 scores``.
        packed: its rows of several lengths run packed back to back, no padding (the fast engine's cascade
            form); False: right-padded to each batch's longest.
        tokens: (n,) each row's tokens (a packed group's batches are sized in tokens, :meth:`cut`); None: rows.
        rows_cap: a packed group's batches hold at most ``batch_size`` rows too (a batch size the caller asked for:
            rows per batch, as documented; ``batch_size=1`` scores each row alone, independent of the call's others).
    """

    rows: np.ndarray
    batch_size: int
    score: Callable[[np.ndarray, int], np.ndarray]
    packed: bool = False
    tokens: np.ndarray | None = None
    rows_cap: bool = False

    def cut(self, lo: int, bs: int) -> int:
        """The end of the batch that starts at row ``lo`` at ``bs`` rows per batch: ``bs`` rows, or, for a packed
        group, as many rows as fit the tokens ``bs`` of its longest rows would hold (the memory ``bs`` was sized
        for; rows of mixed lengths packed with no pad token fill it, where ``bs`` rows would leave it part empty).

        >>> g = Group(np.arange(6), 2, None, packed=True, tokens=np.array([1, 1, 2, 2, 5, 5]))
        >>> [g.cut(0, 2), g.cut(4, 2), Group(np.arange(6), 2, None).cut(0, 2)]
        [4, 6, 2]
        >>> Group(np.arange(6), 2, None, packed=True, tokens=np.array([1, 1, 2, 2, 5, 5]), rows_cap=True).cut(0, 2)
        2
        """
        n = self.rows.size
        if not self.packed or self.tokens is None:
            return min(n, lo + bs)
        fits = max(1, int(np.searchsorted(np.cumsum(self.tokens[lo:]), bs * int(self.tokens.max()), side="right")))
        return lo + (min(fits, bs) if self.rows_cap else fits)

    def batches(self) -> list[tuple[int, int]]:
        """The (lo, hi) row ranges of its batches at ``batch_size`` (no out-of-memory)."""
        out, lo = [], 0
        while lo < self.rows.size:
            out.append((lo, self.cut(lo, self.batch_size)))
            lo = out[-1][1]
        return out


def oom_batches(n: int, bs: int, device: torch.device, score, on_oom=None, cut=None):
    """Score rows 0..n-1 in batches: yields (lo, hi, out, bs) with ``out = score(lo, hi, bs)``; ``cut(lo, bs)``
    gives a batch's end (:meth:`Group.cut`; None: ``lo + bs``).

    On out-of-memory the batch is halved (``on_oom(new_bs)`` is told) and the same rows retried;
    at one row the error propagates.
    """
    lo = 0
    while lo < n:
        hi = min(n, lo + bs) if cut is None else cut(lo, bs)
        try:
            out = score(lo, hi, bs)
        except torch.OutOfMemoryError:
            if bs == 1:
                raise
            bs = max(1, bs // 2)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if on_oom is not None:
                on_oom(bs)
            continue
        yield lo, hi, out, bs
        lo = hi


def load_checkpoint(path: Path | None, key: str, ids: np.ndarray,
                    job: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The scores saved for this job, which rows are done, and its groups' batch sizes.

    A done row may hold NaN (a score that came out NaN or infinite), so "done" is kept apart from
    the scores. With no checkpoint, nothing is done. A checkpoint of another job (another ``key``:
    model content, prompt, template, head, dtype, engine; or other ``ids``) or an unreadable one is
    never trusted: the job starts afresh, as it always has, and one note says why (its first save
    replaces the old file). ``job`` (the fields behind ``key``) lets the note name what changed.
    """
    scores, done, sizes = np.full(ids.size, np.nan, dtype=np.float32), np.zeros(ids.size, dtype=bool), None
    if path is None or not path.exists():
        return scores, done, sizes
    try:
        z = np.load(path, allow_pickle=False)
        why = other_job(z, key, job, ids)
        if why is None:
            scores = z["scores"].astype(np.float32)
            done = z["done"].astype(bool) if "done" in z else ~np.isnan(scores)  # older checkpoints: NaN = to do
            sizes = z["batch_sizes"] if "batch_sizes" in z else None
    except Exception:
        why = "it cannot be read"
    if why is not None:
        warnings.warn(f"rmfast: note: not resuming from {path}: {why}; this job starts afresh", stacklevel=3)
    return scores, done, sizes


def other_job(z, key: str, job: dict | None, ids: np.ndarray | None = None) -> str | None:
    """Why the checkpoint ``z`` (a scan's, or a GCG search's: :mod:`rmfast.gcg.checkpoint`) is not this job's
    (None: it is). ``ids``: the candidates a scan's checkpoint must hold (None: no candidates to compare)."""
    if str(z["key"]) == key:
        return None if ids is None or np.array_equal(z["ids"], ids) else "it holds other candidates"
    old = json.loads(str(z["job"])) if "job" in z else None
    if not isinstance(old, dict) or not old or job is None:
        return "it was saved by another job"
    new = json.loads(json.dumps(job, sort_keys=True, default=str))
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed == ["model"] and _same_but_content(old["model"], new["model"]):
        return "the model's files (weights or config) changed since it was saved"
    if changed == ["path"] and isinstance(old.get("path"), dict) and isinstance(new.get("path"), dict):
        return f"it was saved on another path ({_was_is(old['path'], new['path'])})"  # the decisions that differ
    if not changed:
        return "it was saved by another job"
    named = [f"{k} ({_was_is(old[k], new[k])})" if isinstance(old.get(k), dict) and isinstance(new.get(k), dict) else k
             for k in changed]  # (a GCG search's settings: which of them, not only "gcg")
    return f"it was saved for a job whose {', '.join(named)} differed"


def _was_is(o: dict, n: dict, most: int = 4) -> str:
    """The keys of two settings that differ, as they were and are (values cut at 40 characters).

    >>> _was_is({"search_width": 8, "topk": 8}, {"search_width": 16, "topk": 8})
    'search_width: 8 -> 16'
    """
    def cut(v) -> str:
        r = v if isinstance(v, str) else json.dumps(v, default=str)
        return r if len(r) <= 40 else r[:39] + "…"

    d = [f"{k}: {cut(o.get(k))} -> {cut(n.get(k))}" for k in sorted(set(o) | set(n)) if o.get(k) != n.get(k)]
    return ", ".join(d[:most]) + (" …" if len(d) > most else "")


def _same_but_content(a, b) -> bool:
    """Two model provenances that differ only in what names their content (a folder edited in place)."""
    content = ("content_sha256", "tokenizer_sha256", "sha256", "revision")
    return isinstance(a, dict) and isinstance(b, dict) and (
        {k: v for k, v in a.items() if k not in content} == {k: v for k, v in b.items() if k not in content})


def save_checkpoint(path: Path, key: str, ids: np.ndarray, scores: np.ndarray, done: np.ndarray, batch_sizes,
                    job: dict | None = None, lens: np.ndarray | None = None) -> None:
    extra = {} if lens is None else {"lens": lens}

    def w(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, key=np.array(key), ids=ids, scores=scores, done=done,
                     batch_sizes=np.asarray(batch_sizes, dtype=np.int64),
                     job=np.array(json.dumps(job or {}, sort_keys=True, default=str)), **extra)

    atomic_write(path, w)


def load_lens(path: Path | None, n: int, k: int, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lens columns a checkpoint holds ((n, k) float32, NaN where not scored) and the done rows
    that have them (a checkpoint saved without the lens, or with another k, has none)."""
    lens = np.full((n, k), np.nan, dtype=np.float32)
    if path is None or not path.exists() or not done.any():
        return lens, done
    try:
        z = np.load(path, allow_pickle=False)
        if "lens" in z and z["lens"].shape == lens.shape:
            return z["lens"].astype(np.float32), done
    except Exception:
        pass
    return lens, np.zeros_like(done)


def score_groups(groups: list[Group], ids: np.ndarray, *, key: str, checkpoint=None, device=None,
                 progress: bool = True, desc: str = "scan", status: str | None = None,
                 keep_checkpoint: bool = False, job: dict | None = None, states_out=None,
                 lens_k: int = 0, extra: dict | None = None) -> tuple[np.ndarray, dict]:
    """Run every group through fixed batches; returns (scores (N,) float32, timing).

    ``ids`` identifies the job's rows (token ids, or row numbers) for the checkpoint. Batches are
    cut from each group's full row list, and a batch whose rows a checkpoint already holds is
    skipped, so a resumed job runs exactly the batches of an uninterrupted one: the checkpoint also
    holds each group's batch size (a memory-bounded size may differ on a rerun), which the rerun
    uses. The checkpoint is written every CHECKPOINT_EVERY_S seconds or CHECKPOINT_EVERY_N
    candidates (not within CHECKPOINT_MIN_S of the last save), and on any exception (Ctrl-C
    included); with ``keep_checkpoint`` also at the end, so that the scores survive until the
    caller has written its output (and removed the checkpoint, :func:`drop_checkpoint`). ``job``: the
    fields behind ``key`` (:func:`rmfast.scoring.plan.run_fields`), saved so that a mismatch can be named.

    A score that comes out NaN or infinite (an overflow: fp16 activations past 65,504) is stored
    as NaN, batch by batch; the caller counts and reports them (:func:`count_nonfinite`).

    States and lens (a group's ``score`` returns :class:`rmfast.scoring.plan.Scored`):
    ``states_out`` (``prepare(done) -> done``, ``add(rows, keys, states)``, ``flush()``, e.g.
    :class:`rmfast.states.StatesWriter`) gets each batch's states keyed by ``ids``, and is flushed
    with every checkpoint save, so no row the checkpoint holds as done loses its state
    unnoticed (the rows it holds as done without a state are scored again on resume,
    :meth:`rmfast.states.StatesWriter.prepare`); one with ``drain()`` (a writer thread,
    :class:`rmfast.scoring.states_stream.BackgroundWriter`) is drained before the job returns or raises.
    ``lens_k``: the lens columns, kept in the checkpoint too and returned in ``extra["lens"]``
    ((N, lens_k) float32).
    """
    from tqdm.auto import tqdm

    device = torch.device(device or "cpu")
    ck = Path(checkpoint) if checkpoint else None
    if ck is not None and ck.is_dir():  # its first save raised IsADirectoryError after batches were scored
        raise UserError(f"checkpoint {ck} is a folder; give a file path for the checkpoint (e.g. {ck / 'scan.ckpt.npz'})")
    scores, done, sizes = load_checkpoint(ck, key, ids, job)
    _resume_sizes(groups, sizes, ck)
    sizes = [g.batch_size for g in groups]
    lens, done = load_lens(ck, ids.size, lens_k, done) if lens_k else (None, done)
    done = states_out.prepare(done) if states_out is not None else done
    done0 = int(done.sum())

    def save():  # the scores first (a full disk keeps them); a row done without its state is rescored on resume
        save_checkpoint(ck, key, ids, scores, done, sizes, job, lens)
        if states_out is not None:
            states_out.flush()
        _say_resume(ck, int(done.sum()), ids.size)

    _say_resume(ck, done0, ids.size)
    # a writer thread's shards all on disk (and its error raised) before the job returns or raises, whatever happens
    drain = getattr(states_out, "drain", None) or (lambda: None)


    bar = tqdm(total=ids.size, initial=done0, unit="cand", desc=desc, disable=not progress, dynamic_ncols=True)
    if done0 < ids.size:  # a first batch of a slow model runs for minutes: say what runs, not a bare "0/N ?cand/s"
        bar.set_postfix_str(status or first_batch_status(groups, done))
    t0 = last_ck = time.perf_counter()
    first_batch_s, n_since_ck, halved = None, 0, []  # halved: the sizes an out-of-memory cut batches to
    on_oom = lambda b: (halved.append(b), bar.set_postfix_str(f"OOM: batch -> {b}"))  # noqa: E731
    try:
        for i, g in enumerate(groups):
            for lo, hi, out, bs in oom_batches(g.rows.size, g.batch_size, device, lambda lo, hi, b, g=g: _batch(g, done, lo, hi, b),
                                               on_oom, g.cut):
                if bs != g.batch_size:  # halved after an out-of-memory: the manifest and a resumed job run it too
                    g.batch_size = sizes[i] = bs
                if out is None:  # already in the checkpoint
                    continue
                if isinstance(out, tuple):  # Scored: scores, states, lens
                    out, st, ln = out
                    if states_out is not None:
                        states_out.add(g.rows[lo:hi], ids[g.rows[lo:hi]], st)
                    if lens is not None:
                        lens[g.rows[lo:hi]] = ln
                out = np.asarray(out, dtype=np.float32)
                scores[g.rows[lo:hi]] = np.where(np.isfinite(out), out, np.float32(np.nan))
                done[g.rows[lo:hi]] = True
                if first_batch_s is None:
                    first_batch_s = time.perf_counter() - t0
                    bar.set_postfix_str("")
                bar.update(hi - lo)
                n_since_ck += hi - lo
                since = time.perf_counter() - last_ck
                if ck is not None and (since > CHECKPOINT_EVERY_S or (n_since_ck >= CHECKPOINT_EVERY_N and since >= CHECKPOINT_MIN_S)):
                    save()
                    last_ck, n_since_ck = time.perf_counter(), 0
    except BaseException:  # interrupted (Ctrl-C, a kill that Python sees, an error): keep what is done for the rerun
        then_always(lambda: save() if ck is not None and int(done.sum()) > done0 else None, drain)
        raise
    bar.close()
    scan_s = time.perf_counter() - t0
    then_always(save if ck is not None and keep_checkpoint and int(done.sum()) > done0 else
                states_out.flush if states_out is not None else lambda: None, drain)
    if extra is not None and lens is not None:
        extra["lens"] = lens
    n_new = ids.size - done0
    return scores, {
        "first_batch_s": round(first_batch_s, 3) if first_batch_s is not None else None,
        "scan_s": round(scan_s, 3),
        "candidates_per_s": round_rate(n_new / scan_s) if scan_s > 0 and n_new else None,
        "resumed_candidates": done0,
        "scored_candidates": int(done.sum()) - done0,
        **({"oom_halvings": len(halved)} if halved else {}),
    }


def _resume_sizes(groups: list[Group], sizes, ck: Path | None) -> None:
    """The checkpoint's batch sizes for its groups (a resumed job runs the batches of an uninterrupted one: the same
    bits), said where they differ from this run's: a batch size lowered after the OOM killer's kill would be lost."""
    if sizes is None or len(sizes) != len(groups):
        return
    other = [(g.batch_size, int(b)) for g, b in zip(groups, sizes) if g.batch_size != int(b)]
    for g, b in zip(groups, sizes):
        g.batch_size = int(b)
    if other:
        warnings.warn(f"rmfast: note: resuming with the checkpoint's batches of {other[0][1]} rows, not {other[0][0]} "
                      f"(the same batches give the same bits); to run {other[0][0]}, delete {ck}", stacklevel=3)


def _say_resume(ck: Path | None, n_done: int, n: int) -> None:
    """What a rerun of the job does if it is interrupted now (the CLI's Ctrl-C line): resume from the checkpoint
    ``ck`` where it holds rows, else start the scoring over; nothing for a job without a checkpoint."""
    if ck is not None:
        say_on_interrupt(f"rerun the same command to resume from its checkpoint {ck} ({n_done:,} of {n:,} scored)"
                         if n_done else "no checkpoint was written yet (none due, or its write is what failed): a "
                         "rerun starts the scoring over")


def first_batch_status(groups: list[Group], done: np.ndarray) -> str:
    """What the progress bar says until the first batch is in: its size (the rate appears once it is).

    >>> first_batch_status([Group(np.arange(4), 2, None), Group(np.arange(4, 10), 6, None)], np.array([True] * 4 + [False] * 6))
    'first batch of 6 rows running'
    """
    g = next((g for g in groups if not done[g.rows].all()), groups[0] if groups else None)
    rows = min(g.cut(0, g.batch_size), int((~done[g.rows]).sum())) if g is not None else 0
    return f"first batch of {rows} rows running"


def _batch(g: Group, done: np.ndarray, lo: int, hi: int, bs: int):
    rows = g.rows[lo:hi]
    if done[rows].all():
        return None
    return g.score(rows, bs)


#: at most this many ids (or texts) are named in the line about non-finite scores
NONFINITE_SHOWN = 5


#: what a scan does with a non-finite score (the tail of :func:`count_nonfinite`'s line)
SCAN_KEEPS = "they are kept as NaN without a rank, counted in the manifest's n_nonfinite"


def count_nonfinite(scores: np.ndarray, labels, what: str, keeps: str = SCAN_KEEPS, *, warn: bool = True,
                    dtype=None) -> int:
    """How many of a finished job's scores are NaN (non-finite, :func:`score_groups`); when any are (and
    ``warn``), one warning names the first few (``labels[i]`` of row i: token ids, texts, table rows), so
    a model that overflows is seen at once rather than as a hole in the ranking. ``keeps``: what the
    caller does with them (the line's end); ``dtype``: the model's, for the likely cause (:func:`nonfinite_line`).
    Every scoring surface reports through it: scan, ``rmfast score``, :class:`rmfast.scoring.scorer.RewardScorer`
    and the GRPO adapter.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     count_nonfinite(np.array([1.0, np.nan, 2.0], np.float32), [10, 11, 12], "token ids")
    1
    >>> print(w[0].message)  # doctest: +ELLIPSIS
    rmfast: warning: 1 of 3 scores came out NaN or infinite (token ids 11): ...
    """
    scores = np.asarray(scores, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(scores))
    if bad.size and warn:
        warnings.warn(UserNote(f"rmfast: warning: {nonfinite_line(scores.size, bad, labels, what, dtype=dtype)}; "
                               f"{keeps}"), stacklevel=3)
    return int(bad.size)


def warn_constant(scores: np.ndarray, what: str, least: int = 10) -> bool:
    """One warning where a scan's ``least``+ finite scores are all one value: the model ranks nothing (a zeroed or
    untrained head), and its top and bottom tables were the same ids, printed without a word. True where they are.
    (A few texts can tie for real: three that differ only past a sliding window's reach.)

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     warn_constant(np.zeros(12, np.float32), "token ids")
    True
    >>> print(w[0].message)
    rmfast: warning: all 12 finite scores are 0 (token ids): the model ranks nothing here (a zeroed or untrained score head?); a top or bottom list of them is the candidates' order
    """
    s = np.asarray(scores, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size < least or s.min() != s.max():
        return False
    warnings.warn(UserNote(f"rmfast: warning: all {s.size:,} finite scores are {s[0]:.6g} ({what}): the model ranks "
                           "nothing here (a zeroed or untrained score head?); a top or bottom list of them is the "
                           "candidates' order"), stacklevel=3)
    return True


def nonfinite_line(n: int, bad, labels, what: str, fix: str = "try --dtype float32", dtype=None) -> str:
    """What :func:`count_nonfinite` says about ``bad`` (positions) of ``n`` scores, naming the first few
    ``labels[i]``, without what the caller does with them. The cause it names follows the model's ``dtype``
    (None: not known, a server's): float16 overflows past 65,504 (``fix``); bfloat16 and float32 have float32's
    range, so there the values were NaN or infinite already (the weights)."""
    label = lambda x: repr(x[:40]) if isinstance(x, str) else str(x)  # noqa: E731
    shown = ", ".join(label(labels[int(i)]) for i in bad[:NONFINITE_SHOWN]) + (", ..." if len(bad) > NONFINITE_SHOWN else "")
    d = None if dtype is None else str(dtype).removeprefix("torch.")
    cause = (f"a numeric overflow in the model (float16 overflows past 65,504: {fix})" if d in (None, "float16") else
             f"NaN or infinite values in the model's weights or activations (it runs in {d}, which has float32's "
             "range: not an overflow of the dtype; check the weights, e.g. a diverged training run)")
    return f"{len(bad)} of {n} scores came out NaN or infinite ({what + ' ' if what else ''}{shown}): {cause}"


def finished_checkpoint(path: Path, key: str, ids: np.ndarray) -> bool:
    """Whether the checkpoint at ``path`` is a finished job's (saved under ``key``, every row of ``ids``, in any
    order, done): the leftover of a job killed between its output's write and the checkpoint's removal."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return (str(z["key"]) == key and bool(z["done"].all())
                    and np.array_equal(np.sort(z["ids"]), np.sort(np.asarray(ids))))
    except Exception:  # noqa: BLE001 - unreadable, or no checkpoint: not known to be finished
        return False


def drop_checkpoint(res, checkpoint=None):
    """Drop the checkpoint of a finished job. Call after the output is safely written."""
    if checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)
        say_on_interrupt(None)
    return res
