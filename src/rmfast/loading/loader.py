"""Load a reward model or causal LM from an embedded alias, a .gguf file, a folder or a hub id.

GGUF files are dequantized once (transformers' GGUF reader is slow: tens of seconds plus the
tokenizer conversion) and saved as an ordinary float32 Hugging Face folder in the rmfast cache,
``<cache>/converted/<stem>-<sha256[:16]>/``; later loads read that folder in seconds.
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError

from .. import cpu
from . import custom_heads, registry
from . import training_checkpoints as checkpoints
from ..errors import UserError
from .folder_checks import (check_rope_type, check_vocab_size, check_weights, custom_head_kind,  # noqa: F401
                            embedding_names, mismatch_error, warn_unexpected, weight_files)
from .gguf import check_gguf_header, convert_gguf
from .sources import (TOKENIZER_FILES, Where, cache_root, cached_sha256, check_converted, content_sha256,
                      conversion_complete, converted_copy, converted_dir, damaged_fix, files_sha256, hub_folder,
                      model_name, no_model_here, quiet_transformers, where)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "LoadedModel",
    "load",
    "dtype_and_choice",
    "dtype_name",
    "resolve_device",
    "cache_root",
    "cached_sha256",
    "content_sha256",
    "convert_gguf",
    "model_kind",
    "check_weights",
    "check_gguf_header",
    "preflight",
    "causal_lm_only",
]

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}



@dataclass
class LoadedModel:
    model: "PreTrainedModel"  # eval mode, on the requested device and dtype, requires_grad False
    tokenizer: "PreTrainedTokenizerBase"
    kind: str  # "classifier" or "causal_lm"
    source: dict = field(default_factory=dict)  # manifest entry: spec, type, name, path, sha256, revision, alias
    default_template: str | None = None  # plain "User: {prompt}\nAssistant: {response}" for embedded base models

    def __post_init__(self):  # the model carries its provenance: rmfast.scan(lm.model, ...) records it too
        setattr(self.model, SOURCE_ATTR, self.source)


#: the attribute a loaded model carries its loader's ``source`` in (:func:`recorded_source`)
SOURCE_ATTR = "_rmfast_source"


def recorded_source(model) -> dict | None:
    """The manifest's model entry (spec, name, path, hashes) of a model :func:`load` gave, else None."""
    return getattr(model, SOURCE_ATTR, None)


# --------------------------------------------------------------------------------------------
# device, dtype


def resolve_device(device: str | torch.device = "auto", local_rank: int | None = None) -> torch.device:
    """The device a job runs on, its one rule: ``"auto"``: cuda if available else cpu; under torchrun
    (``local_rank``), "auto" and "cuda" mean this rank's GPU, cuda:LOCAL_RANK (modulo the GPUs there are).
    ``"cuda"`` without CUDA is a UserError. The plan records why (:func:`rmfast.scoring.decisions.device_reason`)."""
    if isinstance(device, torch.device):
        device = str(device)
    name = (device or "auto").strip().lower()
    if local_rank is not None and name in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"unknown device '{device}': use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device '{device}' requested but CUDA is not available here: use --device cpu (or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(
                f"device '{device}' does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif dev.type != "cpu":
        raise UserError(f"unsupported device '{device}': use auto, cpu, cuda or cuda:N")
    return dev


def dtype_name(dtype: str | torch.dtype) -> str:
    """``dtype`` checked and normalized ("auto", "bfloat16", "float16" or "float32"), without measuring anything."""
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.bfloat16, torch.float16, torch.float32):
            return str(dtype).removeprefix("torch.")
        raise UserError(f"unsupported dtype {dtype}: use auto, bfloat16, float16 or float32")
    name = (dtype or "auto").strip().lower().removeprefix("torch.")
    if name == "auto":
        return name
    if name not in _DTYPES:
        raise UserError(f"unknown dtype '{dtype}': use auto, bfloat16 (bf16), float16 (fp16) or float32 (fp32)")
    return str(_DTYPES[name]).removeprefix("torch.")


