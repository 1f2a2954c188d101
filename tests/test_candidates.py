"""rmfast.scoring.candidates and vocab: reading candidate files, vocabulary views, real data in context (the
scoring of texts through the pipeline: test_pipeline.py)."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from tiny_models import chat_ids
from rmfast.scoring.candidate_files import read_candidates
from rmfast.scoring.candidates import is_wordlike, special_ids, vocab_ids
from rmfast.scoring.pipeline import decode_retokenize_scan, scan, score_texts
from rmfast.scoring.results import TextScanResult
from rmfast.errors import UserError
from rmfast.scoring.hf_path import pad_token_as, hf_scores
from rmfast.template import build_template

PROMPT = "What, in one word, is the greatest thing ever?"


# ------------------------------------------------------------------ reading files


def test_read_lines_blanks_duplicates(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("\ufeffLove\r\n\r\n  Water  \nLove\nthe universe\n".encode())
    with pytest.warns(UserWarning, match="1 duplicate"):
        with pytest.warns(UserWarning, match=r"1 candidate\(s\) had spaces around them, scored without them \('  Water  '"):
            c = read_candidates(f)  # (the stripping was silent: " ever" is another response than "ever")
    assert c.texts == ["Love", "Water", "the universe"] and c.rows == [1, 3, 5]
    assert c.source["n_blank"] == 1 and c.source["n_duplicates"] == 1 and c.source["duplicates"] == ["Love"]
    assert c.source["n_stripped"] == 1  # the BOM and the line ends are not spaces around a candidate


def test_a_notes_quotes_are_cut(tmp_path):
    """A candidate line of 1 MB with spaces around it was quoted whole in the note: a 1,000,110-character line."""
    f = tmp_path / "c.txt"
    f.write_text(" " + "word " * 200_000 + "\nLove\n")
    with pytest.warns(UserWarning, match="had spaces around them") as got:
        read_candidates(f)
    assert max(len(str(w.message)) for w in got) < 300
    assert any("word word'…" in str(w.message) for w in got)  # the cut is marked
    # a damaged Parquet of candidates (an rmfast result used as candidates) was read silently, one text another
    from rmfast.io import write_parquet

    p = tmp_path / "c.parquet"
    write_parquet(p, pd.DataFrame({"text": [f"candidate{i:04d}" for i in range(1000)]}))
    raw = bytearray(p.read_bytes())
    raw[raw.find(b"candidate0472") + 12] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="c.parquet is damaged"):
        read_candidates(p, "text")


def test_read_tables(tmp_path):
    pd.DataFrame({"id": [1, 2, 3], "name": ["NA", "null", "Water"]}).to_csv(tmp_path / "a.csv", index=False)
    assert read_candidates(tmp_path / "a.csv", "name").texts == ["NA", "null", "Water"]  # words, not missing values
    (tmp_path / "b.tsv").write_text("abandon\t-2\nabandoned\t-2\n")
    assert read_candidates(tmp_path / "b.tsv", 0, header=False).texts == ["abandon", "abandoned"]
    pd.DataFrame({"w": ["x", None, "y"]}).to_parquet(tmp_path / "c.parquet")
    with pytest.warns(UserWarning, match=r"c.parquet: 1 candidate row\(s\) with no value \(null\) left out \(rows 2;"):
        c = read_candidates(tmp_path / "c.parquet")  # a null row: left out, and said (issue 35)
    assert c.texts == ["x", "y"] and c.source["n_null"] == 1  # one column: no --column needed
    (tmp_path / "d.csv").write_text("name\nx\n\"  \"\ny\n\"\"\nz\n")  # two blank cells: rows the user wrote, said
    with pytest.warns(UserWarning, match=r"d.csv: 2 candidate row\(s\) blank left out \(rows 2, 4;"):
        c = read_candidates(tmp_path / "d.csv")
    assert c.texts == ["x", "y", "z"] and c.source["n_blank"] == 2


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


# ------------------------------------------------------------------ real data, real model


def test_an_empty_view_names_what_emptied_it():
    """No ids asked, or every id dropped by the filters that ran: the message names which (it listed every filter,
    set or not)."""
    tok = T.chatml_tokenizer()
    with pytest.raises(UserError) as e:
        vocab_ids(tok, T.VOCAB, token_ids=[])
    assert "--token-ids selects none" in e.value.cli_message() and "token_ids selects none" in str(e.value)
    with pytest.raises(UserError) as e:
        vocab_ids(tok, T.VOCAB, token_ids="0:3", wordlike=True, dedup=True)
    cli = e.value.cli_message()
    assert "the view is empty (of the 3 ids asked, --wordlike dropped 3); drop a filter" in cli, cli
    assert "--exclude-special" not in cli and "--dedup" not in cli  # filters that dropped nothing are not named


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


@pytest.mark.parametrize("alias", ["smollm2-135m-instruct", "gemma3-270m", "synthetic", "chatml"])
def test_decoded_equals_batch_decode(alias):
    """The scan's token texts: decoded() (straight to the Rust decode_batch where the tokenizer decodes as
    transformers' own) equals batch_decode on every id of real vocabularies (SmolLM2's byte-level BPE, Gemma 3's
    SentencePiece with byte fallback, 262,144 ids) and generated ones; a subclass that rewrites decoding keeps
    its own path."""
    from test_template_tail import _embedded_tokenizer

    from rmfast.bench.random_init import synthetic_tokenizer
    from rmfast.scoring.candidates import _plain_fast_decode, decoded

    tok = {"synthetic": lambda: synthetic_tokenizer(3000, bos="<s>", eos="</s>", pad="<pad>"),
           "chatml": T.chatml_tokenizer}.get(alias, lambda: _embedded_tokenizer(alias))()
    ids = range(len(tok))
    assert _plain_fast_decode(tok)
    assert decoded(tok, ids) == tok.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                                 clean_up_tokenization_spaces=False)

    plain = decoded(tok, [5, 6])

    class Shouting(type(tok)):
        def _decode(self, token_ids, **kw):
            return super()._decode(token_ids, **kw).upper()

    tok.__class__ = Shouting
    try:
        assert not _plain_fast_decode(tok)
        assert decoded(tok, [5, 6]) == [t.upper() for t in plain]
    finally:
        tok.__class__ = Shouting.__mro__[1]


def test_host_work_waits_counted():
    """HostWork's waited_s: in turn, all of a result's time (its caller waited for it); on the thread, only what
    was left when the caller asked (here none: the caller was busy for longer than the work took)."""
    import time

    from rmfast.scoring.candidates import HostWork

    class Slow:
        def get_vocab(self):
            return {"a": 0, "b": 1}

        def convert_ids_to_tokens(self, ids):
            time.sleep(0.05)
            return ["ab"[i] for i in ids]

        def batch_decode(self, rows, **kw):
            return ["ab"[r[0]] for r in rows]

    turn = HostWork(Slow(), [0, 1], overlap=False)
    assert turn.labels() == (["a", "b"], ["a", "b"]) and turn.waited_s["labels"] >= 0.05
    beside = HostWork(Slow(), [0, 1], overlap=True)
    beside.start()  # the scan's first batch is on the device
    beside._thread.join(30)  # the caller's own work (a GPU scan) outlasted the thread's (not a sleep: a loaded box)
    assert beside.labels() == (["a", "b"], ["a", "b"]) and beside.waited_s["labels"] < 0.05
    early = HostWork(Slow(), [0, 1], overlap=True)  # asked for before start(): in turn, and the thread skips it
    assert early.labels() == (["a", "b"], ["a", "b"]) and early.waited_s["labels"] >= 0.05
    early.start()
    early._thread.join()
    assert early.vocab_sha256() and early._out["labels"][0] == (["a", "b"], ["a", "b"])


def test_token_ids_repeated_in_a_file_are_scored_once_and_said(tmp_path):
    from rmfast.scoring.candidates import parse_token_ids

    f = tmp_path / "ids.txt"
    f.write_text("5\n7\n5\n9\n7\n")
    with pytest.warns(UserWarning, match=r"ids.txt: 2 repeated id\(s\) scored once \(5, 7\)"):
        assert parse_token_ids(str(f), 100).tolist() == [5, 7, 9]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no repeat: nothing said
        assert parse_token_ids("3:6", 100).tolist() == [3, 4, 5]


def test_token_ids_from_python_are_integers_never_truncated():
    """An iterable of ids: integers of any kind (and floats that are integers, as a float column holds them)
    are ids; 1.5, NaN, True or None is one line, not id 1 scored in its place."""
    import torch

    from rmfast.errors import UserError
    from rmfast.scoring.candidates import parse_token_ids

    assert parse_token_ids(np.array([4, 2], dtype=np.int32), 10).tolist() == [2, 4]
    assert parse_token_ids(torch.tensor([3, 1]), 10).tolist() == [1, 3]
    assert parse_token_ids(np.array([2.0, 4.0]), 10).tolist() == [2, 4]
    assert parse_token_ids(range(3), 10).tolist() == [0, 1, 2]
    for bad in ([1.5], np.array([0.0, 1.5]), [float("nan")], [True], [None]):
        with pytest.raises(UserError, match=r"token_ids\[\d\] = .* is not a token id: give integers"):
            parse_token_ids(bad, 10)
