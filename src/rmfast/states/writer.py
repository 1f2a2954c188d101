"""Writing a states folder (``rmfast-states/1``, :mod:`rmfast.states.format`): :func:`write_states` from arrays,
:class:`StatesWriter` streaming a scan's batches (resumable, atomic), :class:`StatesMerge` joining a torchrun
scan's ranks."""

from __future__ import annotations

import json
import os
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import UserError
from .format import DTYPES, FORMAT, KEYS, MANIFEST, NONFINITE, read_header
from .names import canonical_layer
from .reader import open_states
from .shard import nonfinite_per_layer, warn_nonfinite, write_shard

#: bytes of a scan's fresh host buffers (its pinned device-to-host copies) a shard may keep uncopied
#: (:meth:`StatesWriter.take`); beyond it the batches are copied, so the pinned memory cached stays bounded
KEEP_FRESH_MAX = 2 << 30
#: a shard holds at most this many bytes (or :attr:`StatesWriter.shard_rows` rows): once the buffered batches hold a
#: shard's worth, it is cut and written (the writer threads then write while the scan computes), a batch bigger than a
#: shard split by rows. A shard per 65,536 rows alone kept a whole 8,192-row scan of every layer (2.3 GB, the 8B) in
#: host memory and wrote it after the last batch: no overlap at all (the H100's states bench,
#: benchmarks/results/gpu_h100_2026-11-26_c). What cannot overlap is the last batch's write: at 256 MiB a shard, with
#: the 8B's 285 MB batches one shard each, that was one writer thread writing the whole last batch (~0.25 s at the
#: H200 host's ~1.1 GB/s a thread, the 0.22 s the scan waited there: benchmarks/results/gpu_h200_2026-11-29/states.csv);
#: at 64 MiB the last batch is ~5 shards, written side by side by the writer pool
#: (:data:`rmfast.scoring.states_stream.WRITERS`)
SHARD_BYTES = 64 << 20


