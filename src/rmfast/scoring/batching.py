"""The batching loop every scoring job runs: fixed batches, out-of-memory back-off, a checkpoint that
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

from ..io import atomic_write

#: a long job saves its finished batches at least this often (seconds), so a kill loses at most
#: this much work plus one batch ...
CHECKPOINT_EVERY_S = 5.0
#: ... and after this many newly scored candidates (a CPU batch or a few), but ...
CHECKPOINT_EVERY_N = 1024
#: ... never twice within this many seconds: a save (the ids and scores so far, ~2 MB for a
#: 150k vocabulary) costs a few ms, which fast GPU batches must not pay every time.
CHECKPOINT_MIN_S = 0.5


@dataclass
class Group:
    """Rows of one shape scored by one function.

    Attributes:
        rows: (n,) positions in the job's score array.
        batch_size: rows per batch (halved on out-of-memory).
        score: ``score(rows, batch_size) -> (len(rows),) float32 scores``.
    """

    rows: np.ndarray
    batch_size: int
    score: Callable[[np.ndarray, int], np.ndarray]


def oom_batches(n: int, bs: int, device: torch.device, score, on_oom=None):
    """Score rows 0..n-1 in batches: yields (lo, hi, out, bs) with ``out = score(lo, hi, bs)``.

    On out-of-memory the batch is halved (``on_oom(new_bs)`` is told) and the same rows retried;
    at one row the error propagates.
    """
    lo = 0
    while lo < n:
        hi = min(n, lo + bs)
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
        why = _other_job(z, key, ids, job)
        if why is None:
            scores = z["scores"].astype(np.float32)
            done = z["done"].astype(bool) if "done" in z else ~np.isnan(scores)  # older checkpoints: NaN = to do
            sizes = z["batch_sizes"] if "batch_sizes" in z else None
    except Exception:
        why = "it cannot be read"
    if why is not None:
        warnings.warn(f"rmfast: note: not resuming from {path}: {why}; this job starts afresh", stacklevel=3)
    return scores, done, sizes


def _other_job(z, key: str, ids: np.ndarray, job: dict | None) -> str | None:
    """Why the checkpoint ``z`` is not this job's (None: it is)."""
    if str(z["key"]) == key:
        return None if np.array_equal(z["ids"], ids) else "it holds other candidates"
    old = json.loads(str(z["job"])) if "job" in z else None
    if not isinstance(old, dict) or not old or job is None:
        return "it was saved by another job"
    new = json.loads(json.dumps(job, sort_keys=True, default=str))
    changed = [k for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if changed == ["model"] and _same_but_content(old["model"], new["model"]):
        return "the model's files (weights or config) changed since it was saved"
    return f"it was saved for another {', '.join(changed) or 'job'}"


def _same_but_content(a, b) -> bool:
    """Two model provenances that differ only in what names their content (a folder edited in place)."""
    content = ("content_sha256", "sha256", "revision")
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
    scores, done, sizes = load_checkpoint(ck, key, ids, job)
    if sizes is not None and len(sizes) == len(groups):
        for g, b in zip(groups, sizes):
            g.batch_size = int(b)
    sizes = [g.batch_size for g in groups]
    lens = None
    if lens_k:
        lens, done = load_lens(ck, ids.size, lens_k, done)
    if states_out is not None:
        done = states_out.prepare(done)
    done0 = int(done.sum())

    def save():  # the scores first (a full disk keeps them); a row done without its state is rescored on resume
        save_checkpoint(ck, key, ids, scores, done, sizes, job, lens)
        if states_out is not None:
            states_out.flush()

    # a writer thread's shards all on disk (and its error raised) before the job returns or raises
    drain = getattr(states_out, "drain", None) or (lambda: None)

    bar = tqdm(total=ids.size, initial=done0, unit="cand", desc=desc, disable=not progress, dynamic_ncols=True)
    if status and done0 < ids.size:
        bar.set_postfix_str(status)
    t0 = last_ck = time.perf_counter()
    first_batch_s, n_since_ck = None, 0
    try:
        for g in groups:
            for lo, hi, out, bs in oom_batches(g.rows.size, g.batch_size, device, lambda lo, hi, b, g=g: _batch(g, done, lo, hi, b),
                                               lambda b: bar.set_postfix_str(f"OOM: batch -> {b}")):
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
    except BaseException:
        # Interrupted (Ctrl-C, a kill that Python sees, an error): keep what is done for the rerun.
        if ck is not None and int(done.sum()) > done0:
            save()
        drain()
        raise
    bar.close()
    scan_s = time.perf_counter() - t0
    if ck is not None and keep_checkpoint and int(done.sum()) > done0:
        save()
    elif states_out is not None:
        states_out.flush()
    drain()
    if extra is not None and lens is not None:
        extra["lens"] = lens
    n_new = ids.size - done0
    return scores, {
        "first_batch_s": round(first_batch_s, 3) if first_batch_s is not None else None,
        "scan_s": round(scan_s, 3),
        "candidates_per_s": round(n_new / scan_s, 2) if scan_s > 0 and n_new else None,
        "resumed_candidates": done0,
        "scored_candidates": int(done.sum()) - done0,
    }


def _batch(g: Group, done: np.ndarray, lo: int, hi: int, bs: int):
    rows = g.rows[lo:hi]
    if done[rows].all():
        return None
    return g.score(rows, bs)


#: at most this many ids (or texts) are named in the line about non-finite scores
NONFINITE_SHOWN = 5


#: what a scan does with a non-finite score (the tail of :func:`count_nonfinite`'s line)
SCAN_KEEPS = "they are kept as NaN without a rank, counted in the manifest's n_nonfinite"


def count_nonfinite(scores: np.ndarray, labels, what: str, keeps: str = SCAN_KEEPS, *, warn: bool = True) -> int:
    """How many of a finished job's scores are NaN (non-finite, :func:`score_groups`); when any are (and
    ``warn``), one warning names the first few (``labels[i]`` of row i: token ids, texts, table rows), so
    a model that overflows is seen at once rather than as a hole in the ranking. ``keeps``: what the
    caller does with them (the line's end). Every scoring surface reports through it: scan, ``rmfast
    score``, :class:`rmfast.scoring.scorer.RewardScorer` and the GRPO adapter.

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
        warnings.warn(f"rmfast: warning: {nonfinite_line(scores.size, bad, labels, what)}; {keeps}", stacklevel=3)
    return int(bad.size)


def nonfinite_line(n: int, bad, labels, what: str, fix: str = "try --dtype float32") -> str:
    """What :func:`count_nonfinite` says about ``bad`` (positions) of ``n`` scores, naming the first few
    ``labels[i]``, without what the caller does with them."""
    label = lambda x: repr(x[:40]) if isinstance(x, str) else str(x)  # noqa: E731
    shown = ", ".join(label(labels[int(i)]) for i in bad[:NONFINITE_SHOWN]) + (", ..." if len(bad) > NONFINITE_SHOWN else "")
    return (f"{len(bad)} of {n} scores came out NaN or infinite ({what + ' ' if what else ''}{shown}): "
            f"a numeric overflow in the model (float16 overflows past 65,504: {fix})")


def drop_checkpoint(res, checkpoint=None):
    """Drop the checkpoint of a finished job. Call after the output is safely written."""
    if checkpoint is not None:
        Path(checkpoint).unlink(missing_ok=True)
    return res