def dtype_and_choice(dtype: str | torch.dtype, device: torch.device, config_dtype: Any = None, *,
                     config: Any = None) -> tuple[torch.dtype, "cpu.DtypeChoice | None"]:
    """The dtype a model is loaded in, and on CPU with ``"auto"`` the measured choice behind it.

    ``"auto"``: on CUDA the model config's dtype if bf16/fp16, else bfloat16; on CPU bfloat16 only where
    this CPU runs bf16 GEMMs clearly faster than fp32 at the model's shapes (``config``), else float32
    (:func:`rmfast.cpu.choose_cpu_dtype`: CPU flags or a cached sub-second probe; its line is printed
    by :func:`rmfast.cpu.record` once the model has loaded, so bad input stays a one-line error).
    An explicit bfloat16 on a CPU where it is slower than fp32 warns with the measured factor.
    Explicit names: bfloat16/bf16, float16/fp16, float32/fp32.
    """
    name = dtype_name(dtype)
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto" and not on_cpu:
        cfg = _as_torch_dtype(config_dtype)
        return (cfg if cfg in (torch.bfloat16, torch.float16) else torch.bfloat16), None
    if name == "auto":
        choice = cpu.choose_cpu_dtype(config, cache_root())  # said once the model is loaded (cpu.record)
        return _DTYPES[choice.dtype], choice
    if on_cpu and name == "bfloat16":
        cpu.warn_if_slow(torch.bfloat16, config, cache_root())
    return _DTYPES[name], None


def _as_torch_dtype(value: Any) -> torch.dtype | None:
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        return _DTYPES.get(value.lower().removeprefix("torch."))
    return None


# --------------------------------------------------------------------------------------------
# kind and model classes


def model_kind(config) -> str:
    """"classifier" for *ForSequenceClassification / *RewardModel*, "causal_lm" for LM heads."""
    archs = list(getattr(config, "architectures", None) or [])
    for arch in archs:
        if arch.endswith("ForSequenceClassification") or "RewardModel" in arch:
            return "classifier"
    for arch in archs:
        if arch.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")):
            return "causal_lm"
    if not archs:
        return "causal_lm"  # e.g. converted or hand-written configs; AutoModelForCausalLM decides
    raise UserError(
        f"model architecture {archs[0]} is neither a sequence classifier / reward model nor a causal LM: "
        f"pass a *ForSequenceClassification, reward-model or *ForCausalLM checkpoint"
    )


def auto_class(config, kind: str):
    import transformers

    auto_map = getattr(config, "auto_map", None) or {}
    if kind == "classifier":
        archs = list(getattr(config, "architectures", None) or [])
        builtin = any(hasattr(transformers, a) for a in archs)
        if "AutoModelForSequenceClassification" in auto_map or builtin or "AutoModel" not in auto_map:
            return transformers.AutoModelForSequenceClassification
        return transformers.AutoModel
    return transformers.AutoModelForCausalLM



def _init_random_head(model, seed: int) -> None:
    """Initialise the classification head deterministically: normal(0, 0.02) from ``seed``, bias 0."""
    head = getattr(model, "score", None)
    if head is None:
        head = getattr(model, "classifier", None)
    if head is None or not hasattr(head, "weight"):
        raise UserError(f"{type(model).__name__} has no 'score' head to initialise with random_head_seed")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    with torch.no_grad():
        w = torch.randn(head.weight.shape, generator=gen, dtype=torch.float32) * 0.02
        head.weight.copy_(w.to(head.weight.dtype))
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()


def _read_config(folder: Path, trust_remote_code: bool):
    """The folder's config, or one line saying what is wrong with it."""
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise no_model_here(Where(str(folder), "folder", folder))
    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=True)
    except (ValueError, OSError) as exc:  # transformers reports broken JSON as OSError
        if "trust_remote_code" in str(exc):
            raise UserError(
                f"model '{folder}' contains custom code: pass --trust-remote-code if you trust it"
            ) from None
        raise UserError(f"cannot read the config of '{folder}': {str(exc).splitlines()[0]} "
                        "(fix or re-download config.json)") from None


def _from_pretrained(cls, folder: Path, config, kind: str, attn_implementation: str | None, kwargs: dict):
    """``cls.from_pretrained`` with transformers' errors for damaged weights, remote code, an attention
    implementation the model lacks or a weight shape the config does not describe, as one line each."""
    with quiet_transformers():
        try:
            return cls.from_pretrained(folder, output_loading_info=True, **kwargs)
        except (SafetensorError, OSError, EOFError, pickle.UnpicklingError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"cannot read the weights of '{folder}': {msg[:200]} ({damaged_fix(folder)})") from None
        except ValueError as exc:
            text = str(exc)
            if "trust_remote_code" in text:
                raise UserError(f"model '{folder}' contains custom code: pass --trust-remote-code if you trust it") from None
            if "attn_implementation" in text or "attention implementation" in text.lower():
                raise UserError(
                    f"model '{folder}' does not support attn_implementation='{attn_implementation}': "
                    f"{text.splitlines()[0]}"
                ) from None
            if "Unrecognized configuration class" in text:
                raise UserError(
                    f"model '{folder}' ({type(config).__name__}) cannot be loaded as a "
                    f"{'sequence classifier' if kind == 'classifier' else 'causal LM'} by transformers"
                ) from None
            raise
        except RuntimeError as exc:  # e.g. a weight shape config.json does not describe
            err = mismatch_error(folder, exc)
            if err is None:
                raise
            raise err from None


