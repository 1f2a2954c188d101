"""Hidden states of scanned candidates on disk: the ``rmfast-states/1`` folder format.

A states folder sits beside its scan, ``<scan stem>.states/`` (``scan.parquet`` ->
``scan.states/``), or anywhere. It holds::

    manifest.json
        {"format": "rmfast-states/1",
         "layers": ["0", "8", "last", "last_normed"],   # names, in order
         "dtype": "float32" | "bfloat16" | "float16",   # of every layer tensor
         "hidden_size": d,
         "key": "token_id" | "row",                      # what the key tensor holds
         "n": total rows,
         "shards": [{"file": "shard-00000.safetensors", "rows": n_0}, ...],
         "run_id": "..."                                 # optional; see below
         "scan": {"model": ..., "prompt": ..., ...}}     # free-form provenance
    shard-00000.safetensors, ...
        key            (n_i,)    int64   token ids, or row numbers of the scan Parquet
        layer.<name>   (n_i, d)  dtype   one tensor per layer of the manifest

Rows are the concatenation of the shards in manifest order. ``run_id`` (optional) is
also written into every shard's safetensors metadata; when both carry one they must
match, so a shard copied in from another run is refused. Without it a foreign shard is
still refused when its rows, tensors, shape or dtype disagree with the manifest.

Reading never loads a whole shard: the reader parses the safetensors header and maps
the tensors (``numpy.memmap``), so :meth:`StatesSet.take` gathers any rows with memory
proportional to the rows asked for. bfloat16 is widened to float32 bit-exactly.

Example:
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "s.states"
    >>> x = np.arange(12, dtype="float32").reshape(4, 3)                 # (n=4, d=3)
    >>> _ = write_states(d, np.array([5, 6, 7, 8]), {"last": x}, shard_rows=3)
    >>> s = open_states(d)
    >>> s.n, s.layers, s.hidden_size, [sh.rows for sh in s.shards]
    (4, ['last'], 3, [3, 1])
    >>> s.take("last", np.array([3, 0])).tolist()                         # rows 3 and 0
    [[9.0, 10.0, 11.0], [0.0, 1.0, 2.0]]
"""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import UserError

FORMAT = "rmfast-states/1"
DTYPES = ("float32", "bfloat16", "float16")
KEYS = ("token_id", "row")
MANIFEST = "manifest.json"
# safetensors dtype tags for the dtypes above and the key tensor
_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_NP_RAW = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}


def states_dir(path: str | os.PathLike) -> Path:
    """The states folder for ``path``: a scan Parquet's ``<stem>.states`` or the folder itself.

    >>> states_dir("runs/a.parquet").as_posix(), states_dir("runs/a.states").as_posix()
    ('runs/a.states', 'runs/a.states')
    """
    p = Path(path)
    if p.suffix == ".parquet":
        return p.with_suffix(".states")
    return p


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
        return list(self.manifest["layers"])

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
        if layer not in self.layers:
            raise UserError(f"{self.path}: no layer {layer!r}; it has {self.layers}")

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
        self.check_layer(layer)
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
            raw = self._map(int(i), f"layer.{layer}")[local[order]]  # (k, d) raw dtype
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
    """Open a states folder, or the one beside a scan Parquet; check every shard against the manifest."""
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
        have = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}
        if have != want:
            diff = sorted(set(have.items()) ^ set(want.items()))
            raise UserError(f"{f}: does not match {mpath} (a shard from another run?): "
                            f"tensors differ at {diff[:3]}")
        if man.get("run_id") and meta.get("run_id") and meta["run_id"] != man["run_id"]:
            raise UserError(f"{f}: from run {meta['run_id']}, the manifest is run {man['run_id']} "
                            "(a shard from another run); rewrite the states")
        tensors = {k: (base + v["data_offsets"][0], v["dtype"], tuple(v["shape"]))
                   for k, v in header.items()}
        sh = Shard(f, int(s["rows"]), tensors, meta)
        shards.append(sh)
        off, _, shape = tensors["key"]
        keys.append(np.array(np.memmap(f, dtype=np.int64, mode="r", offset=off, shape=shape)))
    out = StatesSet(folder, man, shards, np.concatenate(keys) if keys else np.zeros(0, np.int64),
                    scan_path if scan_path.is_file() else None)
    return out


def _check_manifest(man, mpath: Path) -> None:
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
    if not layers or not all(isinstance(l, str) and l for l in layers) or len(set(layers)) != len(layers):
        raise UserError(f"{mpath}: layers must be distinct non-empty names, got {layers!r}")
    if sum(int(s.get("rows", -1)) for s in man["shards"]) != man["n"]:
        raise UserError(f"{mpath}: the shards' rows do not add up to n={man['n']}")


def write_states(folder: str | os.PathLike, keys, layers: Mapping[str, object], *,
                 dtype: str = "float32", key: str = "token_id", scan: dict | None = None,
                 shard_rows: int = 65536, run_id: str | None = None) -> Path:
    """Write a states folder from in-memory arrays (tests, small tools; the engine streams its own).

    keys: (n,) ints; layers: name -> (n, d) array (numpy or torch). Each file is written
    atomically and the manifest last, so a reader never sees a manifest without its shards.
    Returns the folder.
    """
    import torch
    from safetensors.torch import save_file

    from .io import atomic_write

    if dtype not in DTYPES:
        raise UserError(f"dtype {dtype!r}; one of {DTYPES}")
    if key not in KEYS:
        raise UserError(f"key {key!r}; one of {KEYS}")
    folder = Path(folder)
    keys_t = torch.as_tensor(np.ascontiguousarray(keys, dtype=np.int64))  # (n,)
    n = len(keys_t)
    def as_tensor(v):  # numpy or torch (any float dtype, bfloat16 included) -> (n, d) in ``dtype``
        if isinstance(v, torch.Tensor):
            return v.detach().cpu().to(getattr(torch, dtype)).contiguous()
        return torch.as_tensor(np.ascontiguousarray(v, dtype=np.float32)).to(getattr(torch, dtype))

    mats = {name: as_tensor(v) for name, v in layers.items()}  # name -> (n, d)
    dims = {tuple(m.shape) for m in mats.values()}
    if len(dims) != 1 or next(iter(dims))[0] != n or len(next(iter(dims))) != 2:
        raise UserError(f"every layer must be (n={n}, d); got {sorted(dims)}")
    d = next(iter(dims))[1]
    run_id = run_id or uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for i, lo in enumerate(range(0, max(n, 1), shard_rows)):
        hi = min(n, lo + shard_rows)
        name = f"shard-{i:05d}.safetensors"
        tensors = {"key": keys_t[lo:hi].contiguous()}
        tensors.update({f"layer.{l}": m[lo:hi].contiguous() for l, m in mats.items()})
        atomic_write(folder / name, lambda tmp, t=tensors: save_file(
            t, str(tmp), metadata={"format": FORMAT, "run_id": run_id}))
        shards.append({"file": name, "rows": hi - lo})
    man = {"format": FORMAT, "layers": list(mats), "dtype": dtype, "hidden_size": d, "key": key,
           "n": n, "shards": shards, "run_id": run_id, "scan": dict(scan or {})}
    atomic_write(folder / MANIFEST, lambda tmp: Path(tmp).write_text(json.dumps(man, indent=1)))
    return folder
