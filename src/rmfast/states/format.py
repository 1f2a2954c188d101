"""Hidden states of scanned candidates on disk: the ``rmfast-states/1`` folder format.

A states folder sits beside its scan, ``<scan stem>.states/`` (``scan.parquet`` ->
``scan.states/``), or anywhere. It holds::

    manifest.json
        {"format": "rmfast-states/1",
         "layers": ["0", "8", "last_prenorm", "last_normed"],   # names, in order (rmfast.states.names)
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
manifest's place for that shard: a folder joined from a torchrun scan's ranks (:class:`rmfast.states.writer.StatesMerge`)
lists each rank's run. Without it a foreign shard is still refused when its rows, tensors, shape or
dtype disagree with the manifest.

A states folder belongs to one write of its scan: ``scan.write_id`` is the scan pair's write id
(:func:`rmfast.io.write_pair`), and :func:`rmfast.states.open_states` refuses a folder beside a scan Parquet of
another write (a scan rerun over the same ``--out``, or states of another model copied in); states
written without a scan file (the Python API) name the scan's model, prompt and candidate count
instead, which are compared with the Parquet's manifest. Stored values that are NaN or infinite (a
float16 overflow past 65,504) are counted per layer (``n_nonfinite``) and warned about when written.

Layer names (:mod:`rmfast.states.names`): ``last_prenorm`` is the stream before the final norm,
``last_normed`` what the head reads (HF's ``hidden_states[-1]``). A folder written before the rename
names the first ``last`` (tensor ``layer.last``): it reads as ``last_prenorm`` (:attr:`rmfast.states.StatesSet.layers`),
and ``take("last")`` still finds it.

Reading never loads a whole shard: the reader parses the safetensors header and maps
the tensors (``numpy.memmap``), so :meth:`rmfast.states.StatesSet.take` gathers any rows with memory
proportional to the rows asked for. bfloat16 is widened to float32 bit-exactly.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import UserError
from .names import canonical_layer

FORMAT = "rmfast-states/1"
DTYPES = ("float32", "bfloat16", "float16")
KEYS = ("token_id", "row")
MANIFEST = "manifest.json"
# safetensors dtype tags for the dtypes above and the key tensor
ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
NP_RAW = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64}
#: a shard's safetensors metadata key: its count of NaN/inf values per layer (JSON)
NONFINITE = "n_nonfinite"


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



def read_header(file: Path) -> tuple[dict, int]:
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


def check_manifest(man, mpath: Path) -> None:
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
