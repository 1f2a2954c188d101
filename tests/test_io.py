"""rmfast.io: result files are written atomically and created as any program creates a file
(mode 0666 & ~umask), not with tempfile's private 0600; output names are cut at whole words."""

import os
import stat
from pathlib import Path

import pandas as pd
import pytest

from cli_run import run

from rmfast.io import atomic_write, slug, write_json, write_parquet, write_result
from rmfast.analysis.report import write_report


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test, then put the old one back."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


def _write_everything(d):
    df = pd.DataFrame({"token_id": [1, 2], "score": [0.5, -0.5]})
    write_result(d / "scan.parquet", df, {"model": "x"})  # Parquet + its JSON manifest
    write_json(d / "gcg.json", {"best": 1.0})  # GCGResult.to_json goes through write_json
    write_parquet(d / "part.parquet", df)
    write_report(d / "report.html", "<!DOCTYPE html><html></html>")
    atomic_write(d / "plot.png", lambda tmp: open(tmp, "wb").write(b"\x89PNG"))
    atomic_write(d / "new" / "sub.csv", lambda tmp: df.to_csv(tmp, index=False))  # folder created
    return sorted((p for p in d.rglob("*") if p.is_file()), key=lambda p: p.name)


@pytest.mark.parametrize("mask,want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_honour_the_umask(tmp_path, umask, mask, want):
    umask(mask)
    files = _write_everything(tmp_path)
    assert [p.name for p in files] == ["gcg.json", "part.parquet", "plot.png", "report.html", "scan.parquet",
                                       "scan.parquet.json", "sub.csv"]
    assert {p.name: oct(_mode(p)) for p in files} == {p.name: oct(want) for p in files}


def test_overwrite_is_atomic_and_leaves_no_temporary(tmp_path, umask):
    p = tmp_path / "a.json"
    write_json(p, {"v": 1})
    with pytest.raises(KeyboardInterrupt):
        atomic_write(p, lambda tmp: (open(tmp, "w").write("half"), (_ for _ in ()).throw(KeyboardInterrupt)))
    assert p.read_text() == '{\n  "v": 1\n}\n'  # the old content, whole
    write_json(p, {"v": 2})
    assert '"v": 2' in p.read_text()
    assert [x.name for x in tmp_path.iterdir()] == ["a.json"]  # no .a.json.*.tmp left behind


@pytest.mark.parametrize("text,n,want", [
    ("What, in one word, is the greatest thing ever?", 40, "what-in-one-word-is-the-greatest-thing"),
    ("one two three", 7, "one-two"),  # the '-' right after n characters: the words before it are whole
    ("one two three", 6, "one"),
    ("supercalifragilistic word", 5, "super"),  # one word longer than n: that word is cut
    ("short", 40, "short"),
])
def test_slug_cuts_at_a_word_boundary(text, n, want):
    assert slug(text, n) == want


def test_scan_default_out_names_whole_words(tiny_dir, tmp_path, monkeypatch, capsys):
    """The default --out, results/<model>__<prompt slug>__<selection>.parquet, ends the prompt's part on a whole
    word, and names the subset after it."""
    monkeypatch.chdir(tmp_path)
    rc, _, se = run(["scan", tiny_dir, "--token-ids", "0:10", "--no-progress",
                     "--prompt", "What, in one word, is the greatest thing ever?"], capsys)
    assert rc == 0, se
    [out] = (tmp_path / "results").glob("*.parquet")
    assert out.name.endswith("__what-in-one-word-is-the-greatest-thing__ids-0-10.parquet")


def test_a_job_refused_inside_the_output_lock_leaves_no_folders_it_made(tmp_path):
    """The lock made the output's folders; a job that stops before writing takes them away again (only the empty
    ones it made: a folder that was there, or one that now holds the output, stays)."""
    from rmfast.errors import UserError
    from rmfast.locks import output_lock

    out = tmp_path / "new" / "deeper" / "r.parquet"
    with pytest.raises(UserError):
        with output_lock(out):
            assert out.parent.is_dir()
            raise UserError("refused after the lock")
    assert list(tmp_path.iterdir()) == []
    with output_lock(out):
        out.write_text("x")
    assert out.read_text() == "x" and not Path(str(out) + ".lock").exists()


def test_files_are_on_the_disk_before_the_name_that_marks_them_finished(tmp_path, monkeypatch):
    """Without fsync a power loss after the rename can leave the new name empty (the rename on the disk, the bytes
    not yet): results, checkpoints and manifests are flushed before their renames, the folder after; a states
    folder's shards (written without a flush, side by side) before its manifest."""
    import os

    import numpy as np
    import pandas as pd
    import torch

    import rmfast.io as io
    from rmfast.states import StatesWriter

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(io.os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                   real_fsync(fd))[1])
    monkeypatch.setattr(io.os, "replace", lambda a, b: (events.append(("replace", str(a))), real_replace(a, b))[1])
    io.atomic_write(tmp_path / "a.txt", lambda tmp: Path(tmp).write_text("x"))
    tmp = events[1][1]
    assert events == [("fsync", tmp), ("replace", tmp), ("fsync", str(tmp_path))]
    events.clear()
    io.write_pair(tmp_path / "r.parquet", pd.DataFrame({"score": [1.0]}), {"prompt": "p"})
    kinds = [k for k, _ in events]
    assert kinds == ["fsync", "fsync", "replace", "replace", "fsync"] and {f for k, f in events[:2]} == {
        f for k, f in events[2:4]}
    events.clear()
    w = StatesWriter(tmp_path / "s.states", ["0"], "float32", "row", job="j")
    w.prepare(np.zeros(4, dtype=bool))
    w.shard_bytes = 2 * 2 * 4  # a shard a batch
    for b in range(2):
        w.add(np.arange(2 * b, 2 * b + 2), np.arange(2 * b, 2 * b + 2), {"0": torch.ones(2, 2)})
    w.finish({"model": "m"})
    manifest = next(i for i, (k, f) in enumerate(events) if k == "replace" and "manifest.json" in f)
    synced = {Path(f).name for k, f in events[:manifest] if k == "fsync"}
    assert synced >= {"shard-00000.safetensors", "shard-00001.safetensors"}


