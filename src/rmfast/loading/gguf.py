"""GGUF files: the header checked, the weights converted once (dequantized by transformers) into a
cached Hugging Face folder keyed by the file's sha256 (:func:`rmfast.loading.sources.converted_dir`),
the tokenizer saved beside them. Only a conversion runs this module: a converted folder is found by the
loader in the cache.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..errors import UserError
from ..io import file_sha256, write_json
from .sources import (CONVERSION_VERSION, SOURCE_FILE, cache_root, cached_sha256, conversion_complete, converted_dir,
                      remember_sha256)

__all__ = ["convert_gguf", "check_gguf_header"]


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


#: a conversion's temporary folder untouched this long is a killed conversion's (one takes a minute or two)
STALE_TEMP_S = 3600.0


def convert_gguf(gguf: str | os.PathLike, cache: Path | None = None, *, sha256: str | None = None) -> Path:
    """Dequantize ``gguf`` once into ``<cache>/converted/<stem>-<sha256[:16]>/`` and return the folder.

    The folder is an ordinary Hugging Face model folder (config.json, float32 model.safetensors,
    tokenizer files) plus ``rmfast_source.json``. It is built in a temporary folder beside it and
    renamed into place, so an interrupted conversion never leaves a complete-looking folder.
    """
    gguf = Path(gguf).expanduser().resolve()
    cache = cache or cache_root()
    sha = sha256 or cached_sha256(gguf, cache)
    target = converted_dir(gguf, sha, cache)
    if conversion_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for old in target.parent.glob(f".{target.name}.*"):  # a conversion killed while saving (400 MB-1.1 GB each);
        if old.is_dir() and time.time() - old.stat().st_mtime > STALE_TEMP_S:  # a live one is younger
            shutil.rmtree(old, ignore_errors=True)
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
            tmp / SOURCE_FILE,
            {
                # every file's sha256, checked at each load (sources.check_converted): the folder is found by the
                # GGUF's hash in its name, which says nothing of its own bytes
                "files_sha256": {f.name: file_sha256(f) for f in sorted(tmp.iterdir()) if f.is_file()},
                "conversion_version": CONVERSION_VERSION,
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
        if target.exists() and not conversion_complete(target):
            shutil.rmtree(target, ignore_errors=True)  # stale or foreign leftover
        try:
            os.replace(tmp, target)
            for name, f_sha in json.loads((target / SOURCE_FILE).read_text())["files_sha256"].items():
                remember_sha256(target / name, f_sha, cache)  # hashed moments ago: the first load reads none again
        except OSError:
            if not conversion_complete(target):  # another process finished first: use its folder
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"rmfast: 3/3 tokenizer saved and checked: converted {gguf.name} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return target
