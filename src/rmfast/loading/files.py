"""Where loading keeps things and how it names content: the cache folder, the sha256 of files and
of a model folder's weights (what resume keys and sweep parts are keyed on), and a quiet transformers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from ..io import check_folder, file_sha256, write_json

#: the provenance file a converted GGUF folder carries, and the conversion format's version (bump to
#: invalidate converted folders when the format changes)
SOURCE_FILE = "rmfast_source.json"
CONVERSION_VERSION = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The rmfast cache: ``cache_dir``, else ``$RMFAST_CACHE``, else ``~/.cache/rmfast``. A path that cannot
    be a folder (it, a parent, or its ``converted``/``cpu`` folder is a file, a device...) is a UserError."""
    if cache_dir is not None and str(cache_dir) != "":
        root, where = Path(cache_dir).expanduser(), "--cache-dir"
    elif os.environ.get("RMFAST_CACHE"):
        root, where = Path(os.environ["RMFAST_CACHE"]).expanduser(), "RMFAST_CACHE"
    else:
        root, where = Path.home() / ".cache" / "rmfast", "default"
    fix = (f"set {where} to a folder (or to a path where one can be made)" if where != "default"
           else "remove what is there, or set RMFAST_CACHE (or --cache-dir) to a folder")
    check_folder(root, f"the rmfast cache ({where})", fix)
    for sub in ("converted", "cpu"):
        check_folder(root / sub, f"the rmfast cache ({where})", fix)
    return root


def cached_sha256(path: str | os.PathLike, cache: Path | None = None) -> str:
    """sha256 of a file, memoized in ``<cache>/sha256-index.json`` by its path, size, mtime, ctime and inode.

    A model file of many GB is read once, not at every load. Why the memo can be trusted: rewriting a file
    (in place or by a rename over it) gives it a new ctime, which the kernel sets at every change and no
    tool sets back (``touch -d`` and ``cp -p`` restore mtime only), so a changed file is hashed again, even
    one rewritten with the same size a moment later. What it cannot see is a rewrite of the same size
    within the filesystem's timestamp granularity (milliseconds) of the hashing itself.
    """
    path = Path(path).resolve()
    st = path.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino}
    index_path = (cache or cache_root()) / "sha256-index.json"
    index: dict = {}
    with contextlib.suppress(OSError, ValueError):
        index = json.loads(index_path.read_text())
    entry = index.get(str(path))
    if isinstance(entry, dict) and all(entry.get(k) == v for k, v in stamp.items()) and entry.get("sha256"):
        return entry["sha256"]
    sha = file_sha256(path)
    index = {k: v for k, v in index.items() if os.path.exists(k)}  # files since deleted (temporary folders)
    index[str(path)] = {**stamp, "sha256": sha}
    with contextlib.suppress(OSError):
        write_json(index_path, index)
    return sha


#: the files of a model folder whose bytes decide its scores: its config and its weights (safetensors,
#: and the pickles --allow-pickle reads). Tokenizer files decide ids, which a job's key holds already;
#: a Trainer checkpoint's optimizer.pt and training_args.bin decide nothing and may be large.
CONTENT_FILES = ("config.json", "adapter_config.json", "*.safetensors", "pytorch_model*.bin", "adapter_model.bin")


def content_sha256(folder: Path, revision: str | None = None, cache: Path | None = None) -> str | None:
    """What identifies a folder model's content, for its provenance and for a resumed job's key
    (:func:`rmfast.scoring.plan.run_key`: a folder whose weights changed must not resume the old job).

    None for a hub snapshot at a commit (its ``revision`` names the content); else one sha256 over
    the name and :func:`cached_sha256` of each of the folder's :data:`CONTENT_FILES`. A hash of every
    byte, not of names, sizes and times: a model saved again with the same shapes has the same sizes,
    and can have the same mtime too; the memo makes it cost one read of each file version.
    """
    if revision:
        return None
    h = hashlib.sha256()
    for f in sorted({f for pat in CONTENT_FILES for f in Path(folder).glob(pat) if f.is_file()}):
        h.update(f"{f.name}\0{cached_sha256(f, cache)}\n".encode())
    return h.hexdigest()


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' load-time progress bars and 'newly initialized weights' notes."""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()
