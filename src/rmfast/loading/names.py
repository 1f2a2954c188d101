"""The one name of a model: what ``rmfast scan`` records as ``model.name`` and what a sweep calls the model
unless its config gives ``name:`` (issue 37: one model under two names made a combined report show two).

Decided from the spec alone, before anything is loaded: an embedded alias is its model's name
(``smollm2-135m-instruct`` -> ``SmolLM2-135M-Instruct``), a known reward model's alias its hub id, a
``.gguf`` file (or a folder holding one and no ``config.json``) its stem, a model folder its name, any
other hub id itself.

>>> model_name("smollm2-135m-instruct"), model_name("SmolLM2-135M-Instruct"), model_name("org/some-rm")
('SmolLM2-135M-Instruct', 'SmolLM2-135M-Instruct', 'org/some-rm')
"""

from __future__ import annotations

from pathlib import Path

from . import embedded, registry


def single_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file of ``folder``, or None (none, or several)."""
    files = sorted(folder.glob("*.gguf"))
    return files[0] if len(files) == 1 else None


def model_name(spec: str) -> str:
    """The canonical name of the model ``spec`` names (see the module's docstring)."""
    spec = str(spec).strip()
    entry = embedded.get(spec)
    if entry is not None:
        return entry.display_name
    path = Path(spec).expanduser()
    if path.is_file():
        return path.stem
    if path.is_dir():
        gguf = None if (path / "config.json").is_file() else single_gguf(path)
        return gguf.stem if gguf is not None else path.resolve().name
    known = registry.find(spec)
    return known.hub_id if known else spec
