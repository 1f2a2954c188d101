"""--compat authors: the published scoring loop, each of its three quirks planted on a tiny model.

The model's config pad (1, ``<|im_end|>``) differs from the tokenizer's pad (2, ``<|pad|>``) and the
chat template renders a BOS, which the tokenizer adds again: every quirk fires. Each case is checked
against ``their_loop`` below, a straightforward re-implementation of paper A's
``generate_reward_model_scores.py`` loop written here (not rmfast's code), and against a planted
answer computed directly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rmfast.scoring.candidates import render_text
from rmfast.scoring.compat import authors_batch_size, authors_batches, authors_encode, hf_read_positions
from rmfast.errors import UserError
from rmfast.scoring.pipeline import Selection, run_scan, score_texts
from rmfast.template import build_template

from tiny_models import CHATML, tiny

PROMPT = "What is the best thing?"
N_TOK = 300  # tokenizer ids: 4 specials, 256 bytes, 40 fillers
BOS_CHATML = "{{ bos_token }}" + CHATML  # a template that renders the BOS itself (as Llama 3's and Gemma's do)


def _tokenizer(template=BOS_CHATML):
    from rmfast.bench.random_init import synthetic_tokenizer

    return synthetic_tokenizer(N_TOK, bos="<|endoftext|>", eos="<|im_end|>", pad="<|pad|>",
                               extra=("<|im_start|>",), chat_template=template)


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


@pytest.fixture(scope="module")
def rm():
    return tiny("llama", pad_token_id=1, num_labels=1, seed=3)  # config pad <|im_end|> != tokenizer pad <|pad|>


def their_loop(model, tokenizer, prompt, token_ids, batch_size):
    """Paper A's loop, re-implemented plainly: consecutive ids, decode, render as text, tokenize with
    specials and padding, one forward per batch, the model's own pooling."""
    scores = []
    for i in range(0, len(token_ids), batch_size):
        convs = [tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                                {"role": "assistant", "content": tokenizer.decode([t])}], tokenize=False)
                 for t in token_ids[i:i + batch_size]]
        enc = tokenizer(convs, return_tensors="pt", padding=True, truncation=True)
        with torch.no_grad():
            scores.extend(model(**enc).logits.squeeze(-1).tolist())
    return np.asarray(scores, dtype=np.float32)


def _scan(rm, tok, ids, bs, compat="authors"):
    res, _ = run_scan(rm, tok, PROMPT, Selection(token_ids=ids, compat=compat), batch_size=bs, progress=False, audit=0)
    return res


def test_whole_vocabulary_equals_their_loop(rm, tok):
    res = _scan(rm, tok, f"0:{N_TOK}", 16)
    want = their_loop(rm, tok, PROMPT, list(range(N_TOK)), 16)
    np.testing.assert_array_equal(res.scores, want)  # same rows, same batches, same padding: bit for bit
    ca = res.manifest["compat_authors"]
    assert ca["n_double_bos"] == N_TOK and ca["config_pad_id"] == 1 and ca["tokenizer_pad_id"] == 2
    assert ca["n_pad_reads"] > 0 and ca["batch_size"] == 16
    from rmfast.cli.scan import _batch_said

    assert res.manifest["rows_run"] == {"16": 18, "12": 1}  # 300 ids: the published last batch holds 12
    assert _batch_said(res.manifest) == ", batch 16; ran 18 batches of 16 rows, 1 of 12 rows"


def test_subset_is_padded_as_in_the_full_run(rm, tok):
    """A range that cuts the published batches: each id is still padded with its full batch."""
    full = their_loop(rm, tok, PROMPT, list(range(N_TOK)), 16)
    res = _scan(rm, tok, "130:150", 16)
    np.testing.assert_array_equal(res.scores, full[130:150])
    # the rows that ran: both published batches whole (the summary had no rows_run for --compat authors)
    assert res.manifest["rows_run"] == {"16": 2}