def test_a_lock_taken_on_a_removed_lock_file_is_taken_again_on_the_paths(tmp_path, monkeypatch):
    """output_lock removed its lock file after releasing it: a job that had opened the old file could lock it while
    a third job created and locked a new file at the same name, and both wrote the same output. Now the file is
    removed while held, and a lock found on a file no longer at the path is taken again on the path's own."""
    from filelock import FileLock

    import rmfast.locks as io

    name = str(tmp_path / "r.parquet.lock")
    a = FileLock(name)
    a.acquire(timeout=0)
    Path(name).unlink()  # a finished job's removal, while held
    c = FileLock(name)  # a third job: a new file at the name
    c.acquire(timeout=0)
    assert not io._holds_the_file_at(a, name) and io._holds_the_file_at(c, name)
    a.release(), c.release()
    real, seen = io._holds_the_file_at, []

    def first_on_a_removed_file(lock, n):
        seen.append(real(lock, n))
        return len(seen) > 1 and seen[-1]

    monkeypatch.setattr(io, "_holds_the_file_at", first_on_a_removed_file)
    with io.output_lock(tmp_path / "r.parquet"):
        assert len(seen) == 2 and Path(name).exists()
    assert not Path(name).exists()


def test_a_lock_file_that_cannot_be_removed_hides_no_error(tmp_path, monkeypatch):
    """The lock file's removal at the end raised over the job's own error: a checkpoint that could not be written
    (an immutable folder) was reported as "Operation not permitted: r.parquet.lock", and a finished job whose lock
    alone could not be removed was reported as failed."""
    import rmfast.locks as L

    real = Path.unlink

    def refused(self, *a, **kw):
        if self.name.endswith(".lock"):
            raise PermissionError(1, "Operation not permitted", str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(OSError, match="No space left"):
        with L.output_lock(tmp_path / "r.parquet"):
            raise OSError(28, "No space left on device")
    with L.output_lock(tmp_path / "r.parquet"):  # the job's success stays one
        pass


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path):
    """--out with a 300-byte name was an OSError traceback (ENAMETOOLONG from lstat); one of 240 passed the checks and
    failed at the first checkpoint, whose temporary name is 26 bytes longer. Both are one line before any work now."""
    from rmfast.errors import UserError
    from rmfast.io import NAME_EXTRA, check_output

    with pytest.raises(UserError, match="the name is too long for the file system"):
        check_output(tmp_path / ("x" * 300 + ".parquet"))
    with pytest.raises(UserError, match=f"rmfast writes names {NAME_EXTRA} bytes longer"):
        check_output(tmp_path / ("y" * 235 + ".parquet"))
    assert check_output(tmp_path / ("z" * 200 + ".parquet")).name.startswith("zzz")


