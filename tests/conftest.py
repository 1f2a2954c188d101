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

# The suite must not depend on the shell it starts in: these change what rmfast does (compile or
# not, which kernels, a distributed run), so a user's or a launcher's values are dropped here.
for _k in ("RMFAST_COMPILE", "RMFAST_KERNELS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
    os.environ.pop(_k, None)
# compile="auto" compiles the CPU layer on some CPU kinds (AMX) for every job: there the suite's
# hundreds of small scans would each pay a compile. The suite runs them eagerly on every machine;
# the tests of the compiled layer ask for it (compile="on"), and choose_compile's rule is unit-tested.
os.environ["RMFAST_COMPILE"] = "0"



def _own_cache() -> Path:
    """A per-session rmfast cache (``RMFAST_CACHE``) whose ``converted/`` is the user's own, shared.

    The suite must neither depend on nor change what an earlier run or another job left in the user's cache: the
    verdicts under ``cpu/`` (GEMM probe rates, padding verdicts) and ``sha256-index.json`` decide what a job
    does, so they start empty in a temp folder, removed at exit. ``converted/`` (the embedded GGUF models converted to
    HF folders, keyed by the GGUF file's hash) and ``gguf/`` (Gemma's file assembled from its package, checked
    against its sha256) cost a minute and more each to rebuild and are written atomically, so sharing them cannot
    change a result: each is a link to the user's (made if missing). A test about the cache itself points
    RMFAST_CACHE elsewhere (monkeypatch)."""
    import atexit
    import shutil
    import tempfile

    user = Path(os.environ.get("RMFAST_CACHE") or Path.home() / ".cache" / "rmfast").expanduser()
    root = Path(tempfile.mkdtemp(prefix="rmfast-test-cache-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for shared in ("converted", "gguf"):
        try:
            (user / shared).mkdir(parents=True, exist_ok=True)
            (root / shared).symlink_to(user / shared, target_is_directory=True)
        except OSError:  # a user cache that cannot be made: this session converts into its own
            pass
    return root


os.environ["RMFAST_CACHE"] = str(_own_cache())
REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RMFAST_SHARED_DATA", REPO.parent / "shared" / "data"))


def _cpp_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would use, or None (then rmfast runs eager)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:
        return None


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.compiles``: the test needs torch.compile to really compile (a C++ compiler);
    on a machine without one rmfast falls back to eager, so such a test skips instead of failing."""
    marked = [it for it in items if it.get_closest_marker("compiles")]
    if marked and _cpp_compiler() is None:
        skip = pytest.mark.skip(reason="no C++ compiler for torch.compile (install g++ or set CXX)")
        for it in marked:
            it.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct (fp32, CPU), converted once and cached."""
    from rmfast.loading.loader import load

    try:
        return load("smollm2-135m-instruct", dtype="float32", device="cpu")
    except Exception as e:  # the package is a test dependency; say so rather than fail obscurely
        pytest.skip(f"embedded SmolLM2 unavailable: {e}")


@pytest.fixture(scope="session")
def smol_tokenizer(request):
    """SmolLM2's tokenizer; with ``RMFAST_TEST_SMOL_TOKENIZER`` set, read from that folder of its tokenizer files (a
    lent GPU machine has no room for the embedded model's package: the serve tests' same-bits checks run there)."""
    folder = os.environ.get("RMFAST_TEST_SMOL_TOKENIZER")
    if folder:
        from transformers import AutoTokenizer

        if not os.path.isfile(os.path.join(folder, "tokenizer.json")):
            pytest.fail(f"RMFAST_TEST_SMOL_TOKENIZER={folder}: no tokenizer.json there "
                        "(bash benchmarks/gpu_followup.sh --prepare writes one to .gpu_tok)")

        return AutoTokenizer.from_pretrained(folder)
    return request.getfixturevalue("smollm2").tokenizer


#: the prompt most tests score against (paper A's)
PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="session")
def tmpl(smol_tokenizer):
    """The split chat template of :data:`PROMPT` on SmolLM2's tokenizer (the tiny models share it)."""
    from rmfast.template import build_template

    return build_template(smol_tokenizer, PROMPT)


@pytest.fixture(scope="session")
def paper_b_published(tmp_path_factory):
    """Paper B reproduced from the published ``iclr2026`` folder, ONCE a session (a reproduction takes
    ~15 s here): (findings, the folder they were written to). Tests read both and write neither."""
    ic = SHARED_DATA / "iclr2026"
    if not ic.is_dir():
        pytest.skip(f"shared data absent ({ic})")
    from rmfast.analysis.paper_b.reproduce import reproduce_paper_b

    out = tmp_path_factory.mktemp("paper_b_published")
    return reproduce_paper_b(ic, out), out


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


@pytest.fixture(scope="session")
def rm_folder(tmp_path_factory):
    """A tiny Llama reward model folder with the ChatML test tokenizer (tests/tiny_models.py)."""
    import tiny_models as T

    folder = tmp_path_factory.mktemp("score-rm") / "rm"
    T.tiny("llama", num_labels=1, pad_token_id=2).save_pretrained(folder)
    T.chatml_tokenizer().save_pretrained(folder)
    return folder
