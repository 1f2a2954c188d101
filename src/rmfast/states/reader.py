"""Reading a states folder (``rmfast-states/1``, :mod:`rmfast.states.format`): :func:`open_states` checks every
shard against the manifest and the folder against the scan beside it, and returns a :class:`StatesSet`, which maps
the tensors (``numpy.memmap``) and gathers any rows with memory proportional to the rows asked for."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..io import states_dir
from ..parquet_read import read_parquet
from .format import MANIFEST, NONFINITE, NP_RAW, ST_DTYPE, check_manifest, read_header
from .names import canonical_layer
from .tie import check_scan_tie


@dataclass
class Shard:
    """One shard file: its rows and, per tensor name, (byte offset in the file, safetensors dtype, shape)."""

    file: Path
    rows: int
    tensors: dict[str, tuple[int, str, tuple[int, ...]]]
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class StatesSet:
    """An opened states folder (see :mod:`rmfast.states.format`).

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
        got = self.manifest.get(NONFINITE)
        v = got.get(self.stored_name(layer)) if isinstance(got, dict) else None
        return v if isinstance(v, int) else 0

    def _map(self, i: int, tensor: str) -> np.ndarray:
        if (i, tensor) not in self._maps:
            sh = self.shards[i]
            off, dt, shape = sh.tensors[tensor]
            self._maps[(i, tensor)] = np.memmap(sh.file, dtype=NP_RAW[dt], mode="r",
                                                offset=off, shape=shape)
        return self._maps[(i, tensor)]

    def take(self, layer: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (global row numbers, any order, repeats allowed) of ``layer`` as float32.

        Returns (len(rows), d) float32; bfloat16 is widened exactly, float16 exactly.
        """
        tensor = f"layer.{self.stored_name(layer)}"
        got = np.asarray(rows)
        if got.size and (got.dtype.kind not in "iuf" or got.dtype.kind == "f" and not np.array_equal(got, np.floor(got))):
            raise UserError(f"{self.path}: rows must be whole numbers (row positions 0..{self.n - 1}), got "
                            f"{got.ravel()[:3].tolist()}")  # 1.7 was read as row 1
        rows = got.astype(np.int64).reshape(-1)  # (m,)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n):
            raise UserError(f"{self.path}: row out of range 0..{self.n - 1} (rows are positions in the set; its "
                            f"{self.key}s are in .keys)")
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
            df = read_parquet(self.scan_path, columns=cols)
        except UserError:
            raise
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
    check_manifest(man, mpath)
    shards, keys = [], []
    for s in man["shards"]:
        f = folder / s["file"]
        header, base = read_header(f)
        meta = header.pop("__metadata__", None) or {}
        want = {"key": ("I64", (s["rows"],))}
        want.update({f"layer.{l}": (ST_DTYPE[man["dtype"]], (s["rows"], man["hidden_size"]))
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