def test_what_a_killed_write_leaves_is_finished_or_cleaned_by_the_rerun(tmp_path):
    """A kill between write_pair's renames left the Parquet without its manifest beside the job's checkpoint: the
    rerun said "already exists; pass --overwrite", reading as "throw it away". It is an unfinished result now, which
    the same command finishes. The killed writes' temporary files (megabytes each) stayed beside the output for
    good: the next job holding its lock removes them. A folder where the manifest or the checkpoint goes was found
    only after the scoring: refused before any work now."""
    from rmfast.errors import UserError
    from rmfast.io import check_output, unfinished_result
    from rmfast.locks import output_lock

    out = tmp_path / "s.parquet"
    out.write_bytes(b"PAR1")
    with pytest.raises(UserError, match="already exists"):
        check_output(out)  # no checkpoint: a file someone put there
    (tmp_path / "s.parquet.partial.npz").write_bytes(b"ck")
    assert unfinished_result(out) and check_output(out) == out  # the same command finishes it
    (tmp_path / "s.parquet.json").write_text("{}")
    with pytest.raises(UserError, match="already exists"):
        check_output(out)  # a pair: a finished result
    junk = [".s.parquet.0a1b2c3d.tmp", ".s.parquet.json.ffee0011.tmp", ".s.parquet.partial.npz.12345678.tmp"]
    kept = [".s.parquet.rank0.0a1b2c3d.tmp", ".t.parquet.0a1b2c3d.tmp", "s.parquet.partial.npz"]
    for n in junk + kept:
        (tmp_path / n).write_bytes(b"x")
    with output_lock(out):
        pass
    assert not any((tmp_path / n).exists() for n in junk) and all((tmp_path / n).exists() for n in kept)
    (tmp_path / "m.parquet.json").mkdir()
    with pytest.raises(UserError, match="m.parquet.json is a folder, not a regular file: rmfast writes .* manifest"):
        check_output(tmp_path / "m.parquet")
    (tmp_path / "c.parquet.partial.npz").mkdir()
    with pytest.raises(UserError, match="checkpoint there"):
        check_output(tmp_path / "c.parquet")


def test_a_manifest_that_hangs_or_nests_past_the_limit_is_one_line(tmp_path):
    """A FIFO at a result's manifest hung every reader; a manifest of 100,000 nested '[' was a RecursionError
    traceback. Both are one line now. A GCG JSON (no manifest) beside its own search's checkpoint is not an
    unfinished Parquet: a second search for it is refused, not silently replacing the first's result."""
    import os

    from rmfast.errors import UserError
    from rmfast.io import check_output, read_manifest, unfinished_result

    p = tmp_path / "s.parquet"
    p.write_bytes(b"PAR1")
    os.mkfifo(tmp_path / "s.parquet.json")
    with pytest.raises(UserError, match="is a FIFO"):
        read_manifest(p)
    os.unlink(tmp_path / "s.parquet.json")
    (tmp_path / "s.parquet.json").write_text("[" * 100_000)
    with pytest.raises(UserError, match="cannot read the manifest"):
        read_manifest(p)
    g = tmp_path / "g.json"
    g.write_text('{"best_text": "A"}')
    (tmp_path / "g.json.partial.npz").write_bytes(b"ck")
    assert not unfinished_result(g)
    with pytest.raises(UserError, match="already exists"):
        check_output(g, suffix=".json")


