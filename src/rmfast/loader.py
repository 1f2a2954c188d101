"""Load a reward model or causal LM from an embedded alias, a .gguf file, a folder or a hub id.

GGUF files are dequantized once (transformers' GGUF reader is slow: tens of seconds plus the
tokenizer conversion) and saved as an ordinary float32 Hugging Face folder in the rmfast cache,
``<cache>/converted/<stem>-<sha256[:16]>/``; later loads read that folder in seconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import struct
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError

from . import checkpoints, cpu, embedded, registry
from .errors import UserError
from .io import check_folder, file_sha256, write_json
from .models import custom_heads, vocab_check

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "LoadedModel",
    "load",
    "resolve_dtype",
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

_SOURCE_FILE = "rmfast_source.json"
_CONVERSION_VERSION = 1  # bump to invalidate converted folders if the format changes


@dataclass
class LoadedModel:
    model: "PreTrainedModel"  # eval mode, on the requested device and dtype, requires_grad False
    tokenizer: "PreTrainedTokenizerBase"
    kind: str  # "classifier" or "causal_lm"
    source: dict = field(default_factory=dict)  # manifest entry: spec, type, name, path, sha256, revision, alias
    default_template: str | None = None  # plain "User: {prompt}\nAssistant: {response}" for embedded base models


# --------------------------------------------------------------------------------------------
# cache, device, dtype


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


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: cuda if available else cpu. ``"cuda"`` without CUDA is a UserError."""
    if isinstance(device, torch.device):
        device = str(device)
    name = (device or "auto").strip().lower()
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


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, config_dtype: Any = None, *, config: Any = None) -> torch.dtype:
    """The torch dtype of a load: :func:`dtype_and_choice` without the record of the choice."""
    return dtype_and_choice(dtype, device, config_dtype, config=config)[0]


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
# GGUF: hash, convert once, cache


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
    (:func:`rmfast.plan.run_key`: a folder whose weights changed must not resume the old job).

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


def _converted_dir(gguf: Path, sha: str, cache: Path) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", gguf.stem) or "model"
    return cache / "converted" / f"{stem}-{sha[:16]}"


