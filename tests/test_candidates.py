"""Text candidates: reading files, vocabulary views, in-context ids, exact scores, compat mode, real data."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from rmfast.scoring.candidates import read_candidates
from rmfast.scoring.pipeline import decode_retokenize_scan, scan, score_texts
from rmfast.scoring.results import TextScanResult
from rmfast.scoring.vocab import is_wordlike, special_ids, vocab_ids
from rmfast.errors import UserError
from rmfast.scoring.hf_path import pad_token_as, hf_scores
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"
TEXTS = ["Love", "The universe", "Donaudampfschiffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
         "music", "Ünïcödé 🙂 z̷͔", "Albert Einstein", "ok", "A cup of tea, with milk."]


def chat_ids(tok, prompt, text):
    out = tok.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": text}],
                                  tokenize=True, return_dict=False)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def tiny_rm(smol_tokenizer):
    return T.tiny("llama", num_labels=2, pad_token_id=smol_tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def tiny_lm(smol_tokenizer):
    return T.tiny("qwen2", "causal_lm", pad_token_id=smol_tokenizer.pad_token_id, seed=3)


# ------------------------------------------------------------------ reading files


def test_read_lines_blanks_duplicates(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("\ufeffLove\r\n\r\n  Water  \nLove\nthe universe\n".encode())
    with pytest.warns(UserWarning, match="1 duplicate"):
        c = read_candidates(f)
    assert c.texts == ["Love", "Water", "the universe"] and c.rows == [1, 3, 5]
    assert c.source["n_blank"] == 1 and c.source["n_duplicates"] == 1 and c.source["duplicates"] == ["Love"]


def test_read_tables(tmp_path):
    pd.DataFrame({"id": [1, 2, 3], "name": ["NA", "null", "Water"]}).to_csv(tmp_path / "a.csv", index=False)
    assert read_candidates(tmp_path / "a.csv", "name").texts == ["NA", "null", "Water"]  # words, not missing values
    (tmp_path / "b.tsv").write_text("abandon\t-2\nabandoned\t-2\n")
    assert read_candidates(tmp_path / "b.tsv", 0, header=False).texts == ["abandon", "abandoned"]
    pd.DataFrame({"w": ["x", None, "y"]}).to_parquet(tmp_path / "c.parquet")
    with pytest.warns(UserWarning, match=r"c.parquet: 1 candidate row\(s\) with no value \(null\) left out \(rows 2;"):
        c = read_candidates(tmp_path / "c.parquet")  # a null row: left out, and said (issue 35)
    assert c.texts == ["x", "y"] and c.source["n_null"] == 1  # one column: no --column needed


@pytest.mark.parametrize("case", ["missing", "dir", "empty", "blank", "binary", "latin1", "multi-col", "bad-col",
                                  "col-on-txt", "bad-parquet"])
def test_read_bad_files(case, tmp_path):
    f = tmp_path / "f.txt"
    col = None
    if case == "dir":
        f = tmp_path
    elif case == "empty":
        f.write_text("")
    elif case == "blank":
        f.write_text("\n  \n\t\n")
    elif case == "binary":
        f.write_bytes(b"ab\x00cd\n")
    elif case == "latin1":
        f.write_bytes("caf\xe9\n".encode("latin-1"))
    elif case in ("multi-col", "bad-col"):
        f = tmp_path / "f.csv"
        pd.DataFrame({"a": ["x"], "b": ["y"]}).to_csv(f, index=False)
        col = "nope" if case == "bad-col" else None
    elif case == "col-on-txt":
        f.write_text("x\n")
        col = "name"
    elif case == "bad-parquet":
        f = tmp_path / "f.parquet"
        f.write_text("not parquet")
    with pytest.raises(UserError) as e:
        read_candidates(f, col)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------ vocabulary views


def test_is_wordlike():
    assert [is_wordlike(t) for t in [" love", "Love", "été", " 42", "it's", "  x", "", "\u2581x"]] == \
        [True, True, True, False, False, False, False, False]


def test_vocab_views(smol_tokenizer):
    tok = smol_tokenizer
    n = len(tok)
    ids, rep = vocab_ids(tok, n, exclude_special=True)
    assert not set(ids.tolist()) & special_ids(tok) and rep["dropped_special"] == len(special_ids(tok))
    ids, rep = vocab_ids(tok, n, token_ids="0:5000", wordlike=True)
    texts = tok.batch_decode([[int(i)] for i in ids], clean_up_tokenization_spaces=False)
    assert all(t.lstrip(" ").isalpha() and not t.startswith("  ") for t in texts)
    assert 1000 < ids.size < 5000 and rep["dropped_not_wordlike"] == 5000 - ids.size
    # de-duplication: every string that occurs more than once goes, all of its ids
    all_ids, rep = vocab_ids(tok, n, dedup=True)
    dec = tok.batch_decode([[i] for i in range(n)], clean_up_tokenization_spaces=False)
    counts = pd.Series(dec).value_counts()
    assert set(all_ids.tolist()) == {i for i, t in enumerate(dec) if counts[t] == 1}
    assert rep["dropped_duplicate_text"] == int(counts[counts > 1].sum()) > 0
    with pytest.raises(UserError, match="empty"):
        vocab_ids(tok, n, token_ids=[0, 1, 2], exclude_special=True)


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
    with pytest.raises(UserError, match="--compat decode-retokenize"):
        score_texts(tiny_rm, smol_tokenizer, PROMPT, ["  two leading spaces"], progress=False)
    with pytest.raises(UserError, match=r"candidate 2 .* tokens long, over --max-tokens 3"):
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
    with pytest.raises(UserError, match="--overwrite"):
        res.to_parquet(p)


# ------------------------------------------------------------------ real data, real model


def test_eloeverything_and_lexicons_on_smollm2(smollm2, shared_data):
    tok, model = smollm2.tokenizer, smollm2.model
    files = sorted((shared_data / "eloeverything").glob("*.csv"))
    if not files:
        pytest.skip("no EloEverything CSVs")
    elo = read_candidates(files[0], "name")
    assert len(elo.texts) == 7530 and elo.source["n_duplicates"] == 0
    tmpl = build_template(tok, PROMPT)
    from rmfast.scoring.candidates import tokenize_in_context

    rows = tokenize_in_context(tok, tmpl, elo.texts)  # all 7,530 in context: none merges with the template
    lens = np.array([len(r.ids) for r in rows])
    assert lens.min() >= 1 and lens.max() > 20
    lex = shared_data / "lexicons"
    got = {}
    for name, col, kw in (("big2_nouns.csv", "token_decoded", {}), ("mfd2.0.dicx", "DicTerm", {}),
                          ("AFINN-111.txt", "0", {"fmt": "tsv", "header": False})):
        if (lex / name).exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got[name] = read_candidates(lex / name, col, **kw).texts
    # a few items across lengths (and lexicon words): exact against the plain-HF path in fp32, and
    # ids = the chat template's own slice of the whole conversation
    order = np.argsort(lens, kind="stable")
    pick = [int(order[0]), int(order[len(order) // 2]), int(order[int(len(order) * 0.95)]),
            int(np.flatnonzero(lens == 12)[0]) if (lens == 12).any() else int(order[-100])]
    sample = [elo.texts[i] for i in pick] + [ws[1] for ws in got.values()]
    res = score_texts(model, tok, PROMPT, sample, progress=False)
    for t, ids in zip(sample, res.token_ids):
        assert tmpl.sequence(ids) == chat_ids(tok, PROMPT, t)
    assert res.n_tokens.max() >= 5
    ref = hf_scores(model, tmpl, res.token_ids, head="logprob").numpy()
    np.testing.assert_allclose(res.scores, ref, rtol=1e-4, atol=2e-3)
    if "AFINN-111.txt" in got:
        assert got["AFINN-111.txt"][0] == "abandon" and len(got["AFINN-111.txt"]) > 2400
