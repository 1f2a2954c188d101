"""A model spread over several GPUs by accelerate (``device_map``), for models too large for one device.

Scored on the plain Hugging Face path (``engine="hf"``), which follows accelerate's placement; the
shared-prompt engine assumes one device.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from . import loader as L
from . import sources


def load_spread(spec: str, *, dtype: str = "auto", device: str = "auto", device_map: str | None = None,
               trust_remote_code: bool = False, cache_dir=None, random_head_seed: int | None = None,
               max_memory: dict | None = None, allow_pickle: bool = False, base: str | None = None):
    """:func:`rmfast.loading.loader.load`, or with ``device_map`` (e.g. "auto") a model spread by accelerate.

    ``device_map`` applies to model folders and cached hub ids (embedded and GGUF models are small
    enough for one device). The result is a :class:`rmfast.loading.loader.LoadedModel`; score it with
    ``engine="hf"`` (the plain-HF path), which follows accelerate's placement.
    """
    if device_map is None or str(device_map).lower() in ("", "none"):
        return L.load(spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                      random_head_seed=random_head_seed, allow_pickle=allow_pickle, base=base)
    if random_head_seed is not None:
        raise UserError("--device-map cannot be combined with random_head_seed (a random head is for small test models)")
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise UserError("--device-map needs the package 'accelerate': run `pip install accelerate`") from None
    w = sources.where(spec)
    spec, path = w.spec, w.path
    if w.kind in ("embedded", "gguf", "file") or spec.lower().endswith(".gguf"):
        raise UserError(f"--device-map is for model folders and hub ids; {spec!r} is an embedded/GGUF model that fits on one device")
    if w.kind in ("folder", "adapter"):
        folder, source = path.resolve(), {"type": "folder", "name": path.resolve().name}
    else:
        folder, revision = sources.hub_snapshot(spec)
        source = {"type": "hub", "name": spec, "revision": revision}
    first = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kw = {"device_map": device_map, **({"max_memory": max_memory} if max_memory else {})}
    try:  # every check of a one-device load (rmfast.loading.folder_checks), the placement accelerate's
        model, tok, kind, _ = L.load_folder(folder, dtype=dtype, device=first, trust_remote_code=trust_remote_code,
                                            random_head_seed=None, attn_implementation="eager",
                                            allow_pickle=allow_pickle, spread=kw)
    except ValueError as exc:
        raise UserError(f"cannot load '{folder}' with device_map={device_map!r}: {str(exc).splitlines()[0]}") from None
    placement = {k: str(v) for k, v in (getattr(model, "hf_device_map", None) or {}).items()}
    source.update(spec=spec, path=str(folder), sha256=None, alias=None, random_head_seed=None,
                  content_sha256=sources.content_sha256(folder, source.get("revision"), sources.cache_root(cache_dir)),
                  tokenizer_sha256=None if source.get("revision") else sources.files_sha256(
                      folder, sources.TOKENIZER_FILES, sources.cache_root(cache_dir)),
                  device_map=str(device_map), placement=sorted(set(placement.values())))
    return L.LoadedModel(model=model, tokenizer=tok, kind=kind, source=source, default_template=None)