def load_folder(
    folder: Path,
    *,
    dtype: str,
    device: torch.device,
    trust_remote_code: bool,
    random_head_seed: int | None,
    attn_implementation: str | None,
    allow_pickle: bool = False,
    spread: dict | None = None,
):
    """(model, tokenizer, kind, seeded) of a model folder, every check of :mod:`.folder_checks` applied. ``spread``:
    accelerate's placement (``device_map``, ``max_memory``: :mod:`.spread`) in place of moving it to ``device``."""
    from transformers import AutoTokenizer

    config = _read_config(folder, trust_remote_code)
    check_weights(folder, allow_pickle)
    check_rope_type(folder, config, trust_remote_code)
    # config.dtype: transformers 5 reads a config.json's old torch_dtype into it (config.torch_dtype would log
    # its deprecation)
    model_dtype, choice = dtype_and_choice(dtype, device, getattr(config, "dtype", None), config=config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a damaged tokenizer.json
        fix = (damaged_fix(folder) if converted_copy(folder) else "the folder needs tokenizer files (tokenizer.json "
               "or tokenizer_config.json and its vocabulary), whole")
        raise UserError(f"cannot load a tokenizer from '{folder}' "
                        f"({str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}): {fix}") from None
    files = {} if trust_remote_code else weight_files(folder)
    check_vocab_size(folder, config, files)
    custom = custom_head_kind(files)
    if custom is not None and spread:
        raise UserError(f"'{folder}' has an {custom_heads.KINDS[custom]}, which rmfast builds on one device: load it "
                        "without --device-map")
    if custom is not None:  # ArmoRM / QRM / URM: transformers' backbone + rmfast's head, no remote code
        with quiet_transformers():
            try:
                model, missing = custom_heads.load_custom(folder, config, custom, files, tokenizer,
                                                          dtype=model_dtype, attn_implementation=attn_implementation)
            except RuntimeError as exc:
                raise (mismatch_error(folder, exc) or exc) from None
        _refuse_missing(folder, missing)
        return _finish(model, tokenizer, device, choice), tokenizer, "classifier", False
    kind = model_kind(config)

    kwargs: dict[str, Any] = dict(
        dtype=model_dtype, trust_remote_code=trust_remote_code, local_files_only=True
    )
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    seeded = random_head_seed is not None and kind == "causal_lm"
    if seeded:
        from transformers import AutoModelForSequenceClassification

        cls = AutoModelForSequenceClassification
        kwargs["num_labels"] = 1
        kind = "classifier"
        if tokenizer.pad_token_id is not None:
            kwargs["pad_token_id"] = tokenizer.pad_token_id
    else:
        cls = auto_class(config, kind)
    if not allow_pickle:
        kwargs["use_safetensors"] = True  # never unpickle unless asked (check_weights said why)
    kwargs.update(spread or {})
    model, info = _from_pretrained(cls, folder, config, kind, attn_implementation, kwargs)
    warn_unexpected(folder, info.get("unexpected_keys"))
    missing = sorted(info.get("missing_keys") or [])
    head = {n for n, _ in model.named_parameters() if n.split(".")[0] in ("score", "classifier")}
    head_missing = [k for k in missing if k in head]
    if head_missing and random_head_seed is None:
        # A random head ranks noise: never a ranking unless asked for (random_head_seed / --random-head-seed).
        raise UserError(
            f"{folder} has no weights for its reward head ({', '.join(head_missing)}): its scores would come from "
            f"a random head; pass the complete checkpoint (a random head is drawn only on request: "
            f"load(..., random_head_seed=N))"
        )
    seeded = seeded or bool(head_missing)  # a seed fills a missing head; a trained head is kept
    if seeded:
        _init_random_head(model, random_head_seed)
        missing = [k for k in missing if k not in head]
    _refuse_missing(folder, missing)
    return _finish(model, tokenizer, None if spread else device, choice), tokenizer, kind, seeded


def _refuse_missing(folder, missing: list[str]) -> None:
    """Backbone weights absent from the checkpoint: transformers would draw them at random, so a ranking would not be
    the model's (as a missing head: never a result). One line naming them."""
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise UserError(f"{folder} has no weights for {shown}: transformers would draw them at random, so its scores "
                        "would not be the model's; pass the complete checkpoint (or fix config.json if it describes "
                        "layers these weights do not have)")


def _finish(model, tokenizer, device, choice=None):
    """Pad id from the tokenizer, on the device (None: where accelerate placed it), eval mode, no gradients; the
    dtype choice recorded."""
    cpu.record(model, choice)
    if tokenizer.pad_token_id is not None:
        # the checkpoint's own pad id: the published loop pools with it (--compat authors, rmfast.scoring.hf_path)
        model._rmfast_checkpoint_pad_id = model.config.pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def preflight(spec: str, *, cache_dir: str | os.PathLike | None = None, allow_pickle: bool = False) -> None:
    """Cheap checks that :func:`load` can read ``spec``'s files, without loading any weights: a GGUF
    header, or a folder's config.json (valid JSON), safetensors headers and no bare pickles. A job
    over many models (a sweep) calls this for each before it writes anything; UserError names the
    broken file. Embedded aliases and names that are not local paths are left to :func:`load`.
    """
    w = where(spec)
    path = w.path
    if w.kind == "gguf":
        check_gguf_header(w.gguf)
    elif w.kind == "folder" and (path / "config.json").is_file():
        try:
            json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read the config of '{path}': {str(exc).splitlines()[0]} "
                            "(fix or re-download config.json)") from None
        check_weights(path, allow_pickle)
        from safetensors import safe_open

        for f in sorted(path.glob("*.safetensors")):
            try:
                with safe_open(str(f), framework="pt"):
                    pass
            except (SafetensorError, OSError) as exc:
                raise UserError(f"cannot read the weights of '{path}': {f.name}: {str(exc).splitlines()[0][:200]} "
                                f"({damaged_fix(path)})") from None