def write_states(folder: str | os.PathLike, keys, layers: Mapping[str, object], *,
                 dtype: str = "float32", key: str = "token_id", scan: dict | None = None,
                 shard_rows: int = 65536, run_id: str | None = None) -> Path:
    """Write a states folder from in-memory arrays (tests, small tools; the engine streams its own).

    keys: (n,) ints; layers: name -> (n, d) array (numpy or torch), the old name ``last`` stored as
    ``last_prenorm`` (:func:`rmfast.states.names.canonical_layer`, with its warning). Each file is written
    atomically and the manifest last, so a reader never sees a manifest without its shards.
    Returns the folder.
    """
    import torch

    from ..io import atomic_write, fsync_file

    if dtype not in DTYPES:
        raise UserError(f"dtype {dtype!r}; one of {DTYPES}")
    if key not in KEYS:
        raise UserError(f"key {key!r}; one of {KEYS}")
    folder = Path(folder)
    keys_t = torch.as_tensor(np.ascontiguousarray(keys, dtype=np.int64))  # (n,)
    n = len(keys_t)
    u, counts = np.unique(keys_t.numpy(), return_counts=True)
    if (counts > 1).any():  # a reader joins rows by key: a repeated one was dropped there, its error about other sets
        raise UserError(f"keys: {key} {int(u[counts > 1][0])} is given {int(counts.max())} times; each row's {key} "
                        "is its own (a states folder is read by key)")
    def as_tensor(v):  # numpy or torch (any float dtype, bfloat16 included) -> (n, d) in ``dtype``
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().to(getattr(torch, dtype)).contiguous()
        return torch.as_tensor(np.ascontiguousarray(v, dtype=np.float32)).to(getattr(torch, dtype))

    mats = {canonical_layer(str(name)): as_tensor(v) for name, v in layers.items()}  # name -> (n, d)
    if len(mats) != len(layers):
        raise UserError(f"layers {list(layers)}: 'last' and 'last_prenorm' are one layer; give it once")
    dims = {tuple(m.shape) for m in mats.values()}
    if len(dims) != 1 or next(iter(dims))[0] != n or len(next(iter(dims))) != 2:
        raise UserError(f"every layer must be (n={n}, d); got {sorted(dims)}")
    d = next(iter(dims))[1]
    run_id = run_id or uuid.uuid4().hex
    nonfinite = nonfinite_per_layer(mats)
    warn_nonfinite(nonfinite, n, d, dtype, folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, lo in enumerate(range(0, max(n, 1), shard_rows)):
        hi = min(n, lo + shard_rows)
        name = f"shard-{i:05d}.safetensors"
        tensors = {"key": [keys_t[lo:hi]]}  # name -> its pieces (one here), rows lo..hi: contiguous views
        tensors.update({f"layer.{l}": [m[lo:hi]] for l, m in mats.items()})
        atomic_write(folder / name, lambda tmp, t=tensors: write_shard(tmp, t, {"format": FORMAT, "run_id": run_id}),
                     durable=False)
        shards.append({"file": name, "rows": hi - lo})
    for sh in shards:  # every shard on the disk before the manifest that names them
        fsync_file(folder / sh["file"])
    man = {"format": FORMAT, "layers": list(mats), "dtype": dtype, "hidden_size": d, "key": key,
           "n": n, "shards": shards, "run_id": run_id, NONFINITE: nonfinite, "scan": dict(scan or {})}
    atomic_write(folder / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
    return folder



def check_states_target(folder, overwrite: bool) -> None:
    """Whether a states folder may be written at ``folder`` (a scan's ``<stem>.states``), checked before any work: one
    line where something other than a folder is there (a symbolic link: states moved to another disk and linked back;
    a file), or a folder without ``overwrite``. The writer replaces the folder when the scan is done; a link it cannot
    replace (it would be the link's target or nothing), and before this check a scan with --overwrite scored
    everything, replaced its Parquet, then stopped with a traceback and the old states orphaned."""
    from ..io import describe_path

    folder = Path(folder)
    what = describe_path(folder)
    if what not in ("nothing", "a folder"):
        raise UserError(f"{folder} is {what}, not a states folder: rmfast writes the states folder there and replaces "
                        "it when the scan is done; move what is there away (states moved to another disk: move them "
                        "back), or choose another --out")
    if what == "a folder" and not overwrite:
        raise UserError(f"{folder} exists; use --overwrite to replace it (or choose another --out)")


def partial_folder(folder: Path) -> Path:
    """``<folder>.partial``, where a states folder is written until it is complete; one line where something other
    than a folder is there (a file left by hand: the writer's ``mkdir`` raised FileExistsError mid-scan)."""
    from ..io import describe_path, partial_states

    partial = partial_states(folder)
    what = describe_path(partial)
    if what not in ("nothing", "a folder"):
        raise UserError(f"{partial} is {what}, not a folder: rmfast writes the states there until they are complete; "
                        "remove it (or choose another --out)")
    return partial


class StatesWriter:
    """Writes a scan's states streaming, resumable and atomic (``rmfast-states/1``).

    Shards go into ``<folder>.partial/`` as the scan saves its checkpoint: :meth:`add` buffers a
    batch's rows, :meth:`flush` writes them as shards (atomically) right after the checkpoint
    that marks those rows done. A rerun of the same job (:meth:`prepare`) keeps the shards whose rows
    the checkpoint holds as done, deletes any other (written just before a kill, its rows not
    checkpointed), and returns the done rows that have states: a row the checkpoint holds without
    states is scored again (the same bits), so every row ends with exactly one state.
    :meth:`finish` writes the manifest and renames the folder into place. A scan writes through
    :class:`rmfast.scoring.states_stream.BackgroundWriter` (the same steps in a thread; this is its reference).
    ``layers``: canonical names; ``dtype``: stored dtype; ``key``: "token_id" or "row";
    ``job``: what identifies the job (a different one wipes the partial folder).
    """

    def __init__(self, folder, layers: list[str], dtype: str, key: str, job: str, overwrite: bool = False):
        if dtype not in DTYPES:
            raise UserError(f"--states-dtype {dtype!r}; one of {', '.join(DTYPES)}")
        self.folder = Path(folder)
        self.partial = partial_folder(self.folder)
        self.layers, self.dtype, self.key = list(layers), dtype, key
        self.overwrite = overwrite
        self.job = {"job": job, "layers": self.layers, "dtype": dtype, "key": key}
        self._buf: list[tuple[np.ndarray, np.ndarray, dict, dict | None]] = []  # rows, keys, mats, their row counts
        self.shard_rows = 65536
        self.shard_bytes = SHARD_BYTES
        self._buf_rows = 0  # rows buffered
        self._have: np.ndarray | None = None  # (N,) bool: job rows with a state on disk or buffered
        self._kept = 0  # bytes of fresh host buffers buffered as they are (take), at most what is buffered
        self._next = 0  # the next shard's number (prepare, which every add needs first: after the shards kept)
        self.run_shard = lambda cut: cut()()  # cut a shard and write it (BackgroundWriter: once a writer is free)
        self.run_id = None
        check_states_target(self.folder, overwrite)

    def _shards(self) -> list[Path]:
        return sorted(self.partial.glob("shard-*.safetensors"))

    def prepare(self, done: np.ndarray) -> np.ndarray:
        """Match the partial folder to the checkpoint's ``done`` (N,) rows; returns done & has-state."""
        import shutil

        from ..io import atomic_write

        info = self.partial / "job.json"
        old = _read_job(info)
        if old is None or {k: old.get(k) for k in self.job} != self.job:
            if done.any():  # the checkpoint's scores stand, but rows without their states are scored again: said
                was = "no states" if old is None else f"states {', '.join(old.get('layers') or [])} in {old.get('dtype')}"
                if old is not None and [old.get(k) for k in ("layers", "dtype")] == [self.layers, self.dtype]:
                    was += f" for another job (its {' and '.join(k for k in self.job if old.get(k) != self.job[k])})"
                warnings.warn(f"rmfast: note: the checkpoint's {int(done.sum()):,} scored rows are scored again: it "
                              f"kept {was}, this scan asks for {', '.join(self.layers)} in {self.job['dtype']}",
                              stacklevel=3)
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
            self.run_id = uuid.uuid4().hex
            atomic_write(info, lambda tmp: Path(tmp).write_text(json.dumps({**self.job, "run_id": self.run_id})))
        else:
            self.run_id = old["run_id"]
        self._have = np.zeros(done.size, dtype=bool)
        for f in self.partial.glob(".shard-*.tmp"):  # a write a kill cut short (atomic_write's temporary file)
            f.unlink()
        for f in self._shards():
            rows = _read_rows(f)  # (n_i,) job rows of the shard
            if rows is None or rows.max(initial=-1) >= done.size or not done[rows].all() or self._have[rows].any():
                f.unlink()  # after the last checkpoint (or unreadable, or a repeat): its rows are scored again
            else:
                self._have[rows] = True
        self._next = max((int(f.stem.split("-")[1]) + 1 for f in self._shards()), default=0)
        return done & self._have

    def add(self, rows: np.ndarray, keys: np.ndarray, states: Mapping[str, object]) -> None:
        """A batch: job rows (b,), their keys (b,), name -> (b, d) tensor. Rows already stored are skipped."""
        if (got := self.claim(rows, keys)) is not None:
            self.keep(*got, states)

    def keep(self, rows: np.ndarray, keys: np.ndarray, sel: np.ndarray, states: Mapping[str, object]) -> None:
        """A claimed batch's rows ``sel`` taken (:meth:`take`) and buffered (:meth:`append`) with the non-finite
        counts its states brought along (:meth:`row_counts`)."""
        mats = self.take(states, sel)
        self.append(rows, keys, mats, self.row_counts(states, sel, mats))

    def claim(self, rows: np.ndarray, keys: np.ndarray):
        """Mark a batch's rows not yet stored as stored: (their rows, keys, positions (k,) in the batch), or None."""
        if not (new := ~self._have[rows]).any():  # new: (b,)
            return None
        self._have[rows[new]] = True
        return rows[new], keys[new], np.flatnonzero(new)

    def take(self, states: Mapping[str, object], sel: np.ndarray) -> dict:
        """Rows ``sel`` of a batch's states as stored: name -> (k, d) contiguous CPU tensor in the stored dtype.

        A copy (the states may be views of the engine's buffers), except where ``states`` says its tensors are
        ``fresh`` (:class:`rmfast.scoring.states_stream.HostStates`: host buffers of their own, which nothing
        writes again): a whole batch already contiguous in the stored dtype is then kept as it is, while the
        buffered batches kept so hold at most :data:`KEEP_FRESH_MAX` bytes (pinned memory stays cached)."""
        import torch

        want, full = getattr(torch, self.dtype), len(sel) == len(states[self.layers[0]])
        keep = full and getattr(states, "fresh", False)
        out = {}
        for l in self.layers:
            x = states[l].detach().cpu()  # (B, d)
            if keep and x.dtype == want and x.is_contiguous() and self._kept + x.nbytes <= KEEP_FRESH_MAX:
                self._kept += x.nbytes
                out[l] = x
            elif full:  # one pass: the copy and the cast together (the same rounding as .to)
                out[l] = torch.empty(x.shape, dtype=want).copy_(x)
            else:
                out[l] = x[torch.from_numpy(sel)].to(want)
        return out

    def row_counts(self, states: Mapping[str, object], sel: np.ndarray, mats: dict) -> dict | None:
        """name -> (k,) int32 NaN/inf counts of the taken rows ``sel``, where the states brought them (a GPU scan's
        :class:`rmfast.scoring.states_stream.HostStates`: counted on the device before the copy, so the shard
        writers do not read every byte on the host) and the stored dtype keeps them: the same dtype, or one whose
        range holds the computed one's (a narrower one may round a finite value to inf). Else None: the shard's
        writer counts its bytes (:func:`rmfast.states.shard.count_nonfinite`)."""
        import torch

        got = getattr(states, "row_counts", lambda: None)()
        if got is None:
            return None
        out = {}
        for l in self.layers:
            src, dst = states[l].dtype, mats[l].dtype
            if src != dst and not (src.is_floating_point and dst.is_floating_point
                                   and torch.finfo(dst).max >= torch.finfo(src).max):
                return None
            c = got[l].numpy()  # (B,)
            out[l] = c if len(sel) == len(c) else c[sel]
        return out

    def append(self, rows: np.ndarray, keys: np.ndarray, mats: dict, counts: dict | None = None) -> None:
        """Buffer taken rows (:meth:`take`) and their NaN/inf counts where known (:meth:`row_counts`); cut a shard
        from the front of the buffer while it holds a shard's worth (:meth:`_shard_size`); the rest stays buffered
        for the next batch or :meth:`flush`."""
        self._buf.append((rows, keys, mats, counts))
        self._buf_rows += len(rows)
        while self._buf_rows >= self._shard_size():
            self.run_shard(self.cut)  # early is safe: a shard the checkpoint does not cover is dropped on resume

    def flush(self) -> None:
        """Write every buffered row, as shards of at most :meth:`_shard_size` rows (atomically). Call before the
        checkpoint is saved."""
        while self._buf:
            self.run_shard(self.cut)

    def _shard_size(self) -> int:
        """Rows of a full shard: ``shard_rows``, fewer where those would take more than ``shard_bytes``."""
        if not self._buf:
            return self.shard_rows
        row = sum(m[0].numel() * m.element_size() if len(m) else 0 for m in self._buf[0][2].values())  # bytes a row
        return max(1, min(self.shard_rows, self.shard_bytes // max(row, 1)))

    def cut(self):
        """The next shard, taken from the front of the buffer (at most :meth:`_shard_size` rows; a batch split by rows
        where it straddles two shards, as views) and numbered now, in the scan's order: a callable that counts its
        non-finite values and writes it (:meth:`flush`: at once; BackgroundWriter: on a writer thread)."""
        if not self._buf:
            return None
        import torch

        from ..io import atomic_write

        size, pieces = self._shard_size(), []
        while self._buf and (left := size - sum(len(p[0]) for p in pieces)) > 0:
            rows, keys, mats, counts = self._buf[0]
            if len(rows) <= left:
                pieces.append(self._buf.pop(0))
            else:  # the batch's first rows into this shard; row slices of (b, d) tensors stay contiguous
                head, tail = slice(None, left), slice(left, None)
                pieces.append((rows[head], keys[head], _rows_of(mats, head), _rows_of(counts, head)))
                self._buf[0] = (rows[tail], keys[tail], _rows_of(mats, tail), _rows_of(counts, tail))
        self._buf_rows -= sum(len(p[0]) for p in pieces)
        # name -> the pieces, written one after another (rmfast.states.shard: never joined)
        t = {"key": [torch.from_numpy(np.concatenate([p[1] for p in pieces]).astype(np.int64))],
             "rows": [torch.from_numpy(np.concatenate([p[0] for p in pieces]).astype(np.int64))]}
        t.update({f"layer.{l}": [p[2][l] for p in pieces] for l in self.layers})
        path, self._next = self.partial / f"shard-{self._next:05d}.safetensors", self._next + 1
        # the fresh buffers kept uncopied (take) are still buffered at most as many bytes as the buffer holds
        self._kept = min(self._kept, sum(m.nbytes for b in self._buf for m in b[2].values()))

        def write() -> None:
            # counted per shard, in its metadata: a resumed scan's total includes the shards of the run before; from
            # the counts the states brought (a GPU's), else from the bytes
            if all(p[3] is not None for p in pieces):
                bad = json.dumps({l: int(sum(int(p[3][l].sum()) for p in pieces)) for l in self.layers})
            else:
                bad = json.dumps(nonfinite_per_layer({l: t[f"layer.{l}"] for l in self.layers}))
            meta = {"format": FORMAT, "run_id": self.run_id, NONFINITE: bad}
            try:
                atomic_write(path, lambda tmp: write_shard(tmp, t, meta), durable=False)  # flushed at finish
            except OSError as e:  # a full disk: the shards so far and the scan's checkpoint stay
                raise UserError(f"cannot write a states shard in {path.parent}: {e.strerror or e}; what was done is "
                                "kept: free space and rerun the same command to resume") from None
        return write

    def finish(self, scan: dict | None = None) -> Path:
        """Every row has its state: write the manifest and move the folder into place. Returns it."""
        import shutil

        from ..io import atomic_write, fsync_file

        self.flush()
        if self._have is None or not self._have.all():
            missing = 0 if self._have is None else int((~self._have).sum())
            raise RuntimeError(f"states: {missing} rows have no state")  # a bug, never input
        shards, n, d = [], 0, None
        nonfinite = dict.fromkeys(self.layers, 0)
        for f in self._shards():
            header, _ = read_header(f)
            rows = header["key"]["shape"][0]
            d = header[f"layer.{self.layers[0]}"]["shape"][1]
            shards.append({"file": f.name, "rows": rows})
            n += rows
            for l, v in _shard_nonfinite(header).items():
                nonfinite[l] = nonfinite.get(l, 0) + v
            fsync_file(f)  # on the disk before the manifest that names it (written without a flush, side by side)
        warn_nonfinite(nonfinite, n, d or 0, self.dtype, self.folder)
        man = {"format": FORMAT, "layers": self.layers, "dtype": self.dtype, "hidden_size": d, "key": self.key,
               "n": n, "shards": shards, "run_id": self.run_id, NONFINITE: nonfinite, "scan": dict(scan or {})}
        atomic_write(self.partial / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
        if self.folder.exists():
            shutil.rmtree(self.folder)  # --overwrite (checked at the start)
        os.replace(self.partial, self.folder)
        # only now: a kill before the rename leaves the partial folder its job, so the rerun finishes it again
        (self.folder / "job.json").unlink(missing_ok=True)
        return self.folder


def _rows_of(per_layer: dict | None, rows: slice) -> dict | None:
    """name -> rows of each (b, ...) array or tensor (views), or None for None."""
    return None if per_layer is None else {l: m[rows] for l, m in per_layer.items()}


def _shard_nonfinite(header: dict) -> dict[str, int]:
    """A shard's NaN/inf count per layer, from its metadata ({} for a shard written without one)."""
    try:
        got = json.loads((header.get("__metadata__") or {}).get(NONFINITE) or "{}")
        return {str(k): int(v) for k, v in got.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _read_job(info: Path) -> dict | None:
    """A partial folder's job.json, or None where there is none or it cannot be read (a full disk's empty file):
    the folder is then another job's, started afresh."""
    try:
        job = json.loads(info.read_text())
    except (OSError, ValueError):
        return None
    return job if isinstance(job, dict) and isinstance(job.get("run_id"), str) else None


def _read_rows(file: Path) -> np.ndarray | None:
    """The ``rows`` tensor of a partial shard (job rows), or None if it cannot be read."""
    try:
        header, base = read_header(file)
        v = header["rows"]
        return np.array(np.memmap(file, dtype=np.int64, mode="r", offset=base + v["data_offsets"][0],
                                  shape=tuple(v["shape"])))
    except (UserError, KeyError, ValueError, OSError):
        return None


def _link_or_copy(src: Path, dst: Path) -> None:
    import shutil

    try:
        os.link(src, dst)
    except OSError:  # no hard links here (or another device): the bytes copied
        shutil.copyfile(src, dst)


class StatesMerge:
    """The states of a torchrun scan: every rank's finished folder joined into one by linking its shards.

    ``parts``: the ranks' folders, in rank order; ``folder``: the scan's states folder. :meth:`finish` checks each
    part (:func:`open_states`), hard-links its shards into ``<folder>.partial/`` (renumbered, each shard entry naming
    its rank's ``run_id``; copied where the file system has no hard links), writes the manifest, renames the folder
    into place and only then removes the parts: a kill at any step leaves the ranks' folders whole, and the rerun
    joins them again. Keys are global already (token ids; rows of the merged scan, which
    :class:`rmfast.scoring.pipeline.StatesRequest` ``row_keys`` gives each rank).
    """

    def __init__(self, parts, folder):
        self.parts, self.folder = [Path(p) for p in parts], Path(folder)
        check_states_target(self.folder, True)  # --overwrite was checked by the scan's own; a link or file is not

    def finish(self, scan: dict | None = None) -> Path:
        import shutil

        from ..io import atomic_write

        sets = [open_states(p) for p in self.parts]
        head = {k: sets[0].manifest[k] for k in ("layers", "dtype", "hidden_size", "key")}
        for s in sets[1:]:
            if {k: s.manifest[k] for k in head} != head:
                raise UserError(f"{s.path}: its layers, dtype, width or key differ from {sets[0].path}; "
                                "the ranks' states cannot be joined")
        partial = partial_folder(self.folder)
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shards = []
        for s in sets:
            for sh in s.shards:
                name = f"shard-{len(shards):05d}.safetensors"
                _link_or_copy(sh.file, partial / name)
                shards.append({"file": name, "rows": sh.rows, "run_id": s.manifest.get("run_id")})
        nonfinite = {l: sum(int((s.manifest.get(NONFINITE) or {}).get(l, 0)) for s in sets) for l in head["layers"]}
        man = {"format": FORMAT, **head, "n": sum(s.n for s in sets), "shards": shards, NONFINITE: nonfinite,
               "scan": dict(scan or sets[0].manifest.get("scan") or {}), "ranks": len(sets)}
        atomic_write(partial / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
        if self.folder.exists():
            shutil.rmtree(self.folder)  # --overwrite (checked at the start)
        os.replace(partial, self.folder)
        for p in self.parts:
            shutil.rmtree(p, ignore_errors=True)
        return self.folder
