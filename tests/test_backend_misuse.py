"""The Python backend misused as client code does (a new user's walkthrough of docs/backend.md, 2026-11-29): each
slip is one UserError naming it before any scoring, never a character-by-character score or an error from deep
inside Python, and the scorer's record follows the model it scores."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch

import tiny_models as T
from cli_run import one_line_error, run
from rmfast import RewardScorer
from rmfast.errors import UserError
from rmfast.integrations.grpo import rmfast_reward
from rmfast.integrations.remote import RemoteScorer


@pytest.fixture(scope="module")
def tok():
    return T.chatml_tokenizer()


@pytest.fixture(scope="module")
def scorer(tok):
    return RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok)


def _refused(fn, match: str):
    with pytest.raises(UserError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)


def test_a_string_where_a_list_belongs_is_refused_not_scored_by_character(scorer):
    """Iterated, "Paris" is five responses 'P', 'a', ...: it was scored so, silently (rerank, score_one, the GRPO
    adapter), or refused as "1 conversations but 5 response lists"."""
    one_str = r"must be a list of .*, got one str: put it in a list"
    f = rmfast_reward(scorer)
    for call in (lambda: scorer.rerank("Capital of France?", "Paris", k=2),
                 lambda: scorer.score_one("Capital of France?", "Paris"),
                 lambda: scorer.score("Hi", [["Hello"], ["Yo"]]),  # two characters, two lists: was scored
                 lambda: scorer.score(["Hi"], "Hello"),
                 lambda: f("Hi", ["a", "b"]),
                 lambda: f(["Hi"], "Hello"),
                 lambda: scorer.score_rendered("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nYo"),
                 lambda: scorer.score([b"Hi"], [["a"]])):  # bytes: not a list of messages either
        with pytest.raises(UserError) as e:
            call()
        assert "\n" not in str(e.value)
        assert re.search(one_str, str(e.value)) or re.search(r"must be a prompt string or a list of chat messages, "
                                                             r"got bytes", str(e.value)), e.value
    for none_call in (lambda: scorer.score(None, None), lambda: scorer.score(["Hi"], None),
                      lambda: scorer.rerank("Hi", None), lambda: f(None, ["a"]), lambda: f(["Hi"], None)):
        _refused(none_call, r"must be a list of .*, got NoneType")
    # what is a list of the right things still scores: tuples, arrays, generators
    want = scorer.score(["Hi"], [["a", "b"]])
    assert scorer.score(("Hi",), np.array([["a", "b"]], dtype=object)) == want
    assert scorer.score((c for c in ["Hi"]), ([r for r in rs] for rs in [("a", "b")])) == want


def test_a_remote_scorer_refuses_what_zip_would_drop(scorer):
    """RemoteScorer.score zipped conversations with responses: a list of another length lost its extra items
    unscored. Refused before any request (no server at this address)."""
    remote = RemoteScorer("http://127.0.0.1:9")
    _refused(lambda: remote.score(["Hi", "Bye"], [["a"]]), r"2 conversations but 1 response lists")
    _refused(lambda: remote.score(["Hi"], ["abc"]), r"responses\[0\] must be a list of response strings, got one str")


def test_arguments_of_the_wrong_type_are_one_line(tok, scorer):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    for kw, match in [({"cache_prompts": "x"}, r"cache_prompts must be an integer >= 0, got 'x'"),
                      ({"cache_prompts": None}, r"cache_prompts must be an integer >= 0, got None"),
                      ({"max_tokens": "abc"}, r"max_tokens must be an integer >= 1, got 'abc'"),
                      ({"head_index": "0"}, r"head_index must be an integer >= 0, got '0'"),
                      ({"template": 123}, r"template must be a chat template or a plain format \(a string\), got int")]:
        _refused(lambda kw=kw: RewardScorer(model, tok, **kw), match)
    assert RewardScorer(model, tok, cache_prompts=np.int64(2), head_index=np.int64(0)).cache_prompts == 2
    _refused(lambda: scorer.score(["Hi"], [["a"]], checkpoint=123), r"checkpoint must be a file path, got int")
    _refused(lambda: scorer.rerank("Hi", ["a", "b"], k=True), r"k must be an integer >= 1, got True")
    _refused(lambda: scorer.score_with_states(["Hi"], [["a"]], None), r"give layers as a string .* got NoneType")
    got = scorer.score_with_states(["Hi"], [["a", "b"]], 1)[1]  # one index, as "1"
    assert torch.equal(got["1"][0], scorer.score_with_states(["Hi"], [["a", "b"]], "1")[1]["1"][0])


def test_a_tokenizer_the_scorer_would_not_use_is_refused(tok):
    """RewardScorer("name", tokenizer) loaded the named model's own tokenizer and dropped the one given, silently;
    a LoadedModel likewise. A misspelt loading option names RewardScorer and the options it takes, not load()."""
    from rmfast.loading.loader import LoadedModel

    _refused(lambda: RewardScorer("no-such-model", tok), r"a tokenizer was given, but no-such-model loads its own")
    lm = LoadedModel(model=T.tiny("llama", num_labels=1, pad_token_id=2), tokenizer=tok, kind="classifier",
                     source={"name": "tiny"}, default_template=None)
    _refused(lambda: RewardScorer(lm, tok), r"is a LoadedModel: it carries its tokenizer")
    with pytest.raises(TypeError, match=r"RewardScorer got an unexpected keyword argument 'random_head_sed' "
                                        r"\(besides its own options it takes rmfast.load's: .*random_head_seed"):
        RewardScorer("no-such-model", random_head_sed=0)


def test_states_of_a_call_without_responses_name_every_layer_asked(scorer):
    scores, states = scorer.score_with_states(["Hi", "Bye"], [[], []], "1,last_normed")
    assert scores == [[], []] and set(states) == {"1", "last_normed"}
    assert [tuple(t.shape) for t in states["1"]] == [(0, 64), (0, 64)]


def test_a_model_cast_or_moved_after_the_scorer_was_made(tok):
    """The decisions are made again for the model as it is (the record said float32 after a cast to bf16); a model
    moved to meta is one line (it was a RuntimeError from Tensor.item() inside the weights watch)."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, tok)
    s.score(["Hi"], [["a"]])
    assert s.last_stats.decisions["dtype"]["value"] == "float32"
    model.to(torch.bfloat16)
    s.score(["Hi"], [["a"]])
    assert s.last_stats.decisions["dtype"]["value"] == "bfloat16" == s.key_fields()["dtype"]
    model.to("meta")
    _refused(lambda: s.score(["Hi"], [["a"]]), r"on the meta device")