def causal_lm_only(spec: str) -> bool | None:
    """Whether ``spec`` loads (with no random head) as a causal LM with no reward head, read off its files without
    loading: True for an embedded alias, a .gguf, or a folder whose config names a causal LM and whose weights no
    custom head; False for a reward model or classifier; None where the files do not say (a hub id, an adapter)."""
    w = where(spec)
    path = w.path
    if w.kind in ("embedded", "gguf") or path.suffix.lower() == ".gguf":  # a .gguf not there: load says so
        return True
    if w.kind != "folder" or not (path / "config.json").is_file():
        return None
    try:
        config = SimpleNamespace(**json.loads((path / "config.json").read_text(encoding="utf-8")))
        return model_kind(config) == "causal_lm" and custom_head_kind(weight_files(path)) is None
    except (OSError, ValueError, TypeError, UserError):
        return None  # load() names what is wrong


# --------------------------------------------------------------------------------------------
# public entry point


def _converted(gguf: Path, cache: Path, *, check_header: bool) -> tuple[Path, str]:
    """The cached Hugging Face folder of a GGUF file and the file's sha256: converted now only where the cache
    has no finished conversion (:mod:`rmfast.loading.gguf`), its header checked first where ``check_header``
    (before the conversion and its note: a broken file is one line)."""
    sha = cached_sha256(gguf, cache)
    folder = converted_dir(gguf, sha, cache)
    if not conversion_complete(folder):
        if check_header:
            check_gguf_header(gguf)
        folder = convert_gguf(gguf, cache, sha256=sha)
    check_converted(folder, cache)
    return folder, sha


def _locate(w: Where, cache: Path, source: dict) -> tuple[Path, str | None]:
    """The Hugging Face folder a model spec names (:func:`rmfast.loading.sources.where`: an embedded alias or a
    GGUF converted once, a folder, a cached hub id) and its default template; fills ``source`` (the provenance) as
    it goes."""
    spec, default_template = w.spec, None
    if w.kind == "embedded":
        gguf = w.entry.gguf_path(cache)
        folder, sha = _converted(gguf, cache, check_header=False)
        source.update(type="embedded", name=model_name(spec), path=str(gguf), sha256=sha, alias=w.entry.alias)
        default_template = w.entry.default_template
    elif w.kind == "file":
        raise no_model_here(w)
    elif w.kind == "gguf":
        gguf = w.gguf.resolve()
        folder, sha = _converted(gguf, cache, check_header=True)
        source.update(type="gguf", name=model_name(spec), path=str(gguf), sha256=sha)
    elif w.kind == "folder":
        folder = w.path.resolve()
        source.update(type="folder", name=model_name(spec), path=str(folder))
    else:
        folder, revision = hub_folder(spec)
        known = registry.find(spec)
        source.update(type="hub", name=model_name(spec), path=str(folder), revision=revision,
                      alias=known.alias if known else None)
    return folder, default_template