def test_a_damaged_result_is_one_line_not_another_score(tmp_path, capsys):
    """A flipped byte in a result Parquet's score column was read as another score without a word (Parquet pages
    carried no checksum), and one in its text column was a traceback in the explorer. rmfast writes page checksums
    now and checks them on reading, with the text's UTF-8: a damaged file is one line. Files written before, without
    checksums, still read, and their text is still checked."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cli_run import one_line_error, run
    from rmfast.errors import UserError
    from rmfast.io import write_parquet
    from rmfast.parquet_read import read_parquet

    df = pd.DataFrame({"token_id": np.arange(500), "text": [f"w{i}" for i in range(500)],
                       "score": np.linspace(-3, 3, 500).astype(np.float32)})
    p = tmp_path / "s.parquet"
    write_parquet(p, df)
    pd.testing.assert_frame_equal(read_parquet(p), pd.read_parquet(p))
    raw = bytearray(p.read_bytes())
    at = raw.find(np.float32(df["score"][250]).tobytes())  # a score's own bytes
    assert at > 0
    raw[at + 2] ^= 0x40
    p.write_bytes(bytes(raw))
    assert not np.array_equal(pd.read_parquet(p)["score"], df["score"])  # unchecked: another score, no word
    with pytest.raises(UserError, match="s.parquet is damaged .*checksum.*rerun the job that wrote it"):
        read_parquet(p)
    write_parquet(p, df)  # the footer (schema, pandas metadata) has no checksum: any error there, between intact
    raw = p.read_bytes()  # magic bytes, is damage too (the recheck: raw pyarrow/JSON/KeyError errors)
    n_footer = int.from_bytes(raw[-8:-4], "little")
    for at in range(len(raw) - 8 - n_footer, len(raw) - 8, max(1, n_footer // 40)):
        bad = bytearray(raw)
        bad[at] ^= 0x10
        p.write_bytes(bytes(bad))
        try:
            got = read_parquet(p)
        except UserError as e:
            assert "is damaged" in str(e)
        else:  # a flip pyarrow reads past (a statistic, a name's case): the data itself is intact
            pd.testing.assert_frame_equal(got[["token_id", "score"]], df[["token_id", "score"]])
    p.write_bytes(raw)
    with pytest.raises(Exception, match="No match for FieldRef"):  # a column absent: no damage, pyarrow's own
        read_parquet(p, columns=["nope"])
    # intact files pandas or pyarrow wrote otherwise are read as pandas reads them (the second recheck: a stored
    # index, whose metadata name is None, was "damaged"; so was a table pyarrow edited after from_pandas)
    q = tmp_path / "other.parquet"
    for frame in (df.sort_values("score"), df.set_index("text"), pd.concat([df, df])):
        frame.to_parquet(q)
        pd.testing.assert_frame_equal(read_parquet(q), pd.read_parquet(q))
    pq.write_table(pa.Table.from_pandas(df).append_column("extra", pa.array(range(len(df)))), q)
    pd.testing.assert_frame_equal(read_parquet(q), pd.read_parquet(q))
    old = tmp_path / "old.parquet"  # no checksums (an older rmfast's), a text byte no longer UTF-8
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), old, compression="none")
    raw = bytearray(old.read_bytes())
    raw[raw.find(b"w250") + 1] = 0xFF
    old.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="old.parquet is damaged .*Invalid UTF8"):
        read_parquet(old)
    (tmp_path / "old.parquet.json").write_text('{"model": {"name": "m"}, "prompt": "p", "head": "score"}')
    for cmd in (["explore", old, "--out", tmp_path / "e.html"], ["analyze", "distributions", old]):
        rc, _, err = run(cmd, capsys)
        assert one_line_error(rc, err) and "old.parquet is damaged" in err, err
    clean = tmp_path / "clean.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), clean)
    assert read_parquet(clean, columns=["score"])["score"].tolist() == df["score"].tolist()



def test_only_states_tied_to_the_parquet_make_it_unfinished(tmp_path):
    """(The recheck.) A finished --states result whose states folder the user deleted, beside another (killed) job's
    checkpoint and partial states, counted as unfinished: a different command then replaced the finished result
    without --overwrite. Only finished partial states tied to this very Parquet (its write id) count now."""
    import json

    import pandas as pd

    from rmfast.errors import UserError
    from rmfast.io import STATES_MANIFEST, WRITE_ID, check_output, parquet_write_id, unfinished_result, write_pair
    from rmfast.states.format import MANIFEST

    assert STATES_MANIFEST == MANIFEST
    out = tmp_path / "r.parquet"
    write_pair(out, pd.DataFrame({"token_id": [1, 2], "score": [0.5, 0.25]}), {"prompt": "p", "states": {}})
    (tmp_path / "r.parquet.partial.npz").write_bytes(b"ck")
    partial = tmp_path / "r.states.partial"
    partial.mkdir()
    assert not unfinished_result(out)  # no manifest in the partial folder: another job's, unfinished
    (partial / MANIFEST).write_text(json.dumps({"scan": {WRITE_ID: "another-write"}}))
    assert not unfinished_result(out)
    # not provably this Parquet's (a kill before the states manifest is written, or another job's): refused, naming
    # the checkpoint and how the job it belongs to finishes from it
    with pytest.raises(UserError, match=r"already exists \(beside it, r.parquet.partial.npz: an unfinished job's; "
                                         r"the same command with overwrite=True finishes it from there\)"):
        check_output(out)
    (partial / MANIFEST).write_text(json.dumps({"scan": {WRITE_ID: parquet_write_id(out)}}))
    assert unfinished_result(out) and check_output(out) == out  # this Parquet's states, killed before the rename
    (tmp_path / "r.states").mkdir()
    assert not unfinished_result(out)
