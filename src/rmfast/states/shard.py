"""A states shard's bytes written straight from its batches' tensors (the ``rmfast-states/1`` shard writer).

A shard (:mod:`rmfast.states`) is a safetensors file: an 8-byte little-endian header length, the header
(compact JSON, padded with spaces to a multiple of 8 bytes), then every tensor's raw bytes, one after
another. :func:`write_shard` writes that file from each tensor's pieces (a batch's (b, d) rows each), in
order, so the shard is never joined in memory first (no ``torch.cat`` of the buffered batches, no copy into
bytes): the header, then each piece's own memory, in large writes. The bytes are those of
``safetensors.torch.save_file`` on the joined tensors: the same tensor order (wider dtypes first, then by
name), the same header text and padding (tests/test_states_shard.py compares them); one thing differs:
save_file writes its metadata keys in the order of a Rust hash map (a different order in every process),
this writer in the order given.

:func:`count_nonfinite` counts NaN and +-inf values from their bit patterns (exponent bits all set), the
same count as ``(~torch.isfinite(t)).sum()`` at memory speed: torch's ``isfinite`` on bfloat16 runs at
about 120 MB/s on a CPU without native bfloat16 (an AMD EPYC, AVX2), slower than the disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import UserNote

#: safetensors dtype tag, the raw integer view used to count non-finite values, the exponent mask
_DTYPES = {"float32": ("F32", np.uint32, 0x7F800000), "bfloat16": ("BF16", np.uint16, 0x7F80),
           "float16": ("F16", np.uint16, 0x7C00), "int64": ("I64", np.uint64, None)}
#: safetensors orders tensors by dtype, widest first (its ``Dtype`` enum, descending), then by name
_RANK = {"I64": 3, "F32": 2, "BF16": 1, "F16": 0}
#: elements counted at a time by :func:`count_nonfinite` (its temporaries stay in the cache)
_CHUNK = 1 << 18


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def raw_bytes(t) -> np.ndarray:
    """A contiguous CPU tensor's memory as a (nbytes,) uint8 array (no copy)."""
    return t.detach().reshape(-1).view(_torch_uint8()).numpy()


def _torch_uint8():
    import torch

    return torch.uint8


def count_nonfinite(pieces) -> int:
    """NaN or +-inf values in a float tensor or a sequence of them (CPU, contiguous): their exponent bits are
    all set. The count of ``(~torch.isfinite(t)).sum()``, read in cache-sized chunks of the raw bits."""
    if not isinstance(pieces, (list, tuple)):
        pieces = [pieces]
    total = 0
    for t in pieces:
        _, raw, mask = _DTYPES[_dtype_name(t)]
        if mask is None:
            continue  # an integer tensor: every value is finite
        bits = raw_bytes(t).view(raw)  # (numel,)
        for lo in range(0, bits.size, _CHUNK):
            total += int(np.count_nonzero((bits[lo:lo + _CHUNK] & raw(mask)) == raw(mask)))
    return total


def rows_finite(xs) -> "torch.Tensor":
    """(L, B) int32: each row's finite values in each of the L (B, d_l) float tensors, on their device, as one tensor
    (two ops a tensor and a stack: a GPU scan counts its states so before their copy to the host, so the shard writers
    there only sum; ``d_l`` minus it is what :func:`count_nonfinite` counts, row by row).

    >>> import torch
    >>> rows_finite([torch.tensor([[1.0, float("nan")], [float("-inf"), float("inf")]])]).tolist()
    [[1, 0]]
    """
    import torch

    return torch.stack([torch.isfinite(x).sum(dim=1, dtype=torch.int32) for x in xs])


def shard_header(tensors: Mapping[str, Sequence], metadata: Mapping[str, str] | None) -> tuple[bytes, list[str]]:
    """The safetensors header of tensors given as name -> pieces (each (b_i, ...) with the same trailing shape
    and dtype, joined along dim 0): (the 8-byte length + padded JSON, the names in file order)."""
    info = {}
    for name, pieces in tensors.items():
        dtypes = {_dtype_name(p) for p in pieces}
        trail = {tuple(p.shape[1:]) for p in pieces}
        if len(dtypes) != 1 or len(trail) != 1:
            raise ValueError(f"{name}: pieces of dtypes {sorted(dtypes)} and trailing shapes {sorted(trail)}")
        tag = _DTYPES[dtypes.pop()][0]
        shape = [sum(int(p.shape[0]) for p in pieces), *trail.pop()]
        info[name] = (tag, shape, sum(p.numel() * p.element_size() for p in pieces))
    order = sorted(info, key=lambda n: (-_RANK[info[n][0]], n.encode()))
    head: dict = {} if metadata is None else {"__metadata__": dict(metadata)}
    offset = 0
    for name in order:
        tag, shape, nbytes = info[name]
        head[name] = {"dtype": tag, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(head, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, order


def write_shard(path, tensors: Mapping[str, Sequence], metadata: Mapping[str, str] | None = None) -> int:
    """Write a safetensors file at ``path`` from name -> pieces (contiguous CPU tensors, see
    :func:`shard_header`): the header, then each tensor's pieces' memory as it is. Returns the bytes written."""
    header, order = shard_header(tensors, metadata)
    n = len(header)
    with open(path, "wb") as f:  # buffered: a small piece is gathered, a large one written in place
        f.write(header)
        for name in order:
            for p in tensors[name]:
                if not p.is_contiguous():
                    raise ValueError(f"{name}: a piece is not contiguous")
                if p.numel():
                    n += f.write(raw_bytes(p))
    return n


def nonfinite_per_layer(mats: Mapping[str, object]) -> dict[str, int]:
    """NaN or +-inf values per layer of name -> (b, d) tensor as stored (after the cast to the stored dtype), or
    name -> the pieces of one (a shard's buffered batches): :func:`count_nonfinite`."""
    return {name: count_nonfinite(m) for name, m in mats.items()}


def warn_nonfinite(counts: Mapping[str, int], rows: int, d: int, dtype: str, where) -> None:
    """One warning when stored states hold NaN or inf (a float16 overflow, or the model's own): how many
    per layer, and the fix."""
    import warnings

    bad = {k: v for k, v in counts.items() if v}
    if not bad:
        return
    total = max(1, rows * d)
    shown = ", ".join(f"{k}: {v:,} ({100 * v / total:.1f}%)" for k, v in list(bad.items())[:6])
    fix = ("float16 overflows past 65,504: store them with --states-dtype bfloat16 or float32"
           if dtype == "float16" else "the model's own activations are not finite (a float16 model overflows: try "
           "--dtype float32; in bfloat16 or float32, its weights or inputs)")
    warnings.warn(UserNote(f"rmfast: warning: {where}: stored states are NaN or infinite ({shown} of {total:,} values "
                           f"per layer); {fix}; counted in the states manifest's n_nonfinite, and analyses of those "
                           "layers are undefined"), stacklevel=3)