def test_nan_from_a_float32_model_is_not_called_an_fp16_overflow(tok):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    with torch.no_grad():
        model.score.weight.fill_(float("nan"))
    s = RewardScorer(model, tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.score(["Hi"], [["a"]])
    text = " ".join(str(w.message) for w in caught)
    assert "came out NaN" in text and "it runs in float32" in text and "float16 overflows" not in text, text
    with pytest.raises(UserError, match=r"it runs in float32.*check the weights") as e:
        rmfast_reward(s)(["Hi"], ["a"])
    assert "dtype='float32'" not in str(e.value)


@pytest.mark.parametrize("rows, match", [
    ('{"p": "Hi", "r": "a"}\n{"p": null, "r": "b"}\n', r"row 2: the prompt cell is empty \(a missing value\)"),
    ('{"p": "Hi", "r": "a"}\n{"p": "Yo", "r": null}\n',
     r"row 2: the response is empty \(a missing value\); give every row a response to score \(or drop the row\)$"),
    # a rendered prompt: was no row named, and Python's score_rendered as the fix
    ('{"p": "Hi", "r": "a"}\n{"p": "<|im_start|>user\\nYo<|im_end|>", "r": "b"}\n',
     r"row 2 \(prompt column\): the prompt already holds the chat template .*write the token another way\)$"),
    ('{"p": "Hi", "r": "a"}\n{"p": [{"role": "user", "content": "Yo"}], "r": "b"}\n',
     r"column 'p' .* mix types; give them one type: every prompt a list of chat messages"),
    # a prompt past the model's positions: was no row named, and "shorten --prompt", an option score has not got
    ('{"p": "Hi", "r": "a"}\n{"p": "' + "word " * 5000 + '", "r": "b"}\n',
     r"row 2 \(prompt column\): the sequence is \d+ prompt .* positions .*: shorten that row's prompt$"),
], ids=["null-prompt", "null-response", "rendered-prompt", "prompt-strings-and-messages", "prompt-too-long"])
def test_score_names_a_missing_cell_and_a_prompt_column_of_two_kinds(rm_folder, tmp_path, capsys, rows, match):
    inp = tmp_path / "t.jsonl"
    inp.write_text(rows)
    rc, _, err = run(["score", inp, "--model", rm_folder, "--prompt-column", "p", "--response-column", "r",
                      "--no-progress"], capsys)
    assert one_line_error(rc, err), err
    assert re.search(match, err), err


def test_a_completion_that_is_not_valid_text_does_not_stop_training(scorer):
    """The adapter's rule, a completion never stops training: one holding a lone surrogate (no tokenizer takes it)
    was a UserError that ended the GRPO step; it is None with one warning, and the others are scored."""
    f = rmfast_reward(scorer)
    with pytest.warns(UserWarning, match=r"1 of 2 completions are not valid text \(a lone surrogate"):
        got = f(["Hi", "Hi"], ["caf\udce9", "fine"])
    assert got[0] is None and got[1] == scorer.score(["Hi"], [["fine"]])[0][0]


@pytest.fixture(scope="module")
def dropout_model():
    """A tiny Llama classifier whose attention drops half its weights in training mode (the plain-HF engine runs it)."""
    m = T.tiny("llama", num_labels=1, pad_token_id=2)
    m.config.attention_dropout = 0.5
    return m


def test_a_model_in_training_mode_or_under_autocast_is_scored_as_in_eval_and_fp32(tok, dropout_model):
    """A trainer's model in training mode, or a call inside the caller's torch.autocast region: rmfast.scan on the
    plain-HF engine scored with dropout (two identical scans disagreed, and the global RNG moved), and autocast made
    every layer and the head bf16 while the manifest said float32. Now every entry point scores in eval mode with
    autocast off, and the model's mode is back after the call."""
    import rmfast

    m = dropout_model
    kw = dict(token_ids="100:140", engine="hf", progress=False)
    want = rmfast.scan(m.eval(), tok, "Hi", **kw).scores
    m.train()
    rng = torch.get_rng_state()
    got = [rmfast.scan(m, tok, "Hi", **kw).scores for _ in range(2)]
    assert m.training and all(x.training for x in m.modules())  # the caller's mode, back
    assert torch.equal(rng, torch.get_rng_state())  # no dropout drew from it
    for g in got:
        np.testing.assert_array_equal(g, want)
    texts = rmfast.score_texts(m, tok, "Hi", ["Paris", "a cat"], engine="hf", progress=False).scores
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = rmfast.scan(m, tok, "Hi", token_ids="100:140", engine="fast", progress=False)
        np.testing.assert_array_equal(rmfast.scan(m, tok, "Hi", **kw).scores, want)
        np.testing.assert_array_equal(rmfast.score_texts(m, tok, "Hi", ["Paris", "a cat"], engine="hf",
                                                         progress=False).scores, texts)
        s = RewardScorer((m, tok))
        under = s.score(["Hi"], [["Paris", "a cat"]])
    assert fast.manifest["dtype"] == "float32"
    np.testing.assert_array_equal(fast.scores, rmfast.scan(m, tok, "Hi", token_ids="100:140", engine="fast",
                                                           progress=False).scores)
    assert under == s.score(["Hi"], [["Paris", "a cat"]])
    assert m.training
    m.eval()


def test_a_scorers_decided_attributes_cannot_be_set_to_be_ignored(scorer):
    """head_index, head, batch_size set on a made scorer read back and went into key_fields while its scores kept the
    decided ones (a 2-output head scored output 0 labelled output 1): each is one line naming how to change it."""
    for name, value in (("head_index", 1), ("head", "logprob"), ("batch_size", 1), ("engine", "hf")):
        _refused(lambda: setattr(scorer, name, value), rf"RewardScorer\.{name} is decided when the scorer is made.*"
                                                       rf"RewardScorer\(\.\.\., {name}=")
    assert scorer.head_index == 0 and scorer.key_fields()["head_index"] == 0


def test_two_threads_changing_one_models_pad_token_leave_it_as_it_was():
    """pad_token_as saves, sets and restores the config's pad_token_id: two calls on one model in two threads (two
    HF-engine scorers, a scan and a scorer) each saved the other's temporary -1, and the config kept -1 for good (the
    caller's own padded HF forward then pooled a pad position). Now the model's calls take turns."""
    import threading
    import time

    from rmfast.scoring.hf_path import pad_token_as

    m = T.tiny("llama", num_labels=1, pad_token_id=2)
    inside = threading.Event()

    def call(delay):
        with pad_token_as(m, -1):
            inside.set()
            time.sleep(delay)

    a = threading.Thread(target=call, args=(0.3,))
    a.start()
    inside.wait(10)
    b = threading.Thread(target=call, args=(0.6,))  # enters while a's -1 is set, ends after a
    b.start()
    a.join(), b.join()
    assert m.config.pad_token_id == 2


def test_overlapping_calls_on_one_model_keep_it_in_eval_until_the_last_ends(dropout_model):
    """Two scorers of one trained model in two threads: the first call to end restored training mode while the
    other's call still ran (1 call in ~100 scored with dropout). The mode comes back when the last call ends."""
    import threading

    from rmfast.scoring.model_mode import scoring_mode

    m = dropout_model.train()
    entered, release, seen = threading.Event(), threading.Event(), []

    def long_call():
        with scoring_mode(m):
            entered.set()
            release.wait(10)
            seen.append(m.training)

    t = threading.Thread(target=long_call)
    t.start()
    entered.wait(10)
    with scoring_mode(m):  # a short call overlapping it, ending first
        assert not m.training
    assert not m.training  # the long call still runs
    release.set()
    t.join()
    assert seen == [False] and m.training
    m.eval()


def test_the_scan_entry_points_name_a_wrong_argument_in_one_line(tok, scorer, tmp_path):
    """Slips a library caller makes, each a raw Python error from deep inside before (AttributeError on a list prompt,
    TypeError on one int id or no tokenizer, IsADirectoryError after batches were scored, TypeError at the first score
    of an Engine with an unknown head), and a set of responses scored in its hash order, which changes between
    processes: now one line each, before any scoring."""
    import rmfast
    from rmfast.fast.engine import Engine
    from rmfast.template import build_template

    m = scorer.model
    _refused(lambda: rmfast.scan(m, tok, ["Hi"], token_ids="0:8", progress=False), "the prompt must be one string")
    _refused(lambda: rmfast.scan(m, tok, "Hi", token_ids=7, progress=False), r"token_ids 7: .*\[7\]")
    _refused(lambda: rmfast.scan(m, None, "Hi", token_ids="0:8", progress=False), "give the model, then its tokenizer")
    _refused(lambda: rmfast.scan(tok, m, "Hi", token_ids="0:8", progress=False), "give the model, then its tokenizer")
    _refused(lambda: rmfast.scan(m, tok, "Hi", token_ids="0:8", progress=False, checkpoint=tmp_path),
             "is a folder; give a file path")
    _refused(lambda: scorer.score(["Hi"], [{"Paris", "a cat"}]), "got a set, whose order changes between processes")
    with pytest.raises(ValueError, match="head 'bogus'"):
        Engine(m, build_template(tok, "Hi"), head="bogus")
