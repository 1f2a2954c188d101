"""The shard writer (rmfast.states.shard): the bytes of safetensors' save_file on the joined tensors, written
from the batches' pieces; the NaN/inf count of torch.isfinite from the bits."""

import json
import os
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from rmfast.states import StatesWriter, open_states
from rmfast.states.shard import count_nonfinite, rows_finite, write_shard


def _split(path):
    """(header JSON as parsed, header length, data bytes) of a safetensors file."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), n, raw[8 + n:]


def _pieces(dtype, layers, sizes, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {"key": [torch.arange(sum(sizes), dtype=torch.int64) * 7]}
    t["rows"] = [torch.arange(sum(sizes), dtype=torch.int64)]
    for l in layers:
        t[f"layer.{l}"] = [(torch.randn(b, d, generator=g) * 100).to(dtype) for b in sizes]
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("metadata", [None, {}, {"format": "rmfast-states/1"}])
def test_write_shard_is_save_file_byte_for_byte(tmp_path, dtype, metadata):
    t = _pieces(dtype, ["last_prenorm", "0", "10", "2", "last_normed"], [3, 1, 4, 0, 2])
    write_shard(tmp_path / "a.safetensors", t, metadata)
    save_file({k: torch.cat(v) for k, v in t.items()}, str(tmp_path / "b.safetensors"), metadata=metadata)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_write_shard_metadata_in_the_order_given(tmp_path):
    """save_file orders several metadata keys by a Rust hash map (differently in every process); apart from that
    order the header is the same text, and the tensors' bytes the same."""
    meta = {"format": "rmfast-states/1", "run_id": "ab12", "n_nonfinite": json.dumps({"0": 0, "last_prenorm": 3})}
    t = _pieces(torch.bfloat16, ["0", "last_prenorm"], [2, 3])
    write_shard(tmp_path / "a.safetensors", t, meta)
    save_file({k: torch.cat(v) for k, v in t.items()}, str(tmp_path / "b.safetensors"), metadata=meta)
    a, b = _split(tmp_path / "a.safetensors"), _split(tmp_path / "b.safetensors")
    assert a == b
    assert list(a[0]["__metadata__"]) == list(meta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_count_nonfinite_is_isfinite(dtype):
    x = torch.randn(1000, 7) * 1e4
    x[3, 2], x[10, 0], x[999, 6], x[500, 1] = float("nan"), float("inf"), float("-inf"), -float("nan")
    x[7, 3] = 1e-42  # a subnormal in float32 (0 in the others)
    t = x.to(dtype)
    t.view(-1)[42] = torch.finfo(dtype).max
    want = int((~torch.isfinite(t)).sum())
    assert want >= 4  # float16 overflows past 65,504 too
    assert count_nonfinite(t) == want
    assert count_nonfinite([t[:300], t[300:]]) == want
    assert count_nonfinite(torch.arange(5)) == 0
    rows = 7 - rows_finite([t, t[:, :3]])  # (2, 1000): the device's per-row count, the same values row by row
    assert rows.dtype == torch.int32 and int(rows[0].sum()) == want
    assert [count_nonfinite(t[i:i + 1]) for i in range(0, 1000, 37)] == rows[0, ::37].tolist()
    assert (rows[1] - 4).tolist() == [count_nonfinite(t[i:i + 1, :3]) for i in range(1000)]  # each tensor its own row


def test_writer_shard_is_the_joined_batches(tmp_path):
    """StatesWriter.flush writes the buffered batches without joining them: the file is what save_file of
    the joined tensors gives (as before), up to save_file's own metadata order; the reader reads it."""
    layers = ["0", "3", "last_prenorm"]
    w = StatesWriter(tmp_path / "s.states", layers, "bfloat16", "row", job="j")
    w.prepare(np.zeros(9, dtype=bool))
    g = torch.Generator().manual_seed(1)
    batches = [(np.arange(lo, hi), {l: torch.randn(hi - lo, 6, generator=g) for l in layers})
               for lo, hi in [(0, 4), (4, 5), (5, 9)]]
    batches[1][1]["3"][0, 2] = float("inf")
    for rows, st in batches:
        w.add(rows, rows + 100, st)
    w.flush()
    shard = w.partial / "shard-00000.safetensors"
    head, _, data = _split(shard)
    meta = head["__metadata__"]
    assert json.loads(meta["n_nonfinite"]) == {"0": 0, "3": 1, "last_prenorm": 0}
    ref = {"key": torch.arange(100, 109), "rows": torch.arange(9)}
    ref.update({f"layer.{l}": torch.cat([st[l] for _, st in batches]).to(torch.bfloat16) for l in layers})
    save_file(ref, str(tmp_path / "ref.safetensors"), metadata=meta)
    assert (head, data) == (lambda r: (r[0], r[2]))(_split(tmp_path / "ref.safetensors"))
    with pytest.warns(UserWarning, match="NaN or infinite"):
        folder = w.finish()
    s = open_states(folder)
    want = torch.cat([st["3"] for _, st in batches]).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(s.take("3", np.arange(9)), want)
    shard = folder / "shard-00000.safetensors"
    assert os.stat(shard).st_mode == os.stat(folder / "manifest.json").st_mode  # atomic_write's mode, not 0600
