"""implicit: log ratio / MWLR math, the shared-vocabulary join (on the two real tokenizers), sweeps, CLI."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from rmfast.cli import main
from rmfast.errors import UserError
from rmfast.implicit import (collapse, dictionary_coverage, dictionary_summary, implicit, implicit_sweep, join_shared,
                             read_prompts, reward_terms)
from rmfast.logprobs import logprobs, vocab_strings
from rmfast.scoring.results import ScanResult

PROMPT = "What, in one word, is the greatest thing ever?"


def sr(texts, logp, ids=None, prompt=PROMPT):
    ids = np.arange(len(texts)) if ids is None else np.asarray(ids)
    return ScanResult(ids.astype(np.int64), np.asarray(logp, dtype=np.float32), list(texts), list(texts),
                      {"prompt": prompt, "head": "next_token_logprob"})


# ------------------------------------------------------------------ math


def test_reward_terms_hand_computed():
    lr, mw = reward_terms(np.log([0.5, 0.1, 0.3]), np.log([0.25, 0.4, 0.3]))
    np.testing.assert_allclose(lr, [math.log(2), math.log(0.25), 0.0], atol=1e-12)
    # MWLR = ½(p_a + p_b)(log p_a − log p_b)
    np.testing.assert_allclose(mw, [0.5 * 0.75 * 0.6931471805599453, 0.5 * 0.5 * -1.3862943611198906, 0.0],
                               atol=1e-12)


def test_join_keeps_highest_and_counts():
    a = sr(["x", "x", "y", "z", "\ufffd", "\ufffd"], np.log([0.1, 0.4, 0.2, 0.1, 0.05, 0.15]))
    b = sr(["x", "y", "y", "w"], np.log([0.5, 0.05, 0.4, 0.05]))
    t, c = join_shared(a, b)
    # the U+FFFD byte pieces are no string to compare: left out, counted (they had been one joined key)
    assert c == {"join": "text", "agg": "max", "tokens_a": 6, "tokens_b": 4, "strings_a": 3, "strings_b": 3,
                 "collapsed_a": 1, "collapsed_b": 1, "shared": 2, "dropped_a": 1, "dropped_b": 1,
                 "nonfinite_a": 0, "nonfinite_b": 0, "unreadable_a": 2, "unreadable_b": 0}
    t = t.set_index("text")
    assert t.loc["x", "token_id_a"] == 1 and t.loc["y", "token_id_b"] == 2  # the most probable token
    np.testing.assert_allclose(t.loc["x", ["logp_a", "logp_b"]].astype(float), np.log([0.4, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(t.loc["x", "log_ratio"], math.log(0.4 / 0.5), rtol=1e-6)
    np.testing.assert_allclose(t.loc["y", "mwlr"], 0.5 * (0.2 + 0.4) * math.log(0.2 / 0.4), rtol=1e-6)
    # ranks within the shared strings, 1 = highest
    assert t.loc["x", "rank_log_ratio"] == 1 and t.loc["y", "rank_log_ratio"] == 2
    assert t.loc["x", "rank_a"] == 1 and t.loc["x", "n_tokens_a"] == 2


def test_nonfinite_log_probs_are_counted_and_said():
    """NaN and infinite log-probs were dropped without a word (the counts stopped adding up, NaN rows counted as
    blank, a word took a weaker spelling's value silently)."""
    from rmfast.errors import UserNote

    a = sr(["That", " that", "x", " ", "\ufffd", " "], np.array([np.nan, -2.0, -1.0, -3.0, np.nan, np.inf]))
    b = sr(["that", "x"], np.log([0.5, 0.5]))
    with pytest.warns(UserNote, match="3 of model a's log-probabilities are NaN or infinite"):
        t, c = join_shared(a, b, join="word")
    # each left-out token counted once (a NaN byte piece, an infinite blank had been counted twice)
    assert c["nonfinite_a"] == 3 and c["blank_a"] == 1 and c["unreadable_a"] == 0 and c["nonfinite_b"] == 0
    assert c["tokens_a"] == c["strings_a"] + c["collapsed_a"] + c["nonfinite_a"] + c["blank_a"] + c["unreadable_a"]


def test_logsumexp_and_word_join():
    a = sr(["Love", " love", " ", "hate"], np.log([0.3, 0.1, 0.2, 0.4]))
    c = collapse(a, join="word").set_index("key")
    assert "" not in c.index and c.loc["love", "token_id"] == 0 and c.loc["love", "n_tokens"] == 2
    np.testing.assert_allclose(c.loc["love", "logp"], math.log(0.3), rtol=1e-6)
    c2 = collapse(a, join="word", agg="logsumexp").set_index("key")
    np.testing.assert_allclose(c2.loc["love", "logp"], math.log(0.4), rtol=1e-6)
    np.testing.assert_allclose(c2.loc["hate", "logp"], math.log(0.4), rtol=1e-6)
    _, counts = join_shared(a, sr(["LOVE"], [0.0]), join="word")
    assert counts["blank_a"] == 1 and counts["shared"] == 1
    with pytest.raises(UserError, match="share no"):
        join_shared(a, sr(["zzz"], [0.0]))
    with pytest.raises(UserError, match="join"):
        collapse(a, join="id")


# ------------------------------------------------------------------ the two real tokenizers


@pytest.fixture(scope="module")
def gemma_tokenizer():
    """Gemma 3's tokenizer only, from the converted cache (a first run converts once, ~2 min)."""
    from transformers import AutoTokenizer

    from rmfast.loading import sources
    from rmfast.loading.loader import cache_root, convert_gguf

    try:
        cache = cache_root()
        folder = convert_gguf(sources.embedded("gemma3-270m").gguf_path(cache), cache)
    except Exception as e:
        pytest.skip(f"embedded Gemma 3 unavailable: {e}")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def fake_scan(tok, seed):
    ids = np.arange(len(tok))
    tokens, texts = vocab_strings(tok, ids)
    scores = torch.log_softmax(torch.randn(len(ids), generator=torch.Generator().manual_seed(seed)) * 3, -1)
    return ScanResult(ids, scores.numpy(), tokens, texts, {"prompt": PROMPT})


def test_shared_vocabulary_two_real_tokenizers(smol_tokenizer, gemma_tokenizer):
    a, b = fake_scan(smol_tokenizer, 0), fake_scan(gemma_tokenizer, 1)
    assert len(a.texts) == 49152 and len(b.texts) == 262144
    best = []
    for r in (a, b):  # independent: a plain dict of the highest log-prob per decoded string
        d = {}
        for t, s in zip(r.texts, r.scores.tolist()):
            if "\ufffd" in t:  # byte pieces: no string to compare (left out of the join, counted)
                continue
            if t not in d or s > d[t]:
                d[t] = s
        best.append(d)
    shared = set(best[0]) & set(best[1])
    t, c = join_shared(a, b)
    assert c["shared"] == len(shared) == len(t) and set(t["text"]) == shared
    assert c["strings_a"] == len(best[0]) and c["strings_b"] == len(best[1])
    assert c["dropped_a"] == len(best[0]) - len(shared) and c["dropped_b"] == len(best[1]) - len(shared)
    assert c["collapsed_a"] == 49152 - len(best[0]) - c["unreadable_a"] and c["unreadable_a"] > 0  # (all 314: byte pieces)
    assert c["collapsed_b"] == 262144 - len(best[1]) - c["unreadable_b"] > 0
    assert 40_000 < c["shared"] < 49_152
    tt = t.set_index("text")
    assert not any("\ufffd" in x for x in tt.index)
    for s in (" love", "love", " the", "\n"):
        assert s in tt.index, s
        assert tt.loc[s, "logp_a"] == pytest.approx(best[0][s], abs=1e-6)
        assert tt.loc[s, "logp_b"] == pytest.approx(best[1][s], abs=1e-6)
        assert smol_tokenizer.decode([int(tt.loc[s, "token_id_a"])]) == s
        assert gemma_tokenizer.decode([int(tt.loc[s, "token_id_b"])]) == s
    assert "<|im_start|>" not in tt.index and "<start_of_turn>" not in tt.index  # each model's own specials
    np.testing.assert_allclose(t["log_ratio"], t["logp_a"] - t["logp_b"], atol=1e-12)
    # word join: "Love", " love", " Love" ... meet under one key
    tw, cw = join_shared(a, b, join="word")
    assert cw["shared"] < c["shared"] and tw.set_index("text").loc["love", "n_tokens_a"] >= 3


def test_big2_coverage_real_tokenizers(smol_tokenizer, gemma_tokenizer, shared_data):
    from rmfast.analysis.data.lexicons import load_dictionary

    cov = dictionary_coverage(load_dictionary(shared_data / "lexicons" / "big2_nouns.csv"),
                              {"smol": smol_tokenizer, "gemma": gemma_tokenizer}).set_index("category")
    assert cov["words"].to_dict() == {"Agency": 104, "Communion": 159}
    assert (cov["all"] <= cov[["smol", "gemma"]].min(axis=1)).all()
    assert (cov["all_space"] <= cov["all"]).all() and (cov["all_space"] > 80).all()


# ------------------------------------------------------------------ models, sweeps, CLI


@pytest.fixture(scope="module")
def pair(smol_tokenizer):
    return (T.tiny("llama", "causal_lm", seed=3), smol_tokenizer), (T.tiny("qwen2", "causal_lm", seed=4), smol_tokenizer)


def test_implicit_from_models_matches_logprobs(pair):
    (ma, tok), (mb, _) = pair
    r = implicit(pair[0], pair[1], PROMPT, template_b="User: {prompt}\nAssistant:")
    la = logprobs(ma, tok, PROMPT)
    lb = logprobs(mb, tok, PROMPT, template="User: {prompt}\nAssistant:")
    assert r.manifest["a"]["template"]["kind"] == "chat_generation_prompt"
    assert r.manifest["b"]["template"]["kind"] == "plain_text"
    ref, _ = join_shared(la, lb)
    pd.testing.assert_frame_equal(r.table, ref)
    row = r.table.set_index("text").loc[" love"]
    i = tok.convert_tokens_to_ids("Ġlove")
    assert row["token_id_a"] == i
    assert row["log_ratio"] == pytest.approx(float(la.scores[i]) - float(lb.scores[i]), abs=1e-6)
    with pytest.raises(UserError, match="different prompts"):
        implicit(la, logprobs(mb, tok, "Other?"))


def test_the_raw_prompt_is_raw_for_a_chat_model_too(pair):
    """template 'raw' (the CLI's --template-a/-b raw) is the raw prompt with BOS even where the tokenizer has a chat
    template (it was read as the default: chat template + generation prompt); its log-probs are a plain HF forward
    of those ids."""
    (ma, tok), _ = pair
    r = implicit(pair[0], pair[1], PROMPT, template_a="raw")
    assert r.manifest["a"]["template"]["kind"] == "raw_prompt"
    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert r.manifest["a"]["template"]["prefix_ids"] == ids
    with torch.no_grad():
        want = torch.log_softmax(ma(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    row = r.table.set_index("text").loc[" love"]
    assert row["logp_a"] == pytest.approx(float(want[int(row["token_id_a"])]), abs=1e-4)


def test_a_scan_of_another_quantity_is_not_joined(pair):
    """A scan made with --head logprob holds log p(token + end of turn), not the next token's log-probability: it
    is refused as a side, as a reward scan is; --exclude-special cannot filter a file already made."""
    (ma, tok), _ = pair
    la = logprobs(ma, tok, PROMPT)
    other = sr(la.texts, la.scores, la.token_ids)
    other.manifest["head"] = "logprob"
    with pytest.raises(UserError, match="token \\+ end of turn"):
        implicit(la, other)
    with pytest.raises(UserError, match="exclude-special|exclude_special"):
        implicit(la, la, exclude_special=True)
    # a file without its manifest (a reward scan copied alone had been read as log-probs), or two prompts' rows in one
    bare = sr(la.texts, la.scores, la.token_ids)
    bare.manifest.pop("head", None)
    with pytest.raises(UserError, match="no manifest saying what its scores are"):
        implicit(bare, la)
    twice = sr(la.texts * 2, np.concatenate([la.scores] * 2), np.concatenate([la.token_ids] * 2))
    twice.manifest["head"] = la.manifest["head"]
    with pytest.raises(UserError, match="holds a token id more than once"):
        implicit(twice, la)


def test_read_paper_b_prompts(shared_data):
    from rmfast.analysis.data.framing import prompt_framing

    p = read_prompts(shared_data / "prompts" / "paper_b_prompts.yaml")
    assert len(p) == 54 and p["greatest_ever_one"] == PROMPT
    assert sum(prompt_framing(v) == "negative" for v in p.values()) == 27


def test_sweep_and_dictionary_summary(pair):
    prompts = {"best": "What, in one word, is the best thing ever?", "worst": "What, in one word, is the worst thing ever?"}
    r = implicit_sweep(pair[0], pair[1], prompts, join="word")
    assert list(r.table.columns[:2]) == ["prompt_id", "prompt"] and set(r.table["prompt_id"]) == set(prompts)
    assert len(r.manifest["counts"]) == 2
    dic = pd.DataFrame({"term": ["love", "power", "friend", "skill", "care"],
                        "category": ["Communion", "Agency", "Communion", "Agency", "Communion"]})
    s = dictionary_summary(r.table, dic, name_a="A", name_b="B", n_perm=200)
    med = s["medians"]
    assert set(med["model"]) == {"log p A", "log p B", "log ratio (A - B)", "MWLR (A vs B)"}
    # check one median rank by hand: log ratio, prompt "best", among the 5 words
    sub = r.table[(r.table["prompt_id"] == "best") & r.table["text"].isin(dic["term"])].set_index("text")
    rk = sub["log_ratio"].rank(ascending=False)
    got = med[(med["model"] == "log ratio (A - B)") & (med["prompt"] == prompts["best"])].set_index("category")
    assert got.loc["Agency", "median_rank"] == rk[["power", "skill"]].median()
    assert got.loc["Communion", "median_rank"] == rk[["love", "friend", "care"]].median()
    tests = s["tests"].set_index("framing")
    assert set(tests.index) == {"all", "positive", "negative"} and tests.loc["all", "n_1"] == 2


def test_a_sweep_says_each_warning_once(pair):
    """A prompt format ending in whitespace warned once per prompt and side (54 times over Paper B's prompts); a
    sweep now says each distinct warning once, naming the format's tail (the same for every prompt)."""
    import warnings

    prompts = {"best": "What is the best thing?", "worst": "What is the worst thing?", "ok": "What is fine?"}
    fmt = "User: {prompt}\nAssistant: "
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        implicit_sweep(pair[0], pair[1], prompts, template_a=fmt, template_b=fmt)
    said = [str(w.message) for w in got if "whitespace" in str(w.message)]
    assert len(said) == 1 and "{prompt}'\\nAssistant: '" in said[0], said


def test_cli_implicit(pair, tmp_path, shared_data, capsys):
    (ma, tok), (mb, _) = pair
    fa, fb = tmp_path / "a.parquet", tmp_path / "b.parquet"
    logprobs(ma, tok, PROMPT).to_parquet(fa)
    logprobs(mb, tok, PROMPT).to_parquet(fb)
    out = tmp_path / "imp.parquet"
    rc = main(["implicit", "--model-a", str(fa), "--model-b", str(fb), "--out", str(out), "--top", "3"])
    o = capsys.readouterr()
    assert rc == 0, o.err
    assert "shared" in o.out and "top 3 by mwlr" in o.out
    df = pd.read_parquet(out)
    assert {"text", "logp_a", "logp_b", "log_ratio", "mwlr", "rank_log_ratio", "rank_mwlr"} <= set(df.columns)
    man = json.loads((tmp_path / "imp.parquet.json").read_text())
    assert man["counts"]["shared"] == len(df) and man["prompt"] == PROMPT

    # a sweep from model folders, two ids of the Paper B YAML, with the Big Two dictionary
    for name, m in (("ma", ma), ("mb", mb)):
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    out2 = tmp_path / "sweep.parquet"
    rc = main(["implicit", "--model-a", str(tmp_path / "ma"), "--model-b", str(tmp_path / "mb"),
               "--prompts-yaml", str(shared_data / "prompts" / "paper_b_prompts.yaml"),
               "--prompt-id", "best_ever_one", "--prompt-id", "worst_ever_one", "--join", "word",
               "--dictionary", str(shared_data / "lexicons" / "big2_nouns.csv"), "--out", str(out2), "--no-progress"])
    o = capsys.readouterr()
    assert rc == 0, o.err
    assert "median rank per category" in o.out
    assert set(pd.read_parquet(out2)["prompt_id"]) == {"best_ever_one", "worst_ever_one"}
    assert (tmp_path / "sweep.parquet.categories.csv").exists()

    # bad inputs: one line, exit 2
    for argv, msg in ((["implicit", "--model-a", str(fa)], "--model-b"),
                      (["implicit", "--model-a", str(fa), "--model-b", str(fb), "--out", str(out)], "already exists"),
                      (["implicit", "--model-a", str(fa), "--model-b", str(fb), "--prompt", "Other?",
                        "--out", str(tmp_path / "z.parquet")], "is not the prompt"),
                      (["implicit", "--model-a", "a", "--model-b", "b", "--prompts-yaml", str(tmp_path / "no.yaml")],
                       "no such file")):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and msg in err and err.count("\n") == 1, (argv, err)


@pytest.mark.slow
def test_real_pair_end_to_end(smollm2):
    """SmolLM2-135M-Instruct vs Gemma 3 270M on one prompt: the log ratio equals plain-HF log-probs."""
    import rmfast

    try:  # the package is in the `embedded` extra; without it, skip as test_real_models does
        gemma = rmfast.load("gemma3-270m", dtype="float32", device="cpu")
    except rmfast.UserError as e:
        pytest.skip(str(e))
    r = implicit(smollm2, gemma, PROMPT, template_b="User: {prompt}\nAssistant:")
    c = r.counts
    assert c["tokens_a"] == 49152 and c["tokens_b"] == 262144 and 40_000 < c["shared"] < 49_152
    row = r.table.set_index("text").loc[" love"]
    refs = []
    for lm, side in ((smollm2, "a"), (gemma, "b")):
        ids = r.manifest[side]["template"]["prefix_ids"]
        with torch.no_grad():
            lp = torch.log_softmax(lm.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        refs.append(float(lp[int(row[f"token_id_{side}"])]))
    assert row["logp_a"] == pytest.approx(refs[0], abs=2e-5) and row["logp_b"] == pytest.approx(refs[1], abs=2e-5)
    assert row["log_ratio"] == pytest.approx(refs[0] - refs[1], abs=4e-5)


def test_implicit_tables_say_what_their_scores_are(pair, tmp_path):
    """Issue 51 item 5: the implicit-reward Parquet carries score_meaning (its columns' meaning) in its schema
    metadata and manifest, as a scan's does."""
    from rmfast.implicit import SCORE_MEANING
    from rmfast.io import read_provenance

    out = implicit(pair[0], pair[1], PROMPT).to_parquet(tmp_path / "imp.parquet")
    meta = read_provenance(out)
    assert meta["score_meaning"] == SCORE_MEANING and meta["prompt"] == PROMPT
    assert "log_ratio = logp_a - logp_b" in SCORE_MEANING and "nats" in SCORE_MEANING
    assert json.loads((tmp_path / "imp.parquet.json").read_text())["score_meaning"] == SCORE_MEANING


def test_options_a_file_or_the_demo_would_ignore_are_refused(pair, tmp_path, capsys):
    """--template-a/--system-a with a logprobs file, and model options with --demo, had been ignored without a word;
    the same file on both sides gave an all-zero table; a manifest given for its Parquet read as 'not a .gguf'."""
    from rmfast.cli import main

    (ma, tok), _ = pair
    f = tmp_path / "a.parquet"
    logprobs(ma, tok, PROMPT).to_parquet(f)
    g = tmp_path / "b.parquet"
    logprobs(pair[1][0], tok, PROMPT).to_parquet(g)
    cases = [(["--model-a", str(f), "--model-b", str(g), "--template-a", "raw"], "--template-a applies to a model"),
             (["--model-a", str(f), "--model-b", str(f)], "are both"),
             (["--model-a", f"{f}.json", "--model-b", str(g)], "is a manifest; give the logprobs .parquet beside it"),
             (["--demo", "--model-a", str(f)], "--demo compares the embedded pair on words"),
             (["--demo", "--join", "text"], "--join would change that"),
             (["--model-a", str(tmp_path / "m"), "--model-b", str(tmp_path / "m")], "with one prompt side")]
    for argv, want in cases:
        capsys.readouterr()
        assert main(["implicit", *argv, "--out", str(tmp_path / "o.parquet")]) == 2, argv
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "o.parquet").exists()


def test_the_demo_loads_its_pair_in_the_dtype_and_on_the_device_asked_for(shared_data, monkeypatch):
    """--demo --dtype bfloat16 --device ... had been accepted and ignored (the pair always loaded fp32 on the CPU)."""
    from rmfast.cli import main
    from rmfast.loading import loader

    asked = []

    class Loaded(Exception):
        pass

    def load(spec, **kw):
        asked.append((spec, kw["dtype"], kw["device"]))
        raise Loaded

    monkeypatch.setattr(loader, "load", load)
    with pytest.raises(Loaded):
        main(["implicit", "--demo", "--prompt-id", "best_ever_one", "--dtype", "bfloat16", "--device", "cpu",
              "--no-progress"])
    assert asked == [("smollm2-135m-instruct", "bfloat16", "cpu")]


def test_a_result_s_prompt_serves_the_model_side_and_top_names_its_columns(pair):
    (ma, tok), _ = pair
    la = logprobs(ma, tok, PROMPT)
    r = implicit(la, pair[1])  # the prompt from the result (it had asked for one)
    assert r.manifest["prompt"] == PROMPT and r.manifest["b"]["prompt"] == PROMPT
    with pytest.raises(UserError, match="give one of log_ratio, mwlr"):
        r.top(3, by="ratio")