def test_pad_reads_are_the_shorter_rows(rm, tok):
    """Planted: right padding with a pad the config does not know: exactly the rows shorter than their
    batch's longest are read at a pad (counted here from the lengths alone)."""
    ids = list(range(N_TOK))
    lens = np.array([len(tok(render_text(tok, build_template(tok, PROMPT), tok.decode([t])))["input_ids"]) for t in ids])
    batch_max = np.repeat([lens[i:i + 16].max() for i in range(0, N_TOK, 16)], 16)[:N_TOK]
    res = _scan(rm, tok, f"0:{N_TOK}", 16)
    assert sorted(res.manifest["compat_authors"]["pad_reads"]) == [t for t in ids if lens[t] < batch_max[t]]
    assert res.manifest["compat_authors"]["n_early_reads"] == 0


def test_pad_read_score_is_the_score_at_the_pad(rm, tok):
    """Planted: a short and a long response in one batch; the short row's reward is the classifier's
    output at the last pad position of its padded row (computed from the hidden states)."""
    tmpl = build_template(tok, PROMPT)
    res = score_texts(rm, tok, PROMPT, ["ab", "a much longer answer"], compat="authors", batch_size=2, progress=False)
    convs = [render_text(tok, tmpl, t) for t in ["ab", "a much longer answer"]]
    enc = authors_encode(tok, convs)
    with torch.no_grad():
        h = rm.model(**enc).last_hidden_state  # (2, L, D)
        per_pos = rm.score(h)[..., 0]  # (2, L)
    assert int(enc["attention_mask"][0].sum()) < enc["input_ids"].shape[1]  # row 0 is padded
    np.testing.assert_allclose(res.scores, per_pos[:, -1].numpy(), rtol=0, atol=0)
    assert res.manifest["compat_authors"]["pad_reads"] == [0]


def test_double_bos_planted(rm, tok):
    """Batch 1 (no padding): the score is that of the templated sequence with a second BOS in front."""
    tmpl = build_template(tok, PROMPT)
    assert tmpl.prefix_ids[0] == tok.bos_token_id
    res = _scan(rm, tok, "100:110", 1)
    seqs = [[tok.bos_token_id, *tmpl.sequence(tok(tok.decode([t]), add_special_tokens=False)["input_ids"])]
            for t in range(100, 110)]
    with torch.no_grad():
        want = np.array([rm(input_ids=torch.tensor([s])).logits[0, 0].item() for s in seqs], dtype=np.float32)
    np.testing.assert_array_equal(res.scores, want)
    assert res.manifest["compat_authors"]["n_double_bos"] == 10 and res.manifest["compat_authors"]["n_pad_reads"] == 0


def test_decode_round_trip_only(rm):
    """No BOS in the template and no padding (batch 1): authors is the decode round trip, decode-retokenize."""
    tok = _tokenizer(CHATML)
    ids = "120:200"  # byte tokens >= 0x80 decode to U+FFFD and re-tokenize to three other ids
    a = _scan(rm, tok, ids, 1)
    # tokenizer(text) still prepends BOS (add_special_tokens): one BOS, where decode-retokenize has none
    assert a.manifest["compat_authors"]["n_double_bos"] == 0
    tmpl = build_template(tok, PROMPT)
    rows = [[tok.bos_token_id, *tmpl.sequence(r)] for r in a.token_ids]
    with torch.no_grad():
        want = np.array([rm(input_ids=torch.tensor([s])).logits[0, 0].item() for s in rows], dtype=np.float32)
    np.testing.assert_array_equal(a.scores, want)
    changed = [i for i, r in zip(range(120, 200), a.token_ids) if r != [i]]
    assert changed  # the planted round trip really changes ids


def test_equal_pads_read_no_pad(tok):
    """Config pad == tokenizer pad: no pad reads, and the padded scores agree with unpadded ones to rounding."""
    rm2 = tiny("llama", pad_token_id=2, num_labels=1, seed=3)
    a = _scan(rm2, tok, "0:64", 16)
    b = _scan(rm2, tok, "0:64", 1)
    assert a.manifest["compat_authors"]["n_pad_reads"] == 0 and a.manifest["compat_authors"]["n_early_reads"] == 0
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)


