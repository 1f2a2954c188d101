"""rmfast.scoring.pipeline: text candidates scored through the one pipeline — in-context ids equal to the chat
template's slices, exact scores against the plain-HF path, the logprob head, the plain-HF fallback, merging texts
and limits, the papers' decode round trip, checkpoint resume, the Parquet round trip. (Reading candidate files
and the vocabulary views: test_candidates.py; the decisions: test_plan.py.)"""

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from tiny_models import chat_ids
from rmfast.errors import UserError
from rmfast.scoring.hf_path import hf_scores, pad_token_as
from rmfast.scoring.pipeline import decode_retokenize_scan, scan, score_texts
from rmfast.scoring.results import TextScanResult
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"
TEXTS = ["Love", "The universe", "Donaudampfschiffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
         "music", "Ünïcödé 🙂 z̷͔", "Albert Einstein", "ok", "A cup of tea, with milk."]


@pytest.fixture(scope="module")
def tiny_rm(smol_tokenizer):
    return T.tiny("llama", num_labels=2, pad_token_id=smol_tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def tiny_lm(smol_tokenizer):
    return T.tiny("qwen2", "causal_lm", pad_token_id=smol_tokenizer.pad_token_id, seed=3)


# ------------------------------------------------------------------ exact ids and scores


def test_text_ids_are_chat_template_slices_and_scores_match_reference(tiny_rm, smol_tokenizer):
    tok = smol_tokenizer
    texts = TEXTS + ["Love"]
    with pytest.warns(UserWarning, match="duplicate"):
        res = score_texts(tiny_rm, tok, PROMPT, texts, head_index=1, batch_size=2, progress=False)
    assert res.texts == TEXTS and res.manifest["engine"] == "fast"
    tmpl = build_template(tok, PROMPT)
    for t, ids, n in zip(res.texts, res.token_ids, res.n_tokens):
        assert tmpl.sequence(ids) == chat_ids(tok, PROMPT, t) and n == len(ids)
    assert res.n_tokens.max() > 10  # multi-token candidates really are multi-token
    ref = hf_scores(tiny_rm, tmpl, res.token_ids, head="score", head_index=1).numpy()
    np.testing.assert_allclose(res.scores, ref, rtol=1e-5, atol=1e-5)
    with pad_token_as(tiny_rm, -1):  # straight from the whole conversation, no template split at all
        direct = [tiny_rm(input_ids=torch.tensor([chat_ids(tok, PROMPT, t)])).logits[0, 1].item() for t in TEXTS[:3]]
    np.testing.assert_allclose(res.scores[:3], direct, rtol=1e-5, atol=1e-5)
    df = res.to_pandas()
    assert list(df.columns) == ["text", "n_tokens", "score", "rank", "token_ids"] and df["rank"].min() == 1


def test_logprob_head_texts(tiny_lm, smol_tokenizer):
    res = score_texts(tiny_lm, smol_tokenizer, PROMPT, TEXTS, progress=False)
    assert res.manifest["head"] == "logprob"
    tmpl = build_template(smol_tokenizer, PROMPT)
    ref = hf_scores(tiny_lm, tmpl, res.token_ids, head="logprob").numpy()
    np.testing.assert_allclose(res.scores, ref, rtol=1e-4, atol=1e-3)


def test_off_fast_path_falls_back_with_warning(smol_tokenizer):
    cfg = __import__("transformers").GPT2Config(vocab_size=T.VOCAB, n_embd=32, n_layer=2, n_head=2, num_labels=1,
                                                pad_token_id=smol_tokenizer.pad_token_id)
    torch.manual_seed(0)
    m = __import__("transformers").GPT2ForSequenceClassification(cfg).eval()
    with pytest.warns(UserWarning, match="not on the fast path"):
        res = score_texts(m, smol_tokenizer, PROMPT, TEXTS[:4], progress=False)
    assert res.manifest["engine"] == "hf"
    tmpl = build_template(smol_tokenizer, PROMPT)
    with pad_token_as(m, -1):
        direct = [m(input_ids=torch.tensor([chat_ids(smol_tokenizer, PROMPT, t)])).logits[0, 0].item() for t in TEXTS[:4]]
    np.testing.assert_allclose(res.scores, direct, rtol=1e-5, atol=1e-5)
    assert tmpl.sequence(res.token_ids[1]) == chat_ids(smol_tokenizer, PROMPT, TEXTS[1])


def test_merging_text_and_limits(tiny_rm, smol_tokenizer):
    with pytest.raises(UserError, match="compat='decode-retokenize'"):
        score_texts(tiny_rm, smol_tokenizer, PROMPT, ["  two leading spaces"], progress=False)
    with pytest.raises(UserError, match=r"candidate 2 .* tokens long, over max_tokens 3"):
        score_texts(tiny_rm, smol_tokenizer, PROMPT, ["Love", "A cup of tea, with milk."], max_tokens=3, progress=False)
    with pytest.raises(UserError, match="empty"):
        score_texts(tiny_rm, smol_tokenizer, PROMPT, ["Love", "  "], progress=False)


def test_decode_retokenize_compat(tiny_rm, smol_tokenizer):
    tok = smol_tokenizer
    ids = [197, 198, 216, 111, 459, 100, 0, 30200]  # \t, \n, ' ' merge with the header; byte pieces decode to U+FFFD
    with pytest.warns(UserWarning, match="merge with the template"):
        res = decode_retokenize_scan(tiny_rm, tok, PROMPT, ids, progress=False)
    assert res.manifest["compat"] == "decode-retokenize" and res.manifest["rows_not_split"] == 3
    df = res.to_pandas()
    assert df["token_id"].tolist() == ids
    # every row is the score of the whole re-tokenized conversation of decode([id])
    with pad_token_as(tiny_rm, -1):
        direct = [tiny_rm(input_ids=torch.tensor([chat_ids(tok, PROMPT, tok.decode([i]))])).logits[0, 0].item() for i in ids]
    np.testing.assert_allclose(res.scores, direct, rtol=1e-5, atol=1e-5)
    # where decode -> re-tokenize gives the id back, compat and the default agree exactly
    plain = scan(tiny_rm, tok, PROMPT, token_ids=ids, progress=False).to_pandas().set_index("token_id")["score"]
    same = [i for i, r in zip(ids, res.token_ids) if r == [i]]
    assert set(same) == {100, 0, 30200}
    np.testing.assert_allclose(df.set_index("token_id").loc[same, "score"], plain.loc[same], rtol=1e-6, atol=1e-6)
    differ = [i for i, r in zip(ids, res.token_ids) if r != [i]]
    assert 111 in differ and 197 in differ  # U+FFFD re-tokenizes to another id; "\t" merges with "\n"


def test_text_checkpoint_resume(tiny_rm, smol_tokenizer, tmp_path, monkeypatch):
    from rmfast.fast.engine import Engine

    texts = [f"item number {i}" if i % 3 else f"w{i}" for i in range(40)]
    clean = score_texts(tiny_rm, smol_tokenizer, PROMPT, texts, batch_size=4, progress=False)
    ck = tmp_path / "ck.npz"
    orig, calls = Engine.score, {"n": 0}

    def flaky(self, responses):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return orig(self, responses)

    monkeypatch.setattr(Engine, "score", flaky)
    with pytest.raises(KeyboardInterrupt):
        score_texts(tiny_rm, smol_tokenizer, PROMPT, texts, batch_size=4, progress=False, checkpoint=ck)
    monkeypatch.setattr(Engine, "score", orig)
    assert ck.exists()
    res = score_texts(tiny_rm, smol_tokenizer, PROMPT, texts, batch_size=4, progress=False, checkpoint=ck)
    assert res.manifest["resumed_candidates"] == 12 and not ck.exists()
    # bit-identical: same process and threads, and the rerun resumes each length group on the batch
    # boundary where the first run stopped, so every batch holds the rows it held in the clean run
    np.testing.assert_array_equal(res.scores, clean.scores)


def test_parquet_roundtrip(tiny_rm, smol_tokenizer, tmp_path):
    res = score_texts(tiny_rm, smol_tokenizer, PROMPT, TEXTS[:3], progress=False)
    p = res.to_parquet(tmp_path / "t.parquet")
    back = TextScanResult.from_parquet(p)
    assert back.texts == res.texts and back.token_ids == res.token_ids and back.manifest["prompt"] == PROMPT
    with pytest.raises(UserError, match="overwrite=True"):
        res.to_parquet(p)


def test_host_work_beside_the_scan_changes_nothing(tiny_rm, smol_tokenizer, monkeypatch):
    """The plan's "host_overlap" (on a GPU: the vocabulary hash and each id's piece and text on a host thread while
    the device scores) gives the same result as doing them in turn; the manifest records the decision and the
    set-up / waited times; an error in the thread is raised where its result is taken, not lost."""
    from rmfast.scoring import candidates, decisions

    kw = dict(token_ids=range(40, 120), template="User: {prompt}\nAssistant: {response}", progress=False)
    plain = scan(tiny_rm, smol_tokenizer, "Best?", **kw)
    assert plain.manifest["decisions"]["host_overlap"]["value"] is False  # the CPU: in turn
    real = decisions.decide

    def overlap(*a, **k):
        d = real(*a, **k)
        d.host_overlap = True
        return d

    monkeypatch.setattr("rmfast.scoring.pipeline.decide", overlap)
    started = []
    monkeypatch.setattr(candidates.HostWork, "_run", lambda self, f=candidates.HostWork._run: started.append(1) or f(self))
    over = scan(tiny_rm, smol_tokenizer, "Best?", **kw)
    assert started == [1]
    assert np.array_equal(over.scores, plain.scores) and over.tokens == plain.tokens and over.texts == plain.texts
    assert over.manifest["vocab_sha256"] == plain.manifest["vocab_sha256"]
    for m in (plain.manifest, over.manifest):
        parts = m["setup_s"] + m["scan_s"] + m["labels_wait_s"]  # each rounded to 1 ms, as the wall is
        assert 0 <= m["setup_s"] and parts <= m["wall_s"] + 0.004
    assert plain.manifest["labels_wait_s"] >= 0 and over.manifest["labels_wait_s"] >= 0

    class Broken(type(smol_tokenizer)):
        def convert_ids_to_tokens(self, ids, skip_special_tokens=False):
            raise RuntimeError("broken pieces")

    smol_tokenizer.__class__, cls = Broken, smol_tokenizer.__class__
    try:
        with pytest.raises(RuntimeError, match="broken pieces"):
            scan(tiny_rm, smol_tokenizer, "Best?", **kw)
    finally:
        smol_tokenizer.__class__ = cls


def test_a_multi_output_head_says_which_output_it_reads(smol_tokenizer):
    """A 2- or 3-label classifier was read at output 0 without a word (a sentiment model's "negative" logit would
    rank its best responses last): one note names the output and its label, and the head's reason records it; a
    one-output reward head says nothing."""
    import warnings as w

    from rmfast.errors import UserNote
    from rmfast.scoring.pipeline import Selection, run_scan

    m = T.tiny("llama", num_labels=3, pad_token_id=smol_tokenizer.pad_token_id)
    m.config.id2label = {0: "negative", 1: "neutral", 2: "positive"}
    with pytest.warns(UserNote, match=r"the score head has 3 outputs; output 2 \('positive'\) is read as the reward") as got:
        res, *_ = run_scan(m.to(torch.bfloat16), smol_tokenizer, PROMPT, Selection(token_ids="100:104"), head_index=2,
                           progress=False)
    assert sum("score head has 3 outputs" in str(g.message) for g in got) == 1  # once, not again for the bf16 audit
    assert res.manifest["bf16_audit"]["n"] == 4
    assert res.manifest["decisions"]["head"]["reason"].endswith("; output 2 ('positive') of the head's 3")
    one = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id)
    with w.catch_warnings(record=True) as got:
        w.simplefilter("always")
        res = scan(one, smol_tokenizer, PROMPT, token_ids="100:104", progress=False)
    assert not [g for g in got if "outputs" in str(g.message)] and "output" not in res.manifest["decisions"]["head"]["reason"]