def _is_complete(folder: Path) -> bool:
    try:
        info = json.loads((folder / _SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return info.get("conversion_version") == _CONVERSION_VERSION and (folder / "config.json").is_file()


def _load_gguf_direct(gguf: Path, *, tokenizer: bool = True):
    """Read a GGUF with transformers (dequantized, float32). Slow; used once for the conversion."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _gguf  # noqa: F401
    except ImportError:
        raise UserError("reading .gguf files needs the package 'gguf': run `pip install gguf`") from None
    folder, name = str(gguf.parent), gguf.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name) if tokenizer else None
    except (ValueError, KeyError, RuntimeError, IndexError, EOFError, OSError, struct.error) as exc:
        # a damaged file fails inside the GGUF reader with whatever error its bytes lead to
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(
            f"cannot read GGUF '{gguf}': {msg[:200]} (a damaged or partial download: fetch the file again; "
            f"transformers reads Llama, Gemma, Qwen2, Mistral and a few other architectures)"
        ) from None
    return model, tok


_GGUF_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, metadata count


def check_gguf_header(path: Path) -> None:
    """UserError unless ``path`` is a whole GGUF: its header, its metadata and tensor table, and every
    tensor's data inside the file (catches empty, truncated, damaged and foreign files).

    Called before a conversion says it starts: a file damaged after an intact header would otherwise
    print "converting ..." and then its error, two lines. The metadata and table are read with the
    ``gguf`` package's own reader (transformers reads the file with it), in a second or two; the
    tensors' bytes are only located, never read.
    """
    with open(path, "rb") as fh:
        head = fh.read(_GGUF_HEADER.size)
    if len(head) < _GGUF_HEADER.size or head[:4] != b"GGUF":
        what = "is truncated" if head[:4] == b"GGUF" else "is not a GGUF file (no GGUF magic bytes)"
        raise UserError(f"'{path}' {what} ({path.stat().st_size} bytes): download the .gguf again, or pass a "
                        "model folder")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("reading .gguf files needs the package 'gguf': run `pip install gguf`") from None
    size = path.stat().st_size
    try:
        tensors = GGUFReader(path).tensors  # a table pointing past the end fails here (a short slice)
        end = max((t.data_offset + t.n_bytes for t in tensors), default=0)
    except (ValueError, KeyError, IndexError, OverflowError, TypeError, UnicodeDecodeError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"cannot read '{path}' past its header ({msg[:200]}): a damaged or partial download (fetch "
                        "the .gguf again) or a format newer than the installed gguf package; or pass a model folder") from None
    if end > size:
        raise UserError(f"'{path}' is truncated: its tensors need {end} bytes, the file has {size}: download the "
                        ".gguf again, or pass a model folder")


_TOKENIZER_PROBES = (
    "Hello world",
    "",
    " ",
    "  two leading spaces\tand\ttabs\n\nand newlines \n",
    "Ünïcödé, 日本語, emoji 🙂 and Zalgo z̷͔",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<eos>",
    "1234567890 3.14159 -42 0x1F",
    "don't STOP    me_now(){}[]",
)


def _same_tokenizer(a, b) -> bool:
    """Whether two tokenizers behave identically on the probes (encode, decode, specials, template)."""
    if len(a) != len(b) or a.chat_template != b.chat_template:
        return False
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            return False
    for text in _TOKENIZER_PROBES:
        for special in (True, False):
            ia = a(text, add_special_tokens=special)["input_ids"]
            if ia != b(text, add_special_tokens=special)["input_ids"]:
                return False
            if a.decode(ia) != b.decode(ia):
                return False
    ids = list(range(0, len(a), max(1, len(a) // 997)))
    return a.convert_ids_to_tokens(ids) == b.convert_ids_to_tokens(ids)


def _save_tokenizer(tok, folder: Path) -> None:
    """Save ``tok`` into ``folder`` and check that the saved copy reloads identically.

    Two load-time shortcuts are written into tokenizer_config.json when they give identical
    results on the probes: the generic TokenizersBackend class (model-specific classes such as
    GemmaTokenizer rebuild the backend in Python on every load: seconds for 262k tokens), and an
    explicit ``added_tokens_decoder`` (without it transformers parses the whole tokenizer.json
    in Python once more just to find the added tokens).
    """
    from transformers import AutoTokenizer

    tok.save_pretrained(folder)
    cfg_path = folder / "tokenizer_config.json"
    tok_json = folder / "tokenizer.json"
    original = json.loads(cfg_path.read_text())
    fast = dict(original)
    if tok_json.is_file():
        if fast.get("tokenizer_class") not in (None, "TokenizersBackend", "PreTrainedTokenizerFast"):
            fast["tokenizer_class"] = "TokenizersBackend"
        if "added_tokens_decoder" not in fast:
            added = json.loads(tok_json.read_text(encoding="utf-8")).get("added_tokens") or []
            fast["added_tokens_decoder"] = {
                str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in added
            }
    for cfg in ((fast, original) if fast != original else (original,)):
        cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        try:
            if _same_tokenizer(tok, AutoTokenizer.from_pretrained(folder)):
                return
        except Exception:  # noqa: BLE001 - try the next configuration
            if cfg is original:
                raise
    raise RuntimeError(f"the tokenizer saved in {folder} does not reload identically")


def convert_gguf(gguf: str | os.PathLike, cache: Path | None = None, *, sha256: str | None = None) -> Path:
    """Dequantize ``gguf`` once into ``<cache>/converted/<stem>-<sha256[:16]>/`` and return the folder.

    The folder is an ordinary Hugging Face model folder (config.json, float32 model.safetensors,
    tokenizer files) plus ``rmfast_source.json``. It is built in a temporary folder beside it and
    renamed into place, so an interrupted conversion never leaves a complete-looking folder.
    """
    gguf = Path(gguf).expanduser().resolve()
    cache = cache or cache_root()
    sha = sha256 or cached_sha256(gguf, cache)
    target = _converted_dir(gguf, sha, cache)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"rmfast: converting {gguf.name} once into {target} (a minute or two; 3 steps)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    model, tok = _load_gguf_direct(gguf)
    print(f"rmfast: 1/3 read and dequantized in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    # transformers flags the dequantized model as quantized and refuses save_pretrained; the
    # weights are plain float32 tensors now, so drop the quantizer and its config.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config.architectures = [type(model).__name__]
    model.config.dtype = torch.float32
    if tok.pad_token_id is not None:
        model.config.pad_token_id = tok.pad_token_id
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        print(f"rmfast: 2/3 float32 weights saved ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        _save_tokenizer(tok, tmp)  # 3/3: saved, and checked to reload identically
        write_json(
            tmp / _SOURCE_FILE,
            {
                "conversion_version": _CONVERSION_VERSION,
                "gguf_path": str(gguf),
                "gguf_name": gguf.name,
                "sha256": sha,
                "size": gguf.stat().st_size,
                "dtype": "float32",
                "transformers": __import__("transformers").__version__,
            },
        )
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if target.exists() and not _is_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # stale or foreign leftover
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_complete(target):  # another process finished first: use its folder
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"rmfast: 3/3 tokenizer saved and checked: converted {gguf.name} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return target


# --------------------------------------------------------------------------------------------
# spec resolution


_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def _looks_like_path(spec: str) -> bool:
    return (
        os.sep in spec
        or (os.altsep is not None and os.altsep in spec)
        or spec.startswith((".", "~"))
        or spec.lower().endswith(".gguf")
    )


def _not_found_hub(spec: str) -> UserError:
    return UserError(
        f"model '{spec}' not found: not an embedded alias, an existing folder or .gguf file, and not in the "
        f"local Hugging Face cache (this machine cannot download; pass a local folder)"
    )


def hub_snapshot(spec: str) -> tuple[Path, str | None]:
    """The local snapshot folder of a cached hub model and its commit hash (no network).

    A known reward model's alias (:mod:`rmfast.registry`) is its hub id at its pinned revision;
    absent from the cache, a known model's error says how to get it.
    """
    known = registry.find(spec)  # a hub id typed in full takes the cache's main, an alias the pinned revision
    repo, rev = (known.hub_id, known.revision) if known and "/" not in spec else (spec, None)
    missing = UserError(registry.how_to_get(known)) if known else _not_found_hub(spec)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise missing from None
    try:
        folder = Path(snapshot_download(repo, revision=rev, local_files_only=True))
    except (HFValidationError, OSError, ValueError):
        raise missing from None
    except Exception as exc:  # LocalEntryNotFoundError and friends
        if "LocalEntryNotFound" in type(exc).__name__ or "NotFound" in type(exc).__name__:
            raise missing from None
        raise
    if not (folder / "config.json").is_file():
        raise missing
    revision = folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else None
    return folder, revision


def _single_gguf(folder: Path) -> Path | None:
    files = sorted(folder.glob("*.gguf"))
    return files[0] if len(files) == 1 else None


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


_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_weights(folder: Path, allow_pickle: bool = False) -> None:
    """Refuse a folder whose only weights are pickles (unpickling can run code) unless ``allow_pickle``."""
    if allow_pickle or any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for pat in _PICKLES for p in folder.glob(pat))
    if pickles:
        raise UserError(f"model folder '{folder}' has only pickled weights ({', '.join(pickles[:3])}), and loading a "
                        "pickle can run code: convert them to safetensors, or pass --allow-pickle if you trust them (a sweep config: allow_pickle: true)")


def _load_folder(
    folder: Path,
    *,
    dtype: str,
    device: torch.device,
    trust_remote_code: bool,
    random_head_seed: int | None,
    attn_implementation: str | None,
    allow_pickle: bool = False,
):
    from transformers import AutoConfig, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise UserError(f"model folder '{folder}' has no config.json: pass a Hugging Face model folder or a .gguf file")
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=True)
    except (ValueError, OSError) as exc:  # transformers reports broken JSON as OSError
        if "trust_remote_code" in str(exc):
            raise UserError(
                f"model '{folder}' contains custom code: pass --trust-remote-code if you trust it"
            ) from None
        raise UserError(f"cannot read the config of '{folder}': {str(exc).splitlines()[0]} "
                        "(fix or re-download config.json)") from None
    check_weights(folder, allow_pickle)
    torch_dtype, choice = dtype_and_choice(dtype, device, getattr(config, "dtype", None) or getattr(config, "torch_dtype", None),
                                           config=config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(
            f"cannot load a tokenizer from '{folder}' ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): "
            f"the folder needs tokenizer files (tokenizer.json or tokenizer_config.json and its vocabulary)"
        ) from None
    files = {} if trust_remote_code else custom_heads.weight_files(folder)
    vocab_check.check_vocab_size(folder, config, files)
    custom = custom_heads.recognize(config.to_dict(), files)
    if custom is not None:  # ArmoRM / QRM / URM: transformers' backbone + rmfast's head, no remote code
        with quiet_transformers():
            try:
                model, missing = custom_heads.load_custom(folder, config, custom, files, tokenizer,
                                                          torch_dtype=torch_dtype, attn_implementation=attn_implementation)
            except RuntimeError as exc:
                raise (vocab_check.mismatch_error(folder, exc) or exc) from None
        _warn_missing(folder, missing)
        return _finish(model, tokenizer, device, choice), tokenizer, "classifier", False
    kind = model_kind(config)

    kwargs: dict[str, Any] = dict(
        dtype=torch_dtype, trust_remote_code=trust_remote_code, local_files_only=True
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
    with quiet_transformers():
        try:
            model, info = cls.from_pretrained(folder, output_loading_info=True, **kwargs)
        except (SafetensorError, OSError, EOFError, pickle.UnpicklingError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"cannot read the weights of '{folder}': {msg[:200]} (a damaged or partial download: "
                            "fetch the weight files again)") from None
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
            err = vocab_check.mismatch_error(folder, exc)
            if err is None:
                raise
            raise err from None
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
    _warn_missing(folder, missing)
    return _finish(model, tokenizer, device, choice), tokenizer, kind, seeded


def _warn_missing(folder, missing: list[str]) -> None:
    """Backbone weights absent from the checkpoint (randomly initialised by transformers): one warning."""
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        warnings.warn(
            f"rmfast: {folder} has no weights for {shown}; they are randomly initialised, so scores are "
            f"not meaningful",
            stacklevel=4,
        )


def _finish(model, tokenizer, device, choice=None):
    """Pad id from the tokenizer, on the device, eval mode, no gradients; the dtype choice recorded."""
    cpu.record(model, choice)
    if tokenizer.pad_token_id is not None:
        # the checkpoint's own pad id: the published loop pools with it (--compat authors, rmfast.hf_path)
        model._rmfast_checkpoint_pad_id = model.config.pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
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
    if embedded.get(str(spec)) is not None:
        return
    path = Path(str(spec)).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        check_gguf_header(path)
    elif path.is_dir() and (path / "config.json").is_file():
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
                                "(a damaged or partial download: fetch the weight files again)") from None


# --------------------------------------------------------------------------------------------
# public entry point


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
    base (``base``, default the base it names) and merged: see :mod:`rmfast.checkpoints`.
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
    default_template = None

    entry = embedded.get(spec)
    path = Path(spec).expanduser()
    if entry is not None:
        gguf = entry.gguf_path(cache)
        sha = cached_sha256(gguf, cache)
        folder = convert_gguf(gguf, cache, sha256=sha)
        source.update(type="embedded", name=entry.display_name, path=str(gguf), sha256=sha, alias=entry.alias)
        default_template = entry.default_template
    elif path.is_file() or (path.is_dir() and not (path / "config.json").is_file() and _single_gguf(path)):
        gguf = path if path.is_file() else _single_gguf(path)
        if gguf.suffix.lower() != ".gguf":
            raise UserError(f"'{spec}' is a file but not a .gguf: pass a .gguf file or a model folder")
        gguf = gguf.resolve()
        sha = cached_sha256(gguf, cache)
        if not _is_complete(_converted_dir(gguf, sha, cache)):
            check_gguf_header(gguf)  # before the conversion and its note: a broken file is one line
        folder = convert_gguf(gguf, cache, sha256=sha)
        source.update(type="gguf", name=gguf.stem, path=str(gguf), sha256=sha)
    elif checkpoints.is_adapter_folder(path):
        return _load_adapter(path.resolve(), base, dtype=dtype, device=dev, trust_remote_code=trust_remote_code,
                             cache_dir=cache_dir, attn_implementation=attn_implementation)
    elif path.is_dir():
        folder = path.resolve()
        source.update(type="folder", name=folder.name, path=str(folder))
    elif _HUB_ID.match(spec) and not spec.lower().endswith(".gguf"):
        folder, revision = hub_snapshot(spec)
        known = registry.find(spec)
        source.update(type="hub", name=known.hub_id if known else spec, path=str(folder), revision=revision,
                      alias=known.alias if known else None)
    elif _looks_like_path(spec):
        raise UserError(f"no such model folder or file: {spec}")
    else:
        raise _not_found_hub(spec)

    model, tokenizer, kind, seeded = _load_folder(
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
    if getattr(tokenizer, "chat_template", None):
        default_template = None
    return LoadedModel(model=model, tokenizer=tokenizer, kind=kind, source=source, default_template=default_template)


def _load_adapter(folder: Path, base: str | None, *, dtype, device, trust_remote_code, cache_dir,
                  attn_implementation) -> LoadedModel:
    """An adapter checkpoint: its base loaded in float32 on the CPU, the adapter merged, then cast and moved."""
    info = checkpoints.read_adapter(folder)
    spec = base or info.base
    if not spec:
        raise UserError(f"adapter checkpoint {folder} names no base model: pass --base PATH/ALIAS (the model it was trained from)")
    # a reward-model adapter (SEQ_CLS) on a causal-LM base: a one-label classifier whose head the adapter replaces
    seq_cls = info.task_type == "SEQ_CLS"
    try:
        lm = load(spec, dtype="float32", device="cpu", trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                  random_head_seed=0 if seq_cls else None, attn_implementation=attn_implementation)
    except UserError as e:
        raise UserError(f"adapter checkpoint {folder}: cannot load its base {spec!r} ({e}); "
                        "pass --base PATH/ALIAS (the model it was trained from)") from None
    if seq_cls and lm.source.get("random_head_seed") is not None and not checkpoints.adapter_saves_head(folder):
        raise UserError(f"adapter checkpoint {folder} has no score head (modules_to_save) and its base {spec!r} is not "
                        "a reward model: its scores would come from a random head")
    model = checkpoints.merge_adapter(lm.model, folder)
    torch_dtype, choice = dtype_and_choice(dtype, device, torch.float32, config=model.config)
    model.to(device=device, dtype=torch_dtype)
    cpu.record(model, choice)
    model.eval()
    model.requires_grad_(False)
    source = {"spec": str(folder), "type": "adapter", "name": folder.name, "path": str(folder), "sha256": None,
              "revision": None, "alias": None, "random_head_seed": None,
              "content_sha256": content_sha256(folder, cache=cache_root(cache_dir)),
              "base": {k: v for k, v in lm.source.items() if k != "random_head_seed"}, "peft_type": info.peft_type}
    return LoadedModel(model=model, tokenizer=lm.tokenizer, kind="classifier" if seq_cls else lm.kind, source=source,
                       default_template=lm.default_template)
