"""What names a sweep model's files' content now, and whether a finished part was scored from it.

A part is scored from one model's files; a folder re-saved with other weights, a tokenizer or chat template edited,
a GGUF file replaced or a hub cache moved to another commit makes its finished parts *stale*: the runner scores
them again (:func:`rmfast.sweep.runner.run_sweep`), and until then every reader of the store (a dry run, ``rmfast
results``, an export, :func:`rmfast.sweep.load_results`) counts them as not done (:meth:`rmfast.sweep.store.Store.stale`):
a re-score refused (the new tokenizer fails the template check) left the old files' rows exported as done, exit 0.
"""

from __future__ import annotations

import contextlib
import os

from ..errors import UserError


def model_content(spec: str, cache_dir: str | os.PathLike | None = None, base: str | None = None) -> dict | None:
    """What names the content of the model ``spec`` now, as its part manifests record it (the loader's
    provenance): a folder's (or an adapter checkpoint's) ``content_sha256`` and ``tokenizer_sha256`` (its ids and
    chat template), a GGUF file's ``sha256``, a cached hub id's ``revision`` (the cache's ``main`` moves with a new
    download; looked up locally). None where only loading tells (an embedded alias: its package fixes the content).
    An adapter's ``base`` too (``base``: the one given, else the one it names): its scores are the merged model's,
    and a part scored on another base had been kept as fresh (a --base corrected left every score the old base's)."""
    from ..loading import loader, sources
    from ..loading.training_checkpoints import read_adapter

    w = sources.where(spec)
    cache = loader.cache_root(cache_dir)
    if w.kind == "adapter" or w.kind == "folder" and (w.path / "config.json").is_file():
        out = {"content_sha256": loader.content_sha256(w.path.resolve(), cache=cache),
               "tokenizer_sha256": sources.files_sha256(w.path.resolve(), sources.TOKENIZER_FILES, cache)}
        if w.kind == "adapter":
            with contextlib.suppress(UserError):  # an unreadable adapter config: loading says so, with its line
                under = base or read_adapter(w.path).base
                b = model_content(under, cache_dir) if under else None
                if b:
                    out["base"] = b
        return out
    if w.kind in ("gguf", "file"):  # a .gguf given, or a folder's only .gguf
        return {"sha256": loader.cached_sha256(w.gguf or w.path, cache)}
    if w.kind == "hub":
        with contextlib.suppress(UserError):
            _, rev = sources.hub_folder(w.spec)
            return {"revision": rev} if rev else None
    return None


def same_content(manifest: dict | None, content: dict | None) -> bool:
    """Whether a finished part (its ``manifest``) was scored from the files the model has now (``content``); True
    where that is unknown: a part written before rmfast recorded a name, e.g. ``tokenizer_sha256``, is judged by
    the names it has."""
    if not content:
        return True
    return _recorded_as(((manifest or {}).get("model") or {}), content)


def _recorded_as(recorded: dict, now: dict) -> bool:
    """Every name of ``now`` that ``recorded`` has is equal there (nested: an adapter's base's names in its ``base``)."""
    for k, v in now.items():
        if k not in recorded:
            continue
        if isinstance(v, dict):
            if not isinstance(recorded[k], dict) or not _recorded_as(recorded[k], v):
                return False
        elif recorded[k] != v:
            return False
    return True
