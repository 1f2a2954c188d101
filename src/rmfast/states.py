"""Hidden states of scanned candidates on disk: the ``rmfast-states/1`` folder format.

A states folder sits beside its scan, ``<scan stem>.states/`` (``scan.parquet`` ->
``scan.states/``), or anywhere. It holds::

    manifest.json
        {"format": "rmfast-states/1",
         "layers": ["0", "8", "last_prenorm", "last_normed"],   # names, in order (rmfast.state_names)
         "dtype": "float32" | "bfloat16" | "float16",   # of every layer tensor
         "hidden_size": d,
         "key": "token_id" | "row",                      # what the key tensor holds
         "n": total rows,
         "shards": [{"file": "shard-00000.safetensors", "rows": n_0}, ...],  # each may name its "run_id"
         "run_id": "..."                                 # optional; see below
         "n_nonfinite": {"last_prenorm": 0, ...}         # stored values that are NaN or +-inf, per layer
         "scan": {"model": ..., "prompt": ..., "write_id": ..., ...}}  # the scan it belongs to
    shard-00000.safetensors, ...
        key            (n_i,)    int64   token ids, or row numbers of the scan Parquet
        layer.<name>   (n_i, d)  dtype   one tensor per layer of the manifest
        rows           (n_i,)    int64   optional: the scan job's row numbers (the scan's writer)

Rows are the concatenation of the shards in manifest order. ``run_id`` (optional) is
also written into every shard's safetensors metadata; when both carry one they must
match, so a shard copied in from another run is refused. A shard entry's own ``run_id`` takes the
manifest's place for that shard: a folder joined from a torchrun scan's ranks (:class:`StatesMerge`)
lists each rank's run. Without it a foreign shard is still refused when its rows, tensors, shape or
dtype disagree with the manifest.

A states folder belongs to one write of its scan: ``scan.write_id`` is the scan pair's write id
(:func:`rmfast.io.write_pair`), and :func:`open_states` refuses a folder beside a scan Parquet of
another write (a scan rerun over the same ``--out``, or states of another model copied in); states
written without a scan file (the Python API) name the scan's model, prompt and candidate count
instead, which are compared with the Parquet's manifest. Stored values that are NaN or infinite (a
float16 overflow past 65,504) are counted per layer (``n_nonfinite``) and warned about when written.

Layer names (:mod:`rmfast.state_names`): ``last_prenorm`` is the stream before the final norm,
``last_normed`` what the head reads (HF's ``hidden_states[-1]``). A folder written before the rename
names the first ``last`` (tensor ``layer.last``): it reads as ``last_prenorm`` (:attr:`StatesSet.layers`),
and ``take("last")`` still finds it.

Reading never loads a whole shard: the reader parses the safetensors header and maps
the tensors (``numpy.memmap``), so :meth:`StatesSet.take` gathers any rows with memory
proportional to the rows asked for. bfloat16 is widened to float32 bit-exactly.

Example:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "s.states"
    >>> x = np.arange(12, dtype="float32").reshape(4, 3)                 # (n=4, d=3)
    >>> _ = write_states(d, np.array([5, 6, 7, 8]), {"last_prenorm": x}, shard_rows=3)
    >>> s = open_states(d)
    >>> s.n, s.layers, s.hidden_size, [sh.rows for sh in s.shards]
    (4, ['last_prenorm'], 3, [3, 1])
    >>> s.take("last_prenorm", np.array([3, 0])).tolist()                 # rows 3 and 0
    [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
"""

from __future__ import annotations

import json
import os
import struct
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError
from .io import states_dir
from .state_names import (LAST, LAST_NORMED, LAST_PRENORM, OLD_LAST, canonical_layer,  # noqa: F401 (re-exported)
                          layer_index, parse_layers)
from .states_shard import count_nonfinite, nonfinite_per_layer, warn_nonfinite, write_shard  # noqa: F401 (re-exported)
from .states_tie import check_scan_tie

