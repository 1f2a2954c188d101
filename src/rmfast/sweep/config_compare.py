"""Two sweep configs compared: what differs between them in words (:func:`diff_keys`), a config with its files' places
left out (:func:`unplaced`: a store moved with its inputs keeps its parts), one part's share of a config
(:func:`share`). :class:`rmfast.sweep.store.Store` decides with them whether a store holds this config's results.
"""

from __future__ import annotations

import json
import os


def diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    """What differs between two configs, in words: a key's old and new value, and in lists of named entries (models,
    candidate sets) the names added, gone or changed ("models differs" had been all a run that gained a checkpoint
    was told).

    >>> diff_keys({"models": [{"name": "r/checkpoint-1", "dtype": "float32"}]},
    ...            {"models": [{"name": "r/checkpoint-1", "dtype": "bfloat16"}, {"name": "r/checkpoint-2"}]})
    ["models[r/checkpoint-1].dtype 'float32' -> 'bfloat16'", 'models: r/checkpoint-2 added']
    """
    out = []
    for k in sorted(set(a) | set(b), key=str):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += diff_keys(va, vb, f"{prefix}{k}.")
        elif _named(va) and _named(vb):
            na, nb = {x["name"]: x for x in va}, {x["name"]: x for x in vb}
            for n in na.keys() & nb.keys():
                out += diff_keys(na[n], nb[n], f"{prefix}{k}[{n}].")
            for what, names in (("added", [n for n in nb if n not in na]), ("gone", [n for n in na if n not in nb])):
                if names:
                    out.append(f"{prefix}{k}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''} {what}")
        elif k not in a or k not in b:
            out.append(f"{prefix}{k} {'added' if k not in a else 'gone'}")
        elif va != vb:
            short = all(isinstance(v, (str, int, float, bool, type(None))) and len(repr(v)) < 40 for v in (va, vb))
            out.append(f"{prefix}{k} {va!r} -> {vb!r}" if short else f"{prefix}{k}")
    return out


def _named(v) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) and "name" in x for x in v)


#: what stands for a local file's place in :func:`unplaced`
LOCAL = "<a local file>"


def unplaced(config: dict) -> dict:
    """A normalised sweep config (or one part's share of it: ``model``, ``prompt``, ``candidates``, ...) with the
    places of its files left out (a local model's or adapter base's path, a candidate file's path, a token-ids
    file's path) and its models and candidate sets in one order. What stays names contents (a candidate or ids
    file's ``sha256``; a model's files are judged by their content where its parts are read, :meth:`Store.stale`),
    so a store whose inputs moved with it (another checkout, another machine) keeps its parts.

    >>> a = {"models": [{"name": "rm", "model": "/old/rm"}], "candidates": [{"name": "w", "kind": "file",
    ...      "file": {"path": "/old/w.txt", "sha256": "ab"}}]}
    >>> b = json.loads(json.dumps(a).replace("/old/", "/new/"))
    >>> unplaced(a) == unplaced(b), unplaced(a)["models"][0]["model"]
    (True, '<a local file>')
    """
    out = json.loads(json.dumps(config, default=str))  # a deep copy, in the form store.json keeps
    models = out.get("models") if isinstance(out.get("models"), list) else [out.get("model")]
    sets = out.get("candidates") if isinstance(out.get("candidates"), list) else [out.get("candidates")]
    for m in (m for m in models if isinstance(m, dict)):
        for k in ("model", "base"):
            if isinstance(m.get(k), str) and os.path.isabs(m[k]):
                m[k] = LOCAL
    for c in (c for c in sets if isinstance(c, dict)):
        if isinstance(c.get("file"), dict):
            c["file"].pop("path", None)
        ids = (c.get("view") or {}).get("token_ids") if isinstance(c.get("view"), dict) else None
        if isinstance(ids, dict):
            ids.pop("file", None)
    for k in ("models", "candidates"):  # their order is the run's order, not the results'
        if isinstance(out.get(k), list):
            out[k] = sorted(out[k], key=lambda x: json.dumps(x, sort_keys=True))
    return out


def share(config: dict, part) -> dict | None:
    """What of a normalised config makes one part's key (``part``: a :class:`rmfast.sweep.store.PartRef`) (:meth:`rmfast.sweep.config.SweepConfig.part_key`)."""
    model = next((m for m in config.get("models") or [] if isinstance(m, dict) and m.get("name") == part.model), None)
    sets = next((c for c in config.get("candidates") or [] if isinstance(c, dict) and c.get("name") == part.candidates),
                None)
    if model is None or sets is None:
        return None
    return {"model": model, "prompt": part.prompt, "candidates": sets, "compat": config.get("compat"),
            "max_tokens": config.get("max_tokens")}