def load(
    spec: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    cache_dir: str | os.PathLike | None = None,
    random_head_seed: int | None = None,
    attn_implementation: str = "eager",
    allow_pickle: bool = False,
    base: str | None = None,
) -> LoadedModel:
    """Load ``spec``: an embedded alias, a .gguf file, a model folder, or a cached hub id.

    The model comes back in eval mode with gradients off, in the resolved dtype on the resolved
    device. With ``random_head_seed`` a causal LM is returned as a one-label sequence classifier
    whose ``score`` head is drawn from that seed (backbone unchanged). Pickled weights
    (``pytorch_model.bin``) are refused unless ``allow_pickle`` (loading a pickle can run code).
    A PEFT adapter folder (``adapter_config.json``, e.g. a LoRA ``checkpoint-N``) is loaded on its
    base (``base``, default the base it names) and merged: see :mod:`rmfast.loading.training_checkpoints`.
    """
    if not isinstance(spec, (str, os.PathLike)) or not str(spec).strip():
        raise UserError("no model given: pass an embedded alias, a .gguf file, a model folder or a hub id")
    spec = str(spec).strip()
    dev = resolve_device(device)
    dtype_name(dtype)  # validate the name before any slow work
    cache = cache_root(cache_dir)
    source: dict[str, Any] = {
        "spec": spec,
        "type": None,
        "name": None,
        "path": None,
        "sha256": None,
        "revision": None,
        "alias": None,
        "random_head_seed": random_head_seed,
        "content_sha256": None,
    }
    w = where(spec)
    if w.kind == "adapter":
        return _load_adapter(w.path.resolve(), base, dtype=dtype, device=dev, trust_remote_code=trust_remote_code,
                             cache_dir=cache_dir, attn_implementation=attn_implementation)
    folder, default_template = _locate(w, cache, source)

    model, tokenizer, kind, seeded = load_folder(
        folder,
        dtype=dtype,
        device=dev,
        trust_remote_code=trust_remote_code,
        random_head_seed=random_head_seed,
        attn_implementation=attn_implementation,
        allow_pickle=allow_pickle,
    )
    if not seeded:
        source["random_head_seed"] = None
    if source["type"] in ("folder", "hub"):  # hashed once loaded: a broken folder fails first, in one line
        source["content_sha256"] = content_sha256(folder, source["revision"], cache)
        source["tokenizer_sha256"] = None if source["revision"] else files_sha256(folder, TOKENIZER_FILES, cache)
    if getattr(tokenizer, "chat_template", None):
        default_template = None
    return LoadedModel(model=model, tokenizer=tokenizer, kind=kind, source=source, default_template=default_template)


def _load_adapter(folder: Path, base: str | None, *, dtype, device, trust_remote_code, cache_dir,
                  attn_implementation) -> LoadedModel:
    """An adapter checkpoint: its base loaded in float32 on the CPU, the adapter merged, then cast and moved."""
    info = checkpoints.read_adapter(folder)
    err = checkpoints.adapter_weights_error(folder)
    if err is not None:
        raise err
    spec = base or info.base
    if not spec:
        raise UserError(f"adapter checkpoint {folder} names no base model: pass --base PATH/ALIAS (the model it was trained from)")
    # a reward-model adapter (SEQ_CLS) on a causal-LM base: a one-label classifier whose head the adapter replaces
    seq_cls = info.task_type == "SEQ_CLS"
    try:
        lm = load(spec, dtype="float32", device="cpu", trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                  random_head_seed=0 if seq_cls else None, attn_implementation=attn_implementation)
    except UserError as e:
        raise checkpoints.base_error(folder, spec, bool(base), e.cli_message()) from None
    if seq_cls and lm.source.get("random_head_seed") is not None and not checkpoints.adapter_saves_head(folder):
        raise UserError(f"adapter checkpoint {folder} has no score head (modules_to_save) and its base {spec!r} is not "
                        "a reward model: its scores would come from a random head")
    model = checkpoints.merge_adapter(lm.model, folder)
    model_dtype, choice = dtype_and_choice(dtype, device, torch.float32, config=model.config)
    model.to(device=device, dtype=model_dtype)
    cpu.record(model, choice)
    model.eval()
    model.requires_grad_(False)
    source = {"spec": str(folder), "type": "adapter", "name": folder.name, "path": str(folder), "sha256": None,
              "revision": None, "alias": None, "random_head_seed": None,
              "content_sha256": content_sha256(folder, cache=cache_root(cache_dir)),
              "base": {k: v for k, v in lm.source.items() if k != "random_head_seed"}, "peft_type": info.peft_type}
    return LoadedModel(model=model, tokenizer=lm.tokenizer, kind="classifier" if seq_cls else lm.kind, source=source,
                       default_template=lm.default_template)
