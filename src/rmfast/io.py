"""Atomic file writes and output-path checks. Nothing half-written is ever left under the final name."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import math
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from .errors import UserError


#: what an output of each suffix :func:`check_output` may insist on holds, in words
_SUFFIX_KINDS = {".parquet": "Parquet (its manifest beside it)", ".json": "JSON (its plot beside it, as .png)",
                 ".html": "an HTML page"}


def check_output(path: str | os.PathLike, overwrite: bool = False, *, folder: bool = False,
                 suffix: str | tuple[str, ...] | None = None) -> Path:
    """``path`` if a command may write its output there, else a one-line UserError naming the fix.

    The one rule for every command's outputs (and the library's writers), checked before any work,
    creating nothing:

    - a file output replaces only a regular file, and only with ``overwrite``: a folder, a device
      (``/dev/null``), a FIFO, a socket or a symbolic link there is refused even with ``overwrite``,
      since a file renamed over it would destroy it (see :func:`not_a_regular_file`);
    - a folder output (``folder``: bench, ``analyze trajectory``, a sweep's store, ``reproduce``) may
      be an existing folder, which the command writes its own files into (``reproduce`` replaces it
      whole, and only with --overwrite); anything else there is refused;
    - ``suffix``: the output's name ends in it, or in one of them (".parquet": its readers go by the suffix;
      ".json": GCG's, whose plot goes beside it under the same name as .png; ".html", ".htm": a page);
    - the nearest existing ancestor must be a folder this process may write (a path under a regular
      file, or in a read-only folder, is refused), and one that takes a file: a nameless temporary file is
      opened and closed there (as root, /proc's access bits say yes to a file it cannot hold).
    """
    p = Path(path)
    if not folder and str(path).endswith(("/", os.sep)):  # Path() drops the slash: "dir/" would become a file "dir"
        raise UserError(f"--out {path} ends with '/', a folder; this command writes a file: give a file path "
                        f"(e.g. {p / 'out'}{'.parquet' if not p.suffix else ''})")
    if folder:
        if p.exists() and not p.is_dir():
            raise UserError(f"--out {p} is {describe_path(p)}, not a folder; give a folder")
    else:
        other = not_a_regular_file(p)
        if other:
            raise UserError(f"--out {p} is {other}, not a regular file; rmfast replaces only regular files (and only "
                            "with --overwrite), so choose a file path that is free or holds a regular file")
        for beside in (manifest_path(p), Path(f"{p}.partial.npz")):  # its manifest, its checkpoint: found now,
            if other := not_a_regular_file(beside):  # not once the scoring is done
                raise UserError(f"{beside} is {other}, not a regular file: rmfast writes {p}'s "
                                f"{'manifest' if beside.suffix == '.json' else 'checkpoint'} there; choose another --out")
        if p.exists() and not overwrite and not unfinished_result(p):
            ck = next(iter(sorted(p.parent.glob(glob.escape(p.name) + ".partial*.npz"))), None) if p.is_file() else None
            beside = (f" (beside it, {ck.name}: an unfinished job's; the same command with --overwrite finishes it from "
                      "there)" if ck is not None else "")
            raise UserError(f"output {p} already exists{beside}; pass --overwrite to replace it or choose another --out")
        ok = (suffix,) if isinstance(suffix, str) else suffix
        if ok is not None and p.suffix.lower() not in ok:
            # (a .csv name on Parquet bytes: pandas.read_csv reads garbage from it; a GCG --out x.png: the plot
            # replaced the search's JSON; an HTML page under .parquet)
            raise UserError(f"--out {path}: this command writes {_SUFFIX_KINDS[ok[0]]}; give a path ending in {ok[0]}")
    near = p if folder else p.parent
    while not near.exists() and near != near.parent:
        near = near.parent
    if not near.is_dir():
        raise UserError(f"cannot write {p}: {near} is a file, not a folder; choose another --out")
    if not folder:
        _check_name_fits(p, near)
    if not os.access(near, os.W_OK | os.X_OK):
        raise UserError(f"cannot write {p}: {near} is not writable (permission denied); choose another --out")
    try:  # the access bits can say yes where no file can be made (/proc or /sys as root): ask the folder itself
        with tempfile.TemporaryFile(dir=near):
            pass
    except OSError as e:
        raise UserError(f"cannot write {p}: {near} takes no new file ({e.strerror}); choose another --out") from None
    return p


#: what the longest name rmfast writes beside an output adds to its name: ".NAME.partial.npz.0a1b2c3d.tmp"
#: (the checkpoint's atomic write)
NAME_EXTRA = len("..partial.npz.0a1b2c3d.tmp")


def _check_name_fits(p: Path, near: Path) -> None:
    """The output's name, and the checkpoint and temporary names beside it, within the file system's limit: a name
    over it failed with a traceback, or after the scoring, at the first checkpoint."""
    try:
        limit = os.pathconf(near, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not on this OS: the usual limit
        limit = 255
    n = len(os.fsencode(p.name))
    if n + NAME_EXTRA > limit:
        raise UserError(f"--out {p.name[:40]}…: a name of {n} bytes, and rmfast writes names {NAME_EXTRA} bytes longer "
                        f"beside it (its checkpoint), over this file system's {limit}; choose a shorter name")


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


#: a states folder's manifest (:data:`rmfast.states.format.MANIFEST`; io is below states)
STATES_MANIFEST = "manifest.json"


def unfinished_result(path: str | os.PathLike) -> bool:
    """A result Parquet that a killed job left beside its checkpoint without its manifest (killed between
    :func:`write_pair`'s renames), or whose states wait, finished, in their ``.partial`` folder, tied to this very
    Parquet by its write id (killed before that folder's rename): the same command finishes it (no --overwrite), as
    it would had the kill come earlier. A finished result beside another job's leftovers is not unfinished."""
    p = Path(path)  # (a Parquet only: a GCG JSON has no manifest, and its own search's checkpoint is beside it)
    if not (p.suffix == ".parquet" and p.is_file() and any(p.parent.glob(glob.escape(p.name) + ".partial*.npz"))):
        return False
    if not os.path.lexists(manifest_path(p)):
        return True
    states = states_dir(p)
    try:
        tie = json.loads((partial_states(states) / STATES_MANIFEST).read_text())["scan"]
        wid = parquet_write_id(p)
        return wid is not None and tie[WRITE_ID] == wid and not os.path.lexists(states)
    except Exception:  # noqa: BLE001 - no finished partial states, or none tied to this Parquet: check_output refuses
        return False


def describe_path(path: str | os.PathLike) -> str:
    """What is at ``path``, in words ("a regular file", "a folder", "a character device", ...), the path
    itself (a symbolic link is named as one); "nothing" where nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "nothing"
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise UserError(f"{str(path)[:60]}…: the name is too long for the file system; choose a shorter path") from None
        raise
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def not_a_regular_file(path: str | os.PathLike) -> str | None:
    """What is at ``path`` when it is there and not a regular file (a folder, a device, a FIFO, a socket,
    a symbolic link), in words; None when nothing or a regular file is: the only things rmfast replaces.

    >>> not_a_regular_file("/dev/null"), not_a_regular_file("/no/such/file")
    ('a character device', None)
    """
    what = describe_path(path)
    return None if what in ("nothing", "a regular file") else what


def check_folder(path: str | os.PathLike, what: str, fix: str) -> Path:
    """Refuse a folder path that cannot be one: it, or the nearest of its parents that exists, is not a
    folder (a regular file, a device, a FIFO...). Symbolic links to folders are folders. ``what`` names the
    path in the message ("the rmfast cache"), ``fix`` says what to do.

    >>> check_folder("/dev/null/x", "the cache", "pass a folder")
    Traceback (most recent call last):
    rmfast.errors.UserError: the cache /dev/null/x: /dev/null is a character device, not a folder; pass a folder
    """
    path = Path(path)
    for p in (path, *path.parents):
        try:
            mode = os.stat(p).st_mode
        except FileNotFoundError:
            continue
        except NotADirectoryError:  # a parent is a file: found further up
            continue
        except OSError as exc:
            raise UserError(f"{what} {path}: {p} cannot be read ({exc.strerror}); {fix}") from None
        if stat.S_ISDIR(mode):
            return path
        kind = "a regular file" if stat.S_ISREG(mode) else next((w for t, w in _KINDS if t(mode)), "not a folder")
        raise UserError(f"{what} {path}: {p} is {kind}, not a folder; {fix}")
    return path


def _check_replaceable(path: Path) -> None:
    """The writers' last guard (the commands check earlier, :func:`check_output`): never rename a file
    over anything but a regular file."""
    other = not_a_regular_file(path)
    if other:
        raise UserError(f"{path} is {other}, not a regular file; rmfast replaces only regular files — choose another path")


def _temp_beside(path: Path) -> Path:
    """Create an empty, new temporary file in ``path``'s folder, mode 0666 & ~umask (as ``open`` would).

    ``tempfile.mkstemp`` would make it 0600, and the rename would carry that onto the result.
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name beside {path}")


#: what a rerun of an interrupted command would do, said by the jobs that know (the CLI prints it on Ctrl-C):
#: "job" (a sweep: its finished parts are kept) outranks "checkpoint" (the scoring loop's latest save)
_ON_INTERRUPT: dict[str, str | None] = {"job": None, "checkpoint": None}


def say_on_interrupt(text: str | None, *, level: str = "checkpoint") -> None:
    """Set (or, with None, clear) what a rerun of this process's command does if it is interrupted now.

    >>> say_on_interrupt("rerun to resume"); on_interrupt()
    'rerun to resume'
    >>> say_on_interrupt(None); on_interrupt() is None
    True
    """
    _ON_INTERRUPT[level] = text


def then_always(step, after) -> None:
    """``step()``, then ``after()`` whatever ``step`` did (a scan's writer thread drained after its checkpoint's save,
    saved or not); ``step``'s error is the one raised, even where ``after`` fails too.

    >>> def fails():
    ...     raise OSError("disk full")
    >>> then_always(fails, lambda: print("drained"))
    Traceback (most recent call last):
    ...
    OSError: disk full
    """
    try:
        step()
    except BaseException:
        with contextlib.suppress(Exception):
            after()
        raise
    after()


def forget_on_interrupt() -> None:
    """Clear what earlier jobs of this process said (a command starts with nothing to resume)."""
    _ON_INTERRUPT.update(job=None, checkpoint=None)


def on_interrupt() -> str | None:
    """What a rerun of the interrupted command does, or None where nothing was said (nothing to resume)."""
    return _ON_INTERRUPT["job"] or _ON_INTERRUPT["checkpoint"]


def fsync_file(path: str | os.PathLike) -> None:
    """Flush ``path``'s bytes to the disk. Without it a power loss after a rename can leave the new name empty or
    short (the rename reached the disk, the data not yet). A file system that cannot (EINVAL) is left as it is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def _fsync_dir(folder: Path) -> None:
    """The folder's entries (a rename) to the disk, where the OS allows a folder to be opened (not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write, *, durable: bool = True) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file in the same folder, which
    is then renamed over ``path``. Nothing half-written is ever left under the final name, and the
    temporary file is removed if ``write`` fails (or Ctrl-C). The folder is created if missing.
    ``durable``: the bytes are flushed to the disk before the rename and the rename after it, so a power
    loss too leaves the old file or the new one (False: the caller flushes them, :func:`fsync_file`, before
    whatever names the file as finished: a states folder's shards, before its manifest).

    The file is created as any program would create it: mode 0666 & ~umask (0644 under the
    usual umask 022), not the 0600 of ``tempfile.mkstemp``.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> atomic_write(d / "out" / "a.txt", lambda tmp: Path(tmp).write_text("hello")).read_text()
        'hello'
        >>> def broken(tmp):
        ...     raise ValueError("disk full")
        >>> atomic_write(d / "out" / "a.txt", broken)
        Traceback (most recent call last):
        ...
        ValueError: disk full
        >>> sorted(p.name for p in (d / "out").iterdir())  # the old file, no temporary left
        ['a.txt']
        >>> import shutil; shutil.rmtree(d)
    """
    path = Path(path)
    _check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        write(str(tmp))
        if durable:
            fsync_file(tmp)
        _check_replaceable(path)
        os.replace(tmp, path)
        if durable:
            _fsync_dir(path.parent)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename is None:  # a write's error names no file: the one being written
            e.filename = str(path)
        raise
    return path


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks (the one definition: candidate files, GGUFs, weights)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def json_safe(obj):
    """``obj`` with every NaN or infinite float as None (JSON's null): Python's json writes them as bare ``NaN`` /
    ``Infinity``, which is not JSON (a browser's or Node's JSON.parse refuses the whole manifest).

    >>> json_safe({"a": float("nan"), "b": [1.5, float("inf")], "c": (2, "x")})
    {'a': None, 'b': [1.5, None], 'c': [2, 'x']}
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, obj) -> None:
    """Write JSON atomically (temp file in the same folder + rename); NaN and infinities as null (:func:`json_safe`)."""

    def w(tmp):
        with open(tmp, "w") as f:
            json.dump(json_safe(obj), f, indent=2, default=str)
            f.write("\n")

    atomic_write(Path(path), w)


#: the Parquet schema-metadata key (and the manifest field) that ties a result's two files together
WRITE_ID = "write_id"


#: the schema-metadata key of a result's essential provenance (:func:`provenance`)
PROVENANCE = "rmfast.provenance"
#: what a result's Parquet says about itself without its manifest: the model's fields, then the job's
_MODEL_FIELDS = ("name", "spec", "type", "sha256", "revision", "content_sha256", "random_head_seed")
_JOB_FIELDS = ("prompt", "head", "head_index", "score_meaning", "dtype", "rmfast_version")


def candidate_set(manifest: dict) -> str:
    """The candidate set a scan file holds, named from its manifest: a sweep part's set name; for ``rmfast
    scan --candidates FILE`` the file's stem; ``vocabulary`` for a token scan (any ids or view of it:
    one id is one candidate everywhere).

    >>> candidate_set({"candidates": "items"}), candidate_set({"candidate_kind": "text",
    ...     "candidates": {"path": "/x/elo_items.csv"}}), candidate_set({"vocab_size": 49152})
    ('items', 'elo_items', 'vocabulary')
    """
    c = manifest.get("candidates")
    if isinstance(c, str) and c:
        return c
    if manifest.get("candidate_kind") == "text":
        path = c.get("path") if isinstance(c, dict) else None
        return Path(str(path)).stem if path else "texts"
    return "vocabulary"


def provenance(manifest: dict) -> dict:
    """The essential provenance of a result, from its manifest: model (name, spec, content hashes, random
    head seed), prompt, head, what ``score`` is, dtype, rmfast version (and a sweep part's candidate set).
    :func:`write_pair` puts it in the Parquet's schema metadata too, so the Parquet alone says what it holds
    (:func:`read_provenance`).

    >>> provenance({"model": {"name": "m", "path": "/x"}, "prompt": "Best?", "dtype": "float32", "n": 3})
    {'model': {'name': 'm'}, 'prompt': 'Best?', 'dtype': 'float32'}
    """
    model = manifest.get("model")
    out: dict = {"model": {k: model[k] for k in _MODEL_FIELDS if model.get(k) is not None}
                 if isinstance(model, dict) else model} if model is not None else {}
    out.update({k: manifest[k] for k in _JOB_FIELDS if manifest.get(k) is not None})
    if "candidates" in manifest or "n_candidates" in manifest:  # a scan or a sweep part: its candidate set
        out["candidates"] = candidate_set(manifest)
    return out


def read_provenance(path: str | os.PathLike) -> dict:
    """The provenance a result's Parquet carries in its schema metadata ({} for files written without)."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(PROVENANCE.encode())
    return json.loads(raw) if raw else {}


def _parquet_file(path, df, write_id: str | None = None, meta: dict | None = None) -> None:
    """``df`` as a Parquet file (no index), with ``write_id`` (and ``meta``, :func:`provenance`) in its schema
    metadata when given."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    extra = {}
    if write_id is not None:
        extra[b"rmfast." + WRITE_ID.encode()] = write_id.encode()
    if meta:
        extra[PROVENANCE.encode()] = json.dumps(meta, default=str).encode()
    if extra:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **extra})
    pq.write_table(table, path, write_page_checksum=True)  # a page damaged later is found by read_parquet


def write_parquet(path: str | os.PathLike, df, meta: dict | None = None) -> None:
    """Write a DataFrame to Parquet atomically, with ``meta`` (:func:`provenance`: what its scores mean) in its
    schema metadata when given, for :func:`read_provenance`."""
    atomic_write(Path(path), lambda tmp: _parquet_file(tmp, df, meta=meta))


def write_csv(path: str | os.PathLike, df) -> None:
    """Write a DataFrame to CSV atomically. Every text field is quoted where any holds a carriage return: pandas
    quotes a field with a newline but not one with a lone ``\r`` (SmolLM2's token 201 is one), which readers take as a
    line break, so its row came back as two (an ``analyze extremes`` CSV of 10 rows read back as 12)."""
    import csv

    text = df.select_dtypes(include=["object", "string", "category"])
    cr = any(text[c].astype(str).str.contains("\r", regex=False).any() for c in text.columns)
    quoting = csv.QUOTE_NONNUMERIC if cr else csv.QUOTE_MINIMAL
    atomic_write(Path(path), lambda tmp: df.to_csv(tmp, index=False, quoting=quoting))


def manifest_path(parquet_path: str | os.PathLike) -> Path:
    """The JSON manifest beside a results Parquet: ``<file>.json``."""
    return Path(str(parquet_path) + ".json")


def states_dir(path: str | os.PathLike) -> Path:
    """The hidden-states folder beside a scan Parquet, ``<stem>.states`` (:mod:`rmfast.states`), or ``path``
    itself where it is not a Parquet.

    >>> states_dir("runs/a.parquet").as_posix(), states_dir("runs/a.states").as_posix()
    ('runs/a.states', 'runs/a.states')
    """
    p = Path(path)
    if p.suffix == ".parquet":
        return p.with_suffix(".states")
    return p


def partial_states(folder: str | os.PathLike) -> Path:
    """Where a states folder is written until it is complete: ``<folder>.partial``.

    >>> partial_states("runs/a.states").as_posix()
    'runs/a.states.partial'
    """
    folder = Path(folder)
    return folder.with_name(folder.name + ".partial")


def write_result(path: str | os.PathLike, df, manifest: dict, overwrite: bool = False) -> Path:
    """A results table: ``path`` (Parquet) and ``path.json`` (manifest), replaced as a pair
    (:func:`write_pair`); refuses an existing output unless overwrite."""
    p = check_output(path, overwrite)
    write_pair(p, df, manifest)
    return p


def write_pair(path: str | os.PathLike, df, manifest: dict) -> dict:
    """Write ``path`` (Parquet) and its manifest ``path.json`` so that no reader takes one for the
    other's partner. Returns the manifest as written (with its ``write_id``).

    Both files are written in full to temporary names first (a full disk fails here, and nothing
    is replaced). Then the old manifest is removed, the Parquet renamed into place, the manifest
    last. Both carry the same random ``write_id`` (the manifest as a field, the Parquet in its
    schema metadata), and the reader rule (:func:`read_manifest`) is: a Parquet and a manifest
    belong together only when their write ids match; a Parquet without its manifest is unfinished.
    A kill between the renames thus leaves a Parquet without a manifest (unfinished), never a pair
    that lies.

    Example:
        >>> import tempfile, pandas as pd
        >>> p = Path(tempfile.mkdtemp()) / "r.parquet"
        >>> m = write_pair(p, pd.DataFrame({"score": [1.0]}), {"prompt": "Best?"})
        >>> read_manifest(p) == m, len(m[WRITE_ID])
        (True, 16)
    """
    p, mp = Path(path), manifest_path(path)
    _check_replaceable(p)
    _check_replaceable(mp)
    p.parent.mkdir(parents=True, exist_ok=True)
    man = {**manifest, WRITE_ID: secrets.token_hex(8)}
    tp = _temp_beside(p)
    tj = None
    try:
        _parquet_file(str(tp), df, man[WRITE_ID], provenance(man))
        tj = _temp_beside(mp)
        with open(tj, "w") as f:
            json.dump(json_safe(man), f, indent=2, default=str)
            f.write("\n")
        fsync_file(tp)  # both on the disk before either is renamed: a power loss leaves no empty pair
        fsync_file(tj)
        mp.unlink(missing_ok=True)  # from here until the last rename, the Parquet has no manifest: unfinished
        os.replace(tp, p)
        os.replace(tj, mp)
        _fsync_dir(p.parent)
    except BaseException:
        for t in (tp, tj):
            if t is not None:
                try:
                    os.unlink(t)
                except OSError:
                    pass
        raise
    return man


def parquet_write_id(path: str | os.PathLike) -> str | None:
    """The write id in a Parquet file's schema metadata (None for files written without one)."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    v = meta.get(b"rmfast." + WRITE_ID.encode())
    return v.decode() if v is not None else None


def _not_a_result(p: Path) -> str | None:
    """What a file given where a result Parquet belongs is instead, in words with the fix (None: unknown): the
    manifest beside a result, another job's JSON (GCG's), a job's checkpoint, a text table.

    >>> _not_a_result(Path("scan.parquet.partial.npz"))
    'the checkpoint of a job in progress: rerun the job that writes it to finish it, then give its .parquet'
    """
    name = p.name.lower()
    if name.endswith(".partial.npz"):
        return "the checkpoint of a job in progress: rerun the job that writes it to finish it, then give its .parquet"
    if name.endswith(".json"):
        if Path(str(p)[:-5]).is_file():
            return f"the manifest of {Path(str(p)[:-5]).name}; give {Path(str(p)[:-5])} itself"
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            d = None
        if isinstance(d, dict) and "best_ids" in d:
            return "a GCG search's result (JSON), not a table of scores; give the Parquet a scan wrote"
        return "a JSON file, not a result table; give the Parquet an rmfast job wrote (its manifest .json beside it)"
    if p.suffix.lower() in (".csv", ".tsv", ".txt"):
        return (f"a text table ({p.suffix}), not a result; give the Parquet an rmfast job wrote (its manifest .json "
                "beside it), or score a table of texts with rmfast score")
    return None


def read_manifest(path: str | os.PathLike, *, required: bool = True) -> dict | None:
    """The manifest of the result Parquet ``path``, checked to be its partner (:func:`write_pair`).

    A missing manifest is a UserError (None when not ``required``); one whose write id is not the
    Parquet's (the pair is being replaced, or a writer died between its renames) is a UserError.
    Files written before write ids existed (neither carries one) are accepted.
    """
    mp = manifest_path(path)
    if (other := not_a_regular_file(mp)) and other != "a symbolic link":  # a FIFO there would hang the read
        raise UserError(f"the manifest {mp} is {other}, not a file; rerun the job that writes it")
    try:
        man = json.loads(mp.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if not required:
            return None
        if (what := _not_a_result(Path(path))) is not None:
            raise UserError(f"{path} is {what}") from None
        raise UserError(f"{path} has no manifest {mp.name} beside it: not an rmfast result, or one unfinished or being "
                        "replaced; give a file an rmfast job wrote (with its .json), or rerun the job that writes it") from None
    except (OSError, ValueError, RecursionError) as e:  # (RecursionError: JSON nested past Python's limit)
        raise UserError(f"cannot read the manifest {mp}: {e}; rerun the job that writes it") from None
    try:
        pid = parquet_write_id(path)
    except Exception as e:  # pyarrow raises many types for a file that is not Parquet
        raise UserError(f"cannot read {path} as Parquet ({type(e).__name__}); rerun the job that writes it") from None
    if isinstance(man, dict) and man.get(WRITE_ID) != pid:
        raise UserError(f"{path} and its manifest {mp.name} are from different writes (it is being replaced, or a "
                        "writer was killed between the two); rerun the job that writes it")
    return man


def slug(s: str, n: int = 40, *, exact: bool = False) -> str:
    """A file-name-safe form of ``s``.

    Default (output file names): lower-case runs of letters and digits joined by '-', at most n
    characters, cut after a whole word so a reader sees words, not "…-thing-e" (a first word over n
    is itself cut at n).
    ``exact=True`` (results-store folders): keeps case, '.', '_' and '-'; a name over n characters
    ends in a hash of the whole name, so distinct names stay distinct.

    >>> slug("What, in one word, is the greatest thing ever?")
    'what-in-one-word-is-the-greatest-thing'
    >>> slug("SmolLM2 135M/Instruct", exact=True)
    'SmolLM2-135M-Instruct'
    >>> slug("日本語は？"), slug("Что лучше всего?") != slug("日本語は？")  # letters it drops: a hash names them
    ('x-581c8d6b', True)
    """
    if not exact:
        out = _cut_at_word(re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower(), n) or "x"
        if any(ord(c) > 127 and c.isalnum() for c in s):  # (every such prompt was "x": one file for all of them)
            out = _cut_at_word(out, n - 9) + "-" + hashlib.sha256(s.encode()).hexdigest()[:8]
        return out
    out = re.sub(r"[^A-Za-z0-9._-]+", "-", str(s)).strip("-.")
    if len(out) > n:
        out = out[:n - 9].rstrip("-.") + "-" + hashlib.sha256(str(s).encode()).hexdigest()[:8]
    return out or "x"


def _cut_at_word(s: str, n: int) -> str:
    """``s`` (words joined by '-') cut to its longest run of whole words within n characters; where the
    first word alone is longer than n, its first n characters."""
    if len(s) <= n:
        return s
    end = s.rfind("-", 0, n + 1)  # a '-' at index n means s[:n] already ends on a whole word
    return s[:end] if end > 0 else s[:n]
