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


def model_content(spec: str, cache_dir: str | os.PathLike | None = None) -> dict | None:
    """What names the content of the model ``spec`` now, as its part manifests record it (the loader's
    provenance): a folder's (or an adapter checkpoint's) ``content_sha256`` and ``tokenizer_sha256`` (its ids and
    chat template), a GGUF file's ``sha256``, a cached hub id's ``revision`` (the cache's ``main`` moves with a new
    download; looked up locally). None where only loading tells (an embedded alias: its package fixes the content)."""
    from ..loading import loader, sources

    w = sources.where(spec)
    cache = loader.cache_root(cache_dir)
    if w.kind == "adapter" or w.kind == "folder" and (w.path / "config.json").is_file():
        return {"content_sha256": loader.content_sha256(w.path.resolve(), cache=cache),
                "tokenizer_sha256": sources.files_sha256(w.path.resolve(), sources.TOKENIZER_FILES, cache)}
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
    model = (manifest or {}).get("model") or {}
    return all(model.get(k) == v for k, v in content.items() if k in model)
