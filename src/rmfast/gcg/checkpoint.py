"""A GCG search's checkpoint: the search at its last step boundary, saved atomically, so that a rerun of the same
search goes on from there and ends as an uninterrupted run would (the same candidates, scores and best).

What a step depends on is all here: the finished restarts, the running one's start, buffer, trajectory and
stale count, its random generator's state, and every candidate evaluated so far (the search never scores one
twice). A step that was under way when the process stopped is run again from its start: its draws come from
the saved generator state, so it draws what it drew before.

The file (``rmfast gcg``: ``<out>.partial.npz``) is written at most every :data:`SAVE_EVERY_S` seconds while
steps run, at every restart's end and on Ctrl-C. It names its job as a scan's checkpoint does
(:func:`rmfast.scoring.plan.run_fields`: the model's content, prompt, template, head, dtype, path) plus the
search's settings; a checkpoint of another job is never trusted (one note, and the search starts afresh).
Settings that only decide when the search stops (:data:`STOP_FIELDS`) may change: a rerun with more
``--steps`` goes on for longer.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> b = Boundary(done=[], r=0, start_ids=[5, 6], buffer=[(1.5, [5, 7])], traj=[1.0, 1.5], evals=[1, 9], stale=0,
    ...              gen_state=torch.Generator().manual_seed(0).get_state(), n_seen=2,
    ...              counters={"n_eval": 9})
    >>> seen = {bytes(torch.tensor([5, 6], dtype=torch.int32).numpy()): None,
    ...         bytes(torch.tensor([5, 7], dtype=torch.int32).numpy()): None}
    >>> p = Path(tempfile.mkdtemp()) / "g.partial.npz"
    >>> save(p, {"prompt": "Hi"}, b, seen, 2)
    >>> back, keys = load(p, {"prompt": "Hi"})
    >>> back.traj, back.buffer, len(keys), back.steps_done
    ([1.0, 1.5], [(1.5, [5, 7])], 2, 1)
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as w:
    ...     warnings.simplefilter("always")
    ...     load(p, {"prompt": "Hello"}) is None, "prompt differed" in str(w[0].message)
    (True, True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write
from ..scoring.batching import other_job

#: while steps run, at most one save per this many seconds (a restart's end and Ctrl-C always save)
SAVE_EVERY_S = 30.0

#: the settings that only decide when the search stops: a resumed search may change them
STOP_FIELDS = ("steps", "patience", "restarts")

#: the search's counters a checkpoint keeps (rmfast.gcg.search._Search's fields of those names)
COUNTERS = ("n_eval", "n_dup", "n_rej", "n_nonfinite", "nonfinite_ids", "t_grad", "t_filter", "t_eval", "t_eval_steps",
            "step_times")


@dataclass
class Boundary:
    """The search at the end of a step, or between restarts (``start_ids`` None: restart ``r`` has not begun).

    done: the finished restarts' records; r: the running (or next) restart; start_ids, buffer ((score, ids) best
    first), traj, evals, stale: the running restart's; gen_state: its generator's state (uint8); n_seen: how many
    of the evaluated candidates (in the order first seen) belong to the boundary; counters: :data:`COUNTERS`."""

    done: list[dict]
    r: int
    start_ids: list[int] | None
    buffer: list[tuple[float, list[int]]]
    traj: list[float]
    evals: list[int]
    stale: int
    gen_state: torch.Tensor | None
    n_seen: int
    counters: dict

    @property
    def steps_done(self) -> int:
        """Steps the running restart has run (0 between restarts)."""
        return max(len(self.traj) - 1, 0)

    def where(self) -> str:
        """Where the search stands, in words: "restart 1, step 4"."""
        return f"restart {self.r}, step {self.steps_done}" if self.start_ids is not None else f"restart {self.r}'s start"


def job_of(fields: dict, config) -> dict:
    """The job a checkpoint belongs to: the scoring job's run fields and the search's settings but those that
    only decide when it stops."""
    cfg = {k: v for k, v in dataclasses.asdict(config).items() if k not in STOP_FIELDS}
    if cfg.get("compat") == "authors":  # it keeps the fork's pick since 2026-12-01: an older one's is another search
        cfg["keep"] = "closest to +-30"
    return json.loads(json.dumps({**fields, "gcg": cfg}, sort_keys=True, default=str))


def _key(job: dict) -> str:
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]


def save(path: str | os.PathLike, job: dict, b: Boundary, seen: dict, L: int) -> None:
    """Write boundary ``b`` of ``job`` to ``path`` atomically; ``seen``: the evaluated candidates' keys (int32
    bytes of L tokens), in the order first seen (its first ``b.n_seen`` are the boundary's)."""
    rows = np.frombuffer(b"".join(itertools.islice(seen, b.n_seen)), dtype=np.int32).reshape(-1, L)  # (n_seen, L)
    state = {"done": b.done, "r": b.r, "start_ids": b.start_ids, "buffer": b.buffer, "traj": b.traj, "evals": b.evals,
             "stale": b.stale, "counters": b.counters}
    gen = np.zeros(0, np.uint8) if b.gen_state is None else b.gen_state.numpy()

    def w(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, key=np.array(_key(job)), job=np.array(json.dumps(job, sort_keys=True)),
                     state=np.array(json.dumps(state)), gen=gen, seen=rows)

    atomic_write(path, w)


def load(path: str | os.PathLike | None, job: dict) -> tuple[Boundary, list[bytes]] | None:
    """The boundary saved for ``job`` and the evaluated candidates' keys, or None: no checkpoint, or one of
    another job or unreadable (then one note says why; the search starts afresh and its first save replaces it)."""
    if path is None or not Path(path).exists():
        return None
    try:
        z = np.load(path, allow_pickle=False)
        why = other_job(z, _key(job), job)
        if why is None:
            st = json.loads(str(z["state"]))
            gen = z["gen"]
            b = Boundary(st["done"], int(st["r"]), st["start_ids"], [(float(s), list(i)) for s, i in st["buffer"]],
                         st["traj"], st["evals"], int(st["stale"]),
                         torch.from_numpy(gen.copy()) if gen.size else None, int(z["seen"].shape[0]), st["counters"])
            return b, [row.tobytes() for row in z["seen"].astype(np.int32)]
    except Exception:
        why = "it cannot be read"
    warnings.warn(f"rmfast: note: gcg: not resuming from {path}: {why}; this search starts afresh", stacklevel=3)
    return None


# --------------------------------------------------------------------------------------------
# a search's side (rmfast.gcg.search._Search: its live restart, counters and evaluated candidates)


def resume(s, checkpoint, prompt: str, model_info) -> Boundary | None:
    """Set search ``s`` up to save at ``checkpoint``, and to the boundary saved there for this search (None:
    none, or another search's, said in one note)."""
    if checkpoint is None:
        return None
    from ..scoring.plan import run_fields

    s.checkpoint, s.job = Path(checkpoint), job_of(run_fields(s.plan.manifest(prompt, model_info)), s.cfg)
    got = load(s.checkpoint, s.job)
    if got is None:
        return None
    b, seen = got
    s.seen = dict.fromkeys(seen)
    for k, v in b.counters.items():
        setattr(s, k, v)
    s.resumed = {"from": str(s.checkpoint), "restart": b.r, "step": b.steps_done, "restarts_done": len(b.done),
                 "evaluated": s.n_eval}
    return b


def mark(s, done: list[dict], r: int, gen: torch.Generator | None, stale: int, force: bool = False) -> None:
    """A step boundary of search ``s`` (restart ``r``; between restarts where ``s.live`` is not r's): kept (what
    an interrupt's save writes), and saved where a checkpoint is asked for and :data:`SAVE_EVERY_S` has passed
    since the last save (or ``force``)."""
    if s.checkpoint is None:
        return
    live = s.live if s.live is not None and s.live[0] == r else None
    start_ids, buffer, traj, evals = live[1:] if live else (None, [], [], [])
    s.boundary = Boundary(list(done), r, None if start_ids is None else list(start_ids), list(buffer), list(traj),
                          list(evals), stale, None if live is None else gen.get_state(), len(s.seen),
                          {k: (list(v) if isinstance(v, list) else v) for k in COUNTERS for v in [getattr(s, k)]})
    if force or time.perf_counter() - s.saved_at >= SAVE_EVERY_S:
        save_now(s)


def save_now(s) -> None:
    """Save search ``s``'s last boundary (where it has a checkpoint and a boundary)."""
    if s.checkpoint is not None and s.boundary is not None:
        save(s.checkpoint, s.job, s.boundary, s.seen, s.L)
        s.saved_at = time.perf_counter()


__all__ = ["Boundary", "SAVE_EVERY_S", "STOP_FIELDS", "job_of", "save", "load", "resume", "mark", "save_now"]
