"""Locks on the files a job writes: ``<out>.lock`` held while a job writes its output (:func:`output_lock`), and the
check that a lock's path is a lock file (:func:`check_lock`; the sweep store's locks take it too)."""

from __future__ import annotations

import contextlib
import glob
import os
import re
from pathlib import Path

from .errors import UserError
from .io import not_a_regular_file


def check_lock(lock: str | os.PathLike, fix: str) -> Path:
    """A lock file's path: nothing there, or a regular file (a lock left by an earlier job). A folder, a
    FIFO, a device or a symbolic link there is refused: a lock is never taken on (or removed from) it."""
    lock = Path(lock)
    what = not_a_regular_file(lock)
    if what is not None:
        raise UserError(f"{lock} is {what}, not a lock file: rmfast locks there while it writes; {fix}")
    return lock


@contextlib.contextmanager
def output_lock(path: str | os.PathLike):
    """Hold ``<path>.lock`` while a job writes ``path``: a second job for the same output stops at
    once with one line instead of doing all the work and then clashing. The lock dies with its
    process (an OS file lock), so a killed job never leaves a stale one.

    The finished job removes the lock file while it still holds it, and a job that locked a file no longer at the
    path (removed between its open and its lock) takes the path's new one: otherwise two jobs could each hold a
    lock, one on the removed file, one on a new file at the same name, and write the same output."""
    from filelock import FileLock, Timeout

    name = str(path) + ".lock"
    check_lock(name, "remove it or choose another --out")
    lock = FileLock(name)
    made = [q for q in (Path(path).parent, *Path(path).parent.parents) if not q.exists()]  # deepest first
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)  # the lock file is the first thing written there
        for _ in range(3):
            # made here first: filelock reads a lock file it cannot create (/proc, a read-only folder) as one held
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o666))
            lock.acquire(timeout=0)
            if _holds_the_file_at(lock, name):
                break
            lock.release()  # a lock on a removed file guards nothing: the path's own, again
        for mine in (str(path), f"{path}.json", f"{path}.partial.npz"):  # killed writes' temporaries: ours
            drop_temps(mine)
    except Timeout:
        raise UserError(f"another rmfast job is writing {path} (it holds {path}.lock); wait for it to finish "
                        "or choose another --out") from None
    except OSError as e:  # a folder that cannot be made (/proc/nope), a read-only or full filesystem
        raise UserError(f"cannot write {path}: {e.strerror or e} ({e.filename or Path(path).parent}); "
                        "choose another --out") from None
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # never over the job's own error (or a finished job's success)
            Path(name).unlink(missing_ok=True)  # while held: a job that locks the old file now sees it gone
        lock.release()
        for q in made:  # a job refused (or failed) before writing leaves no empty folders it made
            try:
                q.rmdir()
            except OSError:  # not empty (the output, or anything else now there): kept
                break


def drop_temps(path: str | os.PathLike) -> int:
    """Remove the temporary files killed writes of ``path`` left beside it (:func:`rmfast.io.atomic_write`'s temporary names,
    ``.NAME.<8 hex>.tmp``); the caller must be the only writer of ``path`` (it holds its lock). Returns how many."""
    path = Path(path)
    ours = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp")
    n = 0
    try:
        for f in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            if ours.fullmatch(f.name):
                f.unlink(missing_ok=True)
                n += 1
    except OSError:  # an unreadable folder: the write that follows says so
        pass
    return n


def _holds_the_file_at(lock, name: str) -> bool:
    """Whether the file ``lock`` (a filelock FileLock, held) locked is the one at ``name`` now; True where this
    filelock does not say which file it holds (its descriptor: ``_context.lock_file_fd``, or older ``_lock_file_fd``)."""
    fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
    fd = getattr(lock, "_lock_file_fd", None) if fd is None else fd
    if fd is None:
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(name))
    except OSError:  # removed: not the path's file
        return False
