"""Shared fixtures. The Triton interpreter must be chosen before triton is first imported."""

import os
from pathlib import Path

try:  # no GPU here or in CI: Triton kernels run in the interpreter (fp32, small shapes)
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # pragma: no cover
    pass

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RMFAST_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (fp32, CPU), converted once and cached."""
    from rmfast.loader import load

    try:
        return load("smollm2-135m-instruct", dtype="float32", device="cpu")
    except Exception as e:  # the package is a test dependency; say so rather than fail obscurely
        pytest.skip(f"embedded SmolLM2 unavailable: {e}")


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2):
    return smollm2.tokenizer


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smol_tokenizer):
    """A tiny Llama reward model saved as a normal HF folder, with the real SmolLM2 tokenizer."""
    import tiny_models as T

    d = tmp_path_factory.mktemp("tiny-rm")
    m = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    m.save_pretrained(d)
    smol_tokenizer.save_pretrained(d)
    return d