def test_texts_batched_in_file_order(rm, tok):
    texts = ["love", "a", "the universe and everything", "hope", "x y"]
    res = score_texts(rm, tok, PROMPT, texts, compat="authors", batch_size=2, progress=False)
    tmpl = build_template(tok, PROMPT)
    want = []
    for i in range(0, 5, 2):
        enc = tok([render_text(tok, tmpl, t) for t in texts[i:i + 2]], return_tensors="pt", padding=True)
        with torch.no_grad():
            want.extend(rm(**enc).logits[:, 0].tolist())
    np.testing.assert_array_equal(res.scores, np.asarray(want, np.float32))


def test_read_rule_matches_hf(rm, tok):
    """hf_read_positions is the installed transformers' pooling: the score at that position is HF's."""
    tmpl = build_template(tok, PROMPT)
    enc = authors_encode(tok, [render_text(tok, tmpl, t) for t in ["a", "bbbbbbbb", "cc"]])
    with torch.no_grad():
        per_pos = rm.score(rm.model(**enc).last_hidden_state)[..., 0]
        pooled = rm(**enc).logits[:, 0]
    read = hf_read_positions(enc["input_ids"], rm.config.pad_token_id)
    torch.testing.assert_close(per_pos[torch.arange(3), read], pooled, rtol=0, atol=0)


def test_batches_and_sizes():
    members, where = authors_batches(3, 2)
    assert members == [[("row", 0), ("row", 1)], [("row", 2)]] and where == [(0, 0), (0, 1), (1, 0)]
    assert authors_batch_size("auto", "R-Gem-2B") == (256, "the papers' configuration for this model")
    assert authors_batch_size("auto", "someone/else")[0] == 32
    assert authors_batch_size(8, None) == (8, "--batch-size")
    with pytest.raises(UserError, match="batch_size"):
        authors_batch_size("0", None)


def test_refusals(rm, tok):
    lm = tiny("llama", kind="causal_lm", seed=1)
    with pytest.raises(UserError, match="score head"):
        score_texts(lm, tok, PROMPT, ["a"], compat="authors", progress=False)
    with pytest.raises(UserError, match="engine='fast'"):
        score_texts(rm, tok, PROMPT, ["a"], compat="authors", engine="fast", progress=False)
    with pytest.raises(UserError, match="one process"):
        run_scan(rm, tok, PROMPT, Selection(texts=["a", "b"], compat="authors"), rows=lambda n: np.arange(n),
                 progress=False)
    rm_nopad = tiny("llama", pad_token_id=None, num_labels=1, seed=3)
    with pytest.raises(UserError, match="pad_token_id"):
        score_texts(rm_nopad, tok, PROMPT, ["a", "b"], compat="authors", batch_size=2, progress=False)
    ok = score_texts(rm_nopad, tok, PROMPT, ["a", "b"], compat="authors", batch_size=1, progress=False)
    assert np.isfinite(ok.scores).all()


def test_cli_scan_compat_authors(rm, tok, tmp_path, capsys):
    """`rmfast scan --compat authors` beside the default: the same ids, the counts printed and in the manifest."""
    import json

    import pandas as pd

    from rmfast.cli import main

    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    common = ["scan", str(tmp_path / "rm"), "--prompt", PROMPT, "--token-ids", "100:140", "--dtype", "float32",
              "--device", "cpu", "--no-progress", "--top", "0"]
    assert main([*common, "--out", str(tmp_path / "default.parquet")]) == 0
    assert main([*common, "--compat", "authors", "--batch-size", "16", "--out", str(tmp_path / "authors.parquet")]) == 0
    printed = capsys.readouterr().out
    assert "--compat authors (batch 16, right padding, tokenizer pad 2, config pad 1): 40 rows with a second BOS" in printed
    a = pd.read_parquet(tmp_path / "authors.parquet")
    d = pd.read_parquet(tmp_path / "default.parquet")
    assert a["token_id"].tolist() == d["token_id"].tolist() == list(range(100, 140))
    np.testing.assert_array_equal(a["score"].to_numpy(), their_loop(rm, tok, PROMPT, list(range(N_TOK)), 16)[100:140])
    m = json.loads((tmp_path / "authors.parquet.json").read_text())
    assert m["compat"] == "authors" and m["engine"] == "hf" and m["compat_authors"]["n_double_bos"] == 40