FORMAT = "rmfast-states/1"
DTYPES = ("float32", "bfloat16", "float16")
KEYS = ("token_id", "row")
MANIFEST = "manifest.json"
#: bytes of a scan's fresh host buffers (its pinned device-to-host copies) a shard may keep uncopied
#: (:meth:`StatesWriter.take`); beyond it the batches are copied, so the pinned memory cached stays bounded
KEEP_FRESH_MAX = 2 << 30
#: a shard is written once its buffered batches hold this many bytes (or :attr:`StatesWriter.shard_rows` rows):
#: the writer thread then writes while the scan computes. A shard per 65,536 rows alone kept a whole 8,192-row
#: scan of every layer (2.3 GB, the 8B) in host memory and wrote it after the last batch: no overlap at all (the
#: H100's states bench, benchmarks/results/gpu_h100_2026-11-26_c). The last shard's write is what cannot overlap,
#: ~0.2 s at 1.4 GB/s.
SHARD_BYTES = 256 << 20
# safetensors dtype tags for the dtypes above and the key tensor
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_NP_RAW = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}
#: a shard's safetensors metadata key: its count of NaN/inf values per layer (JSON)
_NONFINITE = "n_nonfinite"


def is_states_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a states folder: its ``manifest.json`` says ``rmfast-states/1``, or it is named
    ``*.states`` and has a manifest (:func:`open_states` then says what is wrong with it). A sweep store's
    index is also called ``manifest.json``; it is not one."""
    p = Path(path)
    if not (p / MANIFEST).is_file():
        return False
    if p.suffix == ".states":
        return True
    try:
        man = json.loads((p / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(man, dict) and man.get("format") == FORMAT


@dataclass
class Shard:
    """One shard file: its rows and, per tensor name, (byte offset in the file, safetensors dtype, shape)."""

    file: Path
    rows: int
    tensors: dict[str, tuple[int, str, tuple[int, ...]]]
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class StatesSet:
    """An opened states folder (see the module docstring).

    ``scan_path``: the scan Parquet beside it (None if there is none); ``texts()`` reads the
    decoded strings of its rows from there.
    """

    path: Path
    manifest: dict
    shards: list[Shard]
    keys: np.ndarray  # (n,) int64, rows in manifest order
    scan_path: Path | None = None
    _maps: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(self.manifest["n"])

    @property
    def layers(self) -> list[str]:
        """The layers' canonical names, in order (an old folder's ``last``: ``last_prenorm``)."""
        return [canonical_layer(l, note=False) for l in self.manifest["layers"]]

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["hidden_size"])

    @property
    def key(self) -> str:
        return self.manifest["key"]

    @property
    def name(self) -> str:
        """A label: the manifest's scan model (and prompt), else the folder name."""
        scan = self.manifest.get("scan") or {}
        model = scan.get("model")
        if isinstance(model, dict):
            model = model.get("name")
        return str(model) if model else self.path.name

    def check_layer(self, layer: str) -> None:
        if canonical_layer(layer, note=False) not in self.layers:
            raise UserError(f"{self.path}: no layer {layer!r}; it has {self.layers}")

    def stored_name(self, layer: str) -> str:
        """The name ``layer`` (canonical, or the old ``last``) has in the files (``layer.<name>``, n_nonfinite)."""
        self.check_layer(layer)
        return self.manifest["layers"][self.layers.index(canonical_layer(layer, note=False))]

    def n_nonfinite(self, layer: str) -> int:
        """Stored values of ``layer`` that are NaN or +-inf (the manifest's count; 0 when it has none)."""
        got = self.manifest.get(_NONFINITE)
        v = got.get(self.stored_name(layer)) if isinstance(got, dict) else None
        return v if isinstance(v, int) else 0

    def _map(self, i: int, tensor: str) -> np.ndarray:
        if (i, tensor) not in self._maps:
            sh = self.shards[i]
            off, dt, shape = sh.tensors[tensor]
            self._maps[(i, tensor)] = np.memmap(sh.file, dtype=_NP_RAW[dt], mode="r",
                                                offset=off, shape=shape)
        return self._maps[(i, tensor)]

    def take(self, layer: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (global row numbers, any order, repeats allowed) of ``layer`` as float32.

        Returns (len(rows), d) float32; bfloat16 is widened exactly, float16 exactly.
        """
        tensor = f"layer.{self.stored_name(layer)}"
        rows = np.asarray(rows, dtype=np.int64)  # (m,)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n):
            raise UserError(f"{self.path}: row out of range 0..{self.n - 1}")
        out = np.empty((len(rows), self.hidden_size), dtype=np.float32)  # (m, d)
        starts = np.cumsum([0] + [s.rows for s in self.shards])  # (shards+1,)
        which = np.searchsorted(starts, rows, side="right") - 1  # (m,) shard of each row
        for i in np.unique(which):
            sel = np.nonzero(which == i)[0]
            local = rows[sel] - starts[i]
            order = np.argsort(local, kind="stable")  # read each shard in file order
            raw = self._map(int(i), tensor)[local[order]]  # (k, d) raw dtype
            if raw.dtype == np.uint16:  # bfloat16: the top half of a float32
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            out[sel[order]] = raw
        return out

    def texts(self) -> np.ndarray | None:
        """Decoded string of every row (object array (n,)), from the scan Parquet; None without one.

        key "row": row r of the Parquet; key "token_id": the Parquet row with that token id.
        """
        if self.scan_path is None:
            return None
        import pandas as pd

        cols = ["text"] if self.key == "row" else ["token_id", "text"]
        try:
            df = pd.read_parquet(self.scan_path, columns=cols)
        except Exception as e:
            raise UserError(f"{self.scan_path}: cannot read its text column ({e})") from None
        if self.key == "row":
            if self.keys.max(initial=-1) >= len(df):
                raise UserError(f"{self.path}: row keys beyond the {len(df)} rows of {self.scan_path}; "
                                "the states are not from this scan")
            return df["text"].to_numpy(dtype=object)[self.keys]
        ids = df["token_id"].astype("Int64")
        lookup = pd.Series(df["text"].to_numpy(dtype=object), index=ids.to_numpy())
        lookup = lookup[~lookup.index.duplicated(keep=False)]
        got = lookup.reindex(self.keys)
        if got.isna().any():
            raise UserError(f"{self.path}: {int(got.isna().sum())} token ids have no row in "
                            f"{self.scan_path}; the states are not from this scan")
        return got.to_numpy(dtype=object)


def _read_header(file: Path) -> tuple[dict, int]:
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100_000_000:
                raise ValueError("header too large")
            header = json.loads(f.read(size))
    except FileNotFoundError:
        raise UserError(f"states shard {file} is missing; the states folder is incomplete") from None
    except (OSError, ValueError, struct.error) as e:
        raise UserError(f"states shard {file} is not a safetensors file ({e})") from None
    return header, 8 + size


def open_states(path: str | os.PathLike) -> StatesSet:
    """Open a states folder, or the one beside a scan Parquet; check every shard against the manifest,
    and the folder against the scan beside it (:func:`check_scan_tie`)."""
    p = Path(path)
    folder = states_dir(p)
    scan_path = p if p.suffix == ".parquet" else folder.with_suffix(".parquet")
    if p.suffix == ".parquet" and not p.is_file():
        raise UserError(f"{p}: no such scan file")
    mpath = folder / MANIFEST
    if not mpath.is_file():
        where = f" (looked for {folder} beside the scan)" if p.suffix == ".parquet" else ""
        raise UserError(f"{p}: no states manifest {mpath}{where}; scan with --states, "
                        "or give a states folder")
    try:
        man = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{mpath}: not a readable JSON manifest ({e})") from None
    _check_manifest(man, mpath)
    shards, keys = [], []
    for s in man["shards"]:
        f = folder / s["file"]
        header, base = _read_header(f)
        meta = header.pop("__metadata__", None) or {}
        want = {"key": ("I64", (s["rows"],))}
        want.update({f"layer.{l}": (_ST_DTYPE[man["dtype"]], (s["rows"], man["hidden_size"]))
                     for l in man["layers"]})
        try:
            have = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}
            ends = [base + int(v["data_offsets"][1]) for v in header.values()]
        except (TypeError, KeyError, IndexError, ValueError, AttributeError):
            raise UserError(f"{f}: its safetensors header is malformed; rewrite the states") from None
        if have.get("rows") == ("I64", (s["rows"],)):
            del have["rows"]  # the scan's own job-row numbers (StatesWriter), optional
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))
            raise UserError(f"{f}: does not match {mpath} (a shard from another run?): "
                            f"tensors differ at {diff[:3]}")
        size = f.stat().st_size
        if max(ends, default=base) > size:  # a half-copied shard: its tensors run past the end of the file
            raise UserError(f"{f}: {size:,} bytes, but its header needs {max(ends):,} (cut short: a copy or "
                            "download that did not finish); copy the states folder again or rewrite the states")
        run_id = s.get("run_id") or man.get("run_id")
        if run_id and meta.get("run_id") and meta["run_id"] != run_id:
            raise UserError(f"{f}: from run {meta['run_id']}, the manifest is run {run_id} "
                            "(a shard from another run); rewrite the states")
        tensors = {k: (base + v["data_offsets"][0], v["dtype"], tuple(v["shape"]))
                   for k, v in header.items()}
        sh = Shard(f, int(s["rows"]), tensors, meta)
        shards.append(sh)
        off, _, shape = tensors["key"]
        keys.append(np.array(np.memmap(f, dtype=np.int64, mode="r", offset=off, shape=shape)))
    scan_path = scan_path if scan_path.is_file() else None
    if scan_path is not None:
        check_scan_tie(man, folder, scan_path)
    return StatesSet(folder, man, shards, np.concatenate(keys) if keys else np.zeros(0, np.int64), scan_path)


def _check_manifest(man, mpath: Path) -> None:
    """A manifest's fields have the types and values the reader relies on (a hand-edited one: one line)."""
    if not isinstance(man, dict) or man.get("format") != FORMAT:
        got = man.get("format") if isinstance(man, dict) else type(man).__name__
        raise UserError(f"{mpath}: format {got!r}, expected {FORMAT!r}")
    need = ("layers", "dtype", "hidden_size", "key", "n", "shards")
    missing = [k for k in need if k not in man]
    if missing:
        raise UserError(f"{mpath}: missing {missing}")
    if man["dtype"] not in DTYPES:
        raise UserError(f"{mpath}: dtype {man['dtype']!r}; one of {DTYPES}")
    if man["key"] not in KEYS:
        raise UserError(f"{mpath}: key {man['key']!r}; one of {KEYS}")
    layers = man["layers"]
    if (not isinstance(layers, list) or not layers or not all(isinstance(l, str) and l for l in layers)
            or len({canonical_layer(l, note=False) for l in layers}) != len(layers)):
        raise UserError(f"{mpath}: layers must be distinct non-empty names, got {layers!r}")
    for k in ("hidden_size", "n"):
        if type(man[k]) is not int or man[k] < (1 if k == "hidden_size" else 0):
            raise UserError(f"{mpath}: {k} must be a {'positive' if k == 'hidden_size' else 'non-negative'} "
                            f"integer, got {man[k]!r}; rewrite the states")
    shards = man["shards"]
    if not isinstance(shards, list):
        raise UserError(f"{mpath}: shards must be a list of {{file, rows}}, got {type(shards).__name__}; rewrite the states")
    for i, s in enumerate(shards):
        ok = (isinstance(s, dict) and isinstance(s.get("file"), str) and s["file"] == Path(s["file"]).name
              and s["file"] not in ("", ".", "..") and type(s.get("rows")) is int and s["rows"] >= 0)
        if not ok:
            raise UserError(f"{mpath}: shard {i} must be {{\"file\": a file name in the folder, \"rows\": a "
                            f"non-negative integer}}, got {str(s)[:80]}; rewrite the states")
    if sum(s["rows"] for s in shards) != man["n"]:
        raise UserError(f"{mpath}: the shards' rows do not add up to n={man['n']}")


def write_states(folder: str | os.PathLike, keys, layers: Mapping[str, object], *,
                 dtype: str = "float32", key: str = "token_id", scan: dict | None = None,
                 shard_rows: int = 65536, run_id: str | None = None) -> Path:
    """Write a states folder from in-memory arrays (tests, small tools; the engine streams its own).

    keys: (n,) ints; layers: name -> (n, d) array (numpy or torch), the old name ``last`` stored as
    ``last_prenorm`` (:func:`rmfast.state_names.canonical_layer`, with its warning). Each file is written
    atomically and the manifest last, so a reader never sees a manifest without its shards.
    Returns the folder.
    """
    import torch

    from .io import atomic_write

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
        atomic_write(folder / name, lambda tmp, t=tensors: write_shard(tmp, t, {"format": FORMAT, "run_id": run_id}))
        shards.append({"file": name, "rows": hi - lo})
    man = {"format": FORMAT, "layers": list(mats), "dtype": dtype, "hidden_size": d, "key": key,
           "n": n, "shards": shards, "run_id": run_id, _NONFINITE: nonfinite, "scan": dict(scan or {})}
    atomic_write(folder / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
    return folder


# --------------------------------------------------------------------------------------------
# the streaming writer a scan uses (layer names: rmfast.state_names, re-exported here)

def partial_folder(folder: Path) -> Path:
    """``<folder>.partial``, where a states folder is written until it is complete; one line where something other
    than a folder is there (a file left by hand: the writer's ``mkdir`` raised FileExistsError mid-scan)."""
    from .io import describe_path

    partial = folder.with_name(folder.name + ".partial")
    what = describe_path(partial)
    if what not in ("nothing", "a folder"):
        raise UserError(f"{partial} is {what}, not a folder: rmfast writes the states there until they are complete; "
                        "remove it (or choose another --out)")
    return partial


class StatesWriter:
    """Writes a scan's states streaming, resumable and atomic (``rmfast-states/1``).

    Shards go into ``<folder>.partial/`` as the scan saves its checkpoint: :meth:`add` buffers a
    batch's rows, :meth:`flush` writes them as one shard (atomically) right after the checkpoint
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
        self._buf: list[tuple[np.ndarray, np.ndarray, dict]] = []
        self.shard_rows = 65536
        self.shard_bytes = SHARD_BYTES
        self._buf_bytes = 0  # bytes of the buffered batches' states
        self._have: np.ndarray | None = None  # (N,) bool: job rows with a state on disk or buffered
        self._kept = 0  # bytes of fresh host buffers buffered as they are (take), until the next shard
        self._next = 0  # the next shard's number (prepare, which every add needs first: after the shards kept)
        self.run_shard = lambda cut: cut()()  # cut a shard and write it (BackgroundWriter: once a writer is free)
        self.run_id = None
        if self.folder.exists() and not overwrite:
            raise UserError(f"{self.folder} exists; use --overwrite to replace it (or choose another --out)")

    def _shards(self) -> list[Path]:
        return sorted(self.partial.glob("shard-*.safetensors"))

    def prepare(self, done: np.ndarray) -> np.ndarray:
        """Match the partial folder to the checkpoint's ``done`` (N,) rows; returns done & has-state."""
        import shutil

        info = self.partial / "job.json"
        old = json.loads(info.read_text()) if info.is_file() else None
        if old is None or {k: old.get(k) for k in self.job} != self.job:
            if done.any():  # the checkpoint's scores stand, but rows without their states are scored again: said
                was = "no states" if old is None else f"states {', '.join(old.get('layers') or [])} in {old.get('dtype')}"
                warnings.warn(f"rmfast: note: the checkpoint's {int(done.sum()):,} scored rows are scored again: it "
                              f"kept {was}, this scan asks for {', '.join(self.layers)} in {self.job['dtype']}",
                              stacklevel=3)
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
            self.run_id = uuid.uuid4().hex
            info.write_text(json.dumps({**self.job, "run_id": self.run_id}))
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
            self.append(got[0], got[1], self.take(states, got[2]))

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

    def append(self, rows: np.ndarray, keys: np.ndarray, mats: dict) -> None:
        """Buffer taken rows (:meth:`take`); write them as a shard once ``shard_rows`` rows or ``shard_bytes``
        bytes are buffered."""
        self._buf.append((rows, keys, mats))
        self._buf_bytes += sum(m.numel() * m.element_size() for m in mats.values())
        if sum(len(b[0]) for b in self._buf) >= self.shard_rows or self._buf_bytes >= self.shard_bytes:
            self.flush()  # early is safe: a shard the checkpoint does not cover is dropped on resume

    def flush(self) -> None:
        """Write the buffered rows as the next shard (atomically). Call before the checkpoint is saved."""
        if self._buf:
            self.run_shard(self.cut)

    def cut(self):
        """The buffered rows as the next shard, numbered and unbuffered now (in the scan's order): a callable that
        counts its non-finite values and writes it (:meth:`flush`: at once; BackgroundWriter: on a writer thread)."""
        if not self._buf:
            return None
        import torch

        from .io import atomic_write

        # name -> the buffered batches' pieces, written one after another (rmfast.states_shard: never joined)
        t = {"key": [torch.from_numpy(np.concatenate([b[1] for b in self._buf]).astype(np.int64))],
             "rows": [torch.from_numpy(np.concatenate([b[0] for b in self._buf]).astype(np.int64))]}
        t.update({f"layer.{l}": [b[2][l] for b in self._buf] for l in self.layers})
        path, self._next = self.partial / f"shard-{self._next:05d}.safetensors", self._next + 1
        self._buf, self._kept, self._buf_bytes = [], 0, 0

        def write() -> None:
            # counted per shard, in its metadata: a resumed scan's total includes the shards of the run before
            bad = json.dumps(nonfinite_per_layer({l: t[f"layer.{l}"] for l in self.layers}))
            meta = {"format": FORMAT, "run_id": self.run_id, _NONFINITE: bad}
            try:
                atomic_write(path, lambda tmp: write_shard(tmp, t, meta))
            except OSError as e:  # a full disk: the shards so far and the scan's checkpoint stay
                raise UserError(f"cannot write a states shard in {path.parent}: {e.strerror or e}; what was done is "
                                "kept: free space and rerun the same command to resume") from None
        return write

    def finish(self, scan: dict | None = None) -> Path:
        """Every row has its state: write the manifest and move the folder into place. Returns it."""
        import shutil

        from .io import atomic_write

        self.flush()
        if self._have is None or not self._have.all():
            missing = 0 if self._have is None else int((~self._have).sum())
            raise RuntimeError(f"states: {missing} rows have no state")  # a bug, never input
        shards, n, d = [], 0, None
        nonfinite = dict.fromkeys(self.layers, 0)
        for f in self._shards():
            header, _ = _read_header(f)
            rows = header["key"]["shape"][0]
            d = header[f"layer.{self.layers[0]}"]["shape"][1]
            shards.append({"file": f.name, "rows": rows})
            n += rows
            for l, v in _shard_nonfinite(header).items():
                nonfinite[l] = nonfinite.get(l, 0) + v
        warn_nonfinite(nonfinite, n, d or 0, self.dtype, self.folder)
        man = {"format": FORMAT, "layers": self.layers, "dtype": self.dtype, "hidden_size": d, "key": self.key,
               "n": n, "shards": shards, "run_id": self.run_id, _NONFINITE: nonfinite, "scan": dict(scan or {})}
        atomic_write(self.partial / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
        (self.partial / "job.json").unlink(missing_ok=True)
        if self.folder.exists():
            shutil.rmtree(self.folder)  # --overwrite (checked at the start)
        os.replace(self.partial, self.folder)
        return self.folder


def _shard_nonfinite(header: dict) -> dict[str, int]:
    """A shard's NaN/inf count per layer, from its metadata ({} for a shard written without one)."""
    try:
        got = json.loads((header.get("__metadata__") or {}).get(_NONFINITE) or "{}")
        return {str(k): int(v) for k, v in got.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _read_rows(file: Path) -> np.ndarray | None:
    """The ``rows`` tensor of a partial shard (job rows), or None if it cannot be read."""
    try:
        header, base = _read_header(file)
        v = header["rows"]
        return np.array(np.memmap(file, dtype=np.int64, mode="r", offset=base + v["data_offsets"][0],
                                  shape=tuple(v["shape"])))
    except (UserError, KeyError, ValueError, OSError):
        return None


class StatesMerge:
    """The states of a torchrun scan: every rank's finished folder joined into one by moving its shards.

    ``parts``: the ranks' folders, in rank order; ``folder``: the scan's states folder. Nothing is copied:
    :meth:`finish` checks each part (:func:`open_states`), moves its shards into ``<folder>.partial/``
    (renumbered, each shard entry naming its rank's ``run_id``), writes the manifest, renames the folder
    into place and removes the parts. Keys are global already (token ids; rows of the merged scan, which
    :class:`rmfast.scoring.pipeline.StatesRequest` ``row_keys`` gives each rank).
    """

    def __init__(self, parts, folder):
        self.parts, self.folder = [Path(p) for p in parts], Path(folder)

    def finish(self, scan: dict | None = None) -> Path:
        import shutil

        from .io import atomic_write

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
                os.replace(sh.file, partial / name)
                shards.append({"file": name, "rows": sh.rows, "run_id": s.manifest.get("run_id")})
        nonfinite = {l: sum(int((s.manifest.get(_NONFINITE) or {}).get(l, 0)) for s in sets) for l in head["layers"]}
        man = {"format": FORMAT, **head, "n": sum(s.n for s in sets), "shards": shards, _NONFINITE: nonfinite,
               "scan": dict(scan or sets[0].manifest.get("scan") or {}), "ranks": len(sets)}
        atomic_write(partial / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
        if self.folder.exists():
            shutil.rmtree(self.folder)  # --overwrite (checked at the start)
        os.replace(partial, self.folder)
        for p in self.parts:
            shutil.rmtree(p, ignore_errors=True)
        return self.folder
