"""RewardScorer (one prompt, many responses): every score equals the plain Hugging Face forward of the
whole conversation (``apply_chat_template`` of the messages + response, read at the final position), to
fp32 rounding, the tolerance measured against a float64 forward (tests/rounding.py); system prompts and
multi-turn histories; a custom gated head; the logprob head; merging responses; order, duplicates,
caching, threads; the GRPO adapter, rerank and ``rmfast score``."""

import copy
import json
import sys
import threading

import numpy as np
import pandas as pd
import pytest
import torch

import tiny_models as T
from cli_run import interrupt_scoring_at, one_line_error, run
from rmfast import RewardScorer
from rmfast.errors import UserError
from rmfast.integrations.grpo import rmfast_reward
from rmfast.scoring.hf_path import hf_scores, pad_token_as
from rmfast.scoring.scorer import as_conversation, messages_of
from rounding import assert_agree_to_rounding

SYSTEM = "You are a careful assistant."
MULTI = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit."},
         {"role": "assistant", "content": "An apple."}, {"role": "user", "content": "Another one, please?"}]
CONVS = ["What, in one word, is the greatest thing ever?",
         [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Greatest thing?"}],
         MULTI]
RESPONSES = [["Love", "The universe, obviously.", "music", "Love", "A cup of tea, with milk and two sugars please."],
             ["Love", "kindness", "A long answer that goes on for a while about many things at once."],
             ["A pear.", "Banana", "Love", "no"]]


@pytest.fixture(scope="module")
def tok():
    return T.chatml_tokenizer()


def full_ids(tok, conv, response):
    out = tok.apply_chat_template(messages_of(as_conversation(conv), response), tokenize=True, return_dict=False)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@torch.no_grad()
def direct(model, tok, convs, responses, head_index=0):
    """The plain-HF score of each whole conversation, one forward each, final position (pad id never matches)."""
    out = []
    with pad_token_as(model, -1):
        for c, rs in zip(convs, responses):
            for r in rs:
                out.append(model(input_ids=torch.tensor([full_ids(tok, c, r)])).logits[0, head_index].item())
    return np.array(out)


def check_exact(model, tok, head_index=0, **kw):
    scores = RewardScorer(model, tok, head_index=head_index, **kw).score(CONVS, RESPONSES)
    assert [len(s) for s in scores] == [len(r) for r in RESPONSES]
    flat = np.array([x for s in scores for x in s])
    ref32 = direct(model, tok, CONVS, RESPONSES, head_index)
    ref64 = direct(copy.deepcopy(model).double(), tok, CONVS, RESPONSES, head_index)
    assert ref64.std() > 1e-2, "degenerate model: scores barely vary"
    # E is measured on the plain-HF fp32 forward (first argument) against float64: the scorer's scores
    # must lie within 2E of it (measuring E on the scores under test would widen the bound for a wrong score)
    assert_agree_to_rounding(ref32, flat, ref64)
    return flat


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_fp32_scores_are_the_whole_conversations_hf_scores(tok, arch):
    model = T.tiny(arch, num_labels=2, pad_token_id=2)
    flat = check_exact(model, tok, head_index=1)
    # the test can fail: the same responses to the conversation without its system prompt score otherwise
    bare = RewardScorer(model, tok, head_index=1).score([CONVS[0], "Greatest thing?"], [RESPONSES[0], RESPONSES[1]])
    assert not np.allclose(bare[1], flat[5:8], atol=1e-3)
    assert flat[0] == flat[3]  # a duplicate response is scored once


def test_off_fast_path_engine_hf(tok):
    model = T.tiny("qwen2", num_labels=1, pad_token_id=2)
    check_exact(model, tok, engine="hf")


def test_custom_gated_head_multi_turn(tmp_path):
    import custom_rm_replicas as R

    gtok = R.gemma_tokenizer()
    folder = R.make_replica("qrm-gemma", tmp_path / "qrm", gtok)
    scorer = RewardScorer(str(folder), dtype="float32", device="cpu")
    assert scorer.engine == "fast"
    got = np.array([x for s in scorer.score(CONVS, RESPONSES) for x in s])
    ref = R.Reference(folder, gtok)
    rows = [full_ids(scorer.tokenizer, c, r) for c, rs in zip(CONVS, RESPONSES) for r in rs]
    want = np.array([ref.score_rows([row]).item() for row in rows])  # gated at the LAST user -> assistant turn
    assert want.std() > 1e-2
    np.testing.assert_allclose(got, want, atol=2e-5 * max(1.0, np.abs(want).max()), rtol=0)


def test_logprob_head_is_the_whole_conversations_log_probability(tok):
    lm = T.tiny("qwen2", "causal_lm", pad_token_id=2, seed=3)
    scorer = RewardScorer(lm, tok)
    assert scorer.head == "logprob"
    got = scorer.score(CONVS, RESPONSES)
    for c, rs, s in zip(CONVS, RESPONSES, got):
        tmpl = scorer.template_for(as_conversation(c))
        ids = [scorer.prepare([c], [[r]]).rows[0][1].ids for r in rs]
        assert all(tmpl.sequence(i) == full_ids(tok, c, r) for i, r in zip(ids, rs))
        np.testing.assert_allclose(s, hf_scores(lm, tmpl, ids, head="logprob").numpy(), rtol=1e-4, atol=1e-3)


def test_merging_response_is_an_error_or_the_named_option(smol_tokenizer):
    tok = smol_tokenizer  # the real SmolLM2 tokenizer: "  two" merges with the header's newline
    model = T.tiny("llama", num_labels=1, pad_token_id=tok.pad_token_id)
    with pytest.raises(UserError, match=r"response 1 of conversation 0 .* compat='decode-retokenize'"):
        RewardScorer(model, tok).score(["Hi"], [["fine", "  two leading spaces"]])
    got = RewardScorer(model, tok, compat="decode-retokenize").score(["Hi"], [["fine", "  two leading spaces"]])[0]
    np.testing.assert_allclose(got, direct(model, tok, ["Hi"], [["fine", "  two leading spaces"]]), rtol=1e-5, atol=1e-5)


def test_grpo_adapter_never_raises_on_a_completion_even_with_a_strict_scorer(smol_tokenizer):
    """Issue 37 item 10: rmfast_reward(existing_scorer) kept that scorer's strict tokenization, so a completion
    starting with whitespace raised mid-training. The adapter's rule holds for every scorer: such a completion
    is scored as the template renders it; the scorer itself stays strict for its other callers."""
    tok = smol_tokenizer
    model = T.tiny("llama", num_labels=1, pad_token_id=tok.pad_token_id)
    strict = RewardScorer(model, tok)
    reward = rmfast_reward(strict)
    got = reward(prompts=["Hi", "Hi"], completions=["fine", "  two leading spaces"])
    np.testing.assert_allclose(got, direct(model, tok, ["Hi"], [["fine", "  two leading spaces"]]), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(UserError, match="compat='decode-retokenize'"):
        strict.score(["Hi"], [["fine", "  two leading spaces"]])
    with pytest.raises(UserError, match="unknown compat"):
        strict.score(["Hi"], [["fine"]], compat="loose")
    # a tool-calling completion (several messages) or one without text: None and one warning, never a stop
    tool = [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "w", "arguments": {}}}]},
            {"role": "tool", "content": "18C"}, {"role": "assistant", "content": "It is 18C."}]
    chat = [[{"role": "user", "content": "Hi"}]] * 3
    with pytest.warns(UserWarning, match="2 of 3 completions hold several messages"):
        got = reward(prompts=chat, completions=[[{"role": "assistant", "content": "fine"}], tool, tool[:1]])
    assert got[1:] == [None, None] and got[0] == pytest.approx(direct(model, tok, ["Hi"], [["fine"]])[0], abs=1e-5)


def test_order_stats_cache_and_errors(tok):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, tok, batch_size=2)
    a = s.score(CONVS + [CONVS[0]], RESPONSES + [RESPONSES[0][::-1]])
    assert a[3] == a[0][::-1]  # input order kept; the repeated conversation is the same rows
    st = s.last_stats
    assert st.n_prompts == 3 and st.n_rows == 11 and st.padded_rows == 0 and st.padding_waste < 0.25
    assert st.n_responses == 17 and st.n_batches >= st.n_rows / 2
    s.score(CONVS[:1], RESPONSES[:1])
    assert s.last_stats.prompts_from_cache == 1
    for convs, resps, msg in [(["a"], [], "1 conversations but 0"), (["a"], [[""]], "is empty"),
                              (["a"], [[" \n"]], "is only whitespace"),
                              ([[{"role": "assistant", "content": "x"}]], [["y"]], "last message must be the user's .*; its last is a 'assistant' message"),
                              ([[{"role": "wizard", "content": "x"}]], [["y"]], "its last is a 'wizard' message"),
                              (["a"], ["not a list"], "must be a list")]:
        with pytest.raises(UserError, match=msg):
            s.score(convs, resps)
        assert s.last_stats.n_responses == 0  # a refused call leaves no earlier call's figures
    with pytest.raises(UserError, match="max_tokens 2"):
        RewardScorer(model, tok, max_tokens=2).score(["a"], [["one two three four"]])
    # past what the chat template renders: TooLong naming its length (it was "merges with the template"), and
    # too_long (the GRPO adapter's) marks it rather than raise
    huge = "x " * 1_100_000
    with pytest.raises(UserError, match="response 1 of conversation 0 is 2,200,000 characters") as e:
        s.score(["a"], [["ok", huge]])
    assert type(e.value).__name__ == "TooLong" and "merges" not in str(e.value)
    assert s.too_long(["a"], [["ok", huge]]) == [[False, True]]


def test_threads_get_the_serial_scores(tok):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, tok, cache_prompts=0)
    want = s.score(CONVS, RESPONSES)
    got = [None] * 4

    def work(k):
        got[k] = s.score(CONVS, RESPONSES)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(g == want for g in got)


def test_layers_outlive_evicted_plans(tok, monkeypatch):
    """A full prompt cache evicts plans, not their layers: the next prompt's engine shares them (on CPU fused
    weight copies of the whole model), so a call over more conversations than the cache holds builds the layers
    once, and scores as a scorer with room for all."""
    import rmfast.fast.engine as engine_mod

    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    built, real = [], engine_mod.build_layers
    monkeypatch.setattr(engine_mod, "build_layers", lambda *a, **kw: built.append(1) or real(*a, **kw))
    convs, resps = ["Hi", "Name a colour.", "Why?"], [["hello", "a longer reply"], ["blue"], ["because", "no"]]
    got = RewardScorer(model, tok, cache_prompts=1, share_batches=False).score(convs, resps)
    assert len(built) == 1  # three prompts, one cache slot: each plan evicted in turn, the layers kept
    assert got == RewardScorer(model, tok, share_batches=False).score(convs, resps)


def test_rerank_and_grpo_adapter(tok):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, tok)
    scores = s.score_one(CONVS[0], RESPONSES[0])
    best = s.rerank(CONVS[0], RESPONSES[0], k=2)
    assert [b.score for b in best] == sorted(scores, reverse=True)[:2] and best[0].response == RESPONSES[0][best[0].index]
    reward = rmfast_reward(s)
    assert reward.__name__ == "rmfast"
    with pytest.raises(UserError, match="dtype apply when rmfast_reward makes the scorer"):
        rmfast_reward(s, dtype="bfloat16")  # ignored before: the scorer is made already
    # GRPO: each prompt repeated per generation; plain and conversational formats give the same scores
    prompts = [CONVS[1]] * 3 + [CONVS[2]] * 3
    comps = RESPONSES[1] + RESPONSES[2][:3]
    conv = reward(prompts=prompts, completions=[[{"role": "assistant", "content": c}] for c in comps],
                  completion_ids=None, trainer_state=None)
    assert conv == sum(s.score([CONVS[1], CONVS[2]], [RESPONSES[1], RESPONSES[2][:3]]), [])  # the adapter's one call
    plain = reward(prompts=["Greatest thing?"] * 2, completions=["Love", "kindness"])
    assert plain == s.score(["Greatest thing?"], [["Love", "kindness"]])[0]
    with pytest.warns(UserWarning, match="several messages"):  # scored whole or not at all: None, never a stop
        assert reward(prompts=["a"], completions=[[{"role": "assistant", "content": "x"}] * 2]) == [None]
    with pytest.raises(UserError, match="one assistant message"):  # not a completion at all: the caller's bug
        reward(prompts=["a"], completions=[[1, 2]])


def test_cli_score_writes_beside_the_input_and_resumes(tok, tmp_path, capsys, monkeypatch):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    folder = tmp_path / "rm"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    rows = [(c if isinstance(c, str) else c[-1]["content"], r) for c, rs in zip(CONVS, RESPONSES) for r in rs]
    df = pd.DataFrame(rows * 3, columns=["p", "r"])
    inp = tmp_path / "pairs.parquet"
    df.to_parquet(inp)
    argv = ["score", inp, "--model", folder, "--prompt-column", "p", "--response-column", "r", "--dtype", "float32",
            "--device", "cpu", "--batch-size", "1", "--no-progress"]
    restore = interrupt_scoring_at(monkeypatch, 4)
    rc, _, err = run(argv, capsys)
    assert rc == 130 and "resume" in err
    out = tmp_path / "pairs.scores.parquet"
    assert not out.exists() and (tmp_path / "pairs.scores.parquet.partial.npz").exists()
    restore()
    rc, so, err = run(argv, capsys)
    assert rc == 0, err
    assert "3 rows from the checkpoint" in so  # the interrupted run's 3 finished batches were not redone
    got = pd.read_parquet(out)
    assert list(got.columns) == ["p", "r", "score"] and got[["p", "r"]].equals(df)
    man = json.loads((tmp_path / "pairs.scores.parquet.json").read_text())  # the fields every job's manifest ends with
    assert {"rmfast_version", "versions", "created", "wall_s", "options"} <= set(man) and man["decisions"]["attention"]
    from rmfast.io import read_provenance  # what `score` is, in the Parquet alone too (issue 51 item 5)

    assert read_provenance(out)["score_meaning"] == man["score_meaning"] and "score head" in man["score_meaning"]
    s = RewardScorer(model, tok, batch_size=1).score(list(got["p"]), [[r] for r in got["r"]])
    np.testing.assert_array_equal(got["score"].to_numpy(), np.array([x[0] for x in s], np.float32))
    assert not (tmp_path / "pairs.scores.parquet.partial.npz").exists()
    rc, _, err = run(argv, capsys)
    assert one_line_error(rc, err) and "--overwrite" in err
    rc, _, err = run([*argv[:5], "nope", *argv[6:], "--out", tmp_path / "x.parquet"], capsys)
    assert one_line_error(rc, err) and "no column 'nope'" in err


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_ragged_batches_of_similar_lengths_are_exact(tok, arch, monkeypatch):
    """Responses of many lengths run as few ragged batches (right-padded, each row read at its own final
    position), and still equal the plain-HF forward of each whole conversation to fp32 rounding (Gemma 2:
    sliding windows and softcaps included)."""
    model = T.tiny(arch, num_labels=1, pad_token_id=2)
    convs = ["Name a colour.", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Best?"}]]
    words = "red green blue cyan teal navy gold ruby jade sand pink plum".split()
    responses = [[" ".join(words[:k]) for k in range(1, 13)], [" ".join(reversed(words[:k])) for k in range(2, 11, 2)]]
    scorer = RewardScorer(model, tok)
    flat = np.array([x for s in scorer.score(convs, responses) for x in s])
    st = scorer.last_stats
    n_lengths = len({(c, len(full_ids(tok, conv, r))) for c, (conv, rs) in enumerate(zip(convs, responses)) for r in rs})
    assert st.n_batches < n_lengths and st.padded_tokens > 0 and 0 < st.padding_waste < 0.25
    ref32 = direct(model, tok, convs, responses)
    ref64 = direct(copy.deepcopy(model).double(), tok, convs, responses)
    assert_agree_to_rounding(ref32, flat, ref64)
    # the test can fail: reading every row at the batch's last position (a pad) scores otherwise
    import rmfast.scoring.plan as plan_mod

    real = plan_mod.score_prompts

    def read_last(engines, responses, lengths, taps=None, packed=None):
        return real(engines, responses, [torch.full_like(n, r.shape[1]) for r, n in zip(responses, lengths)], taps,
                    packed)

    monkeypatch.setattr(plan_mod, "score_prompts", read_last)
    wrong = np.array([x for s in RewardScorer(model, tok).score(convs, responses) for x in s])
    assert not np.allclose(wrong, ref32, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3"])
def test_many_prompts_share_batches_and_stay_exact(tok, arch):
    """Conversations with a few responses each (GRPO groups, best-of-4) share batches: prompts of
    different lengths (system messages, a multi-turn history) in one batch, each row attending to its
    own prompt at its own positions (Gemma 3: sliding and global layers; Qwen3: q/k norms), and every
    score still equals the plain-HF forward of its whole conversation to fp32 rounding."""
    model = T.tiny(arch, num_labels=1, pad_token_id=2)
    convs = ["Hi", "Name a colour, any colour you like.", MULTI, CONVS[1], "What, in one word, is best?"]
    words = "red green blue cyan teal navy gold ruby".split()
    responses = [[" ".join(words[i:i + k]) for k in (1, 2, 3)] + ["Love"] for i in range(len(convs))]
    scorer = RewardScorer(model, tok, share_batches=True)  # "auto": on CUDA only
    flat = np.array([x for s in scorer.score(convs, responses) for x in s])
    st = scorer.last_stats
    assert st.n_prompts == len(convs) and st.n_batches < st.n_prompts  # rows of several prompts per batch
    plans = list(scorer._plans.values())
    assert len(plans) == len(convs) and all(p.eng.layers is plans[0].eng.layers for p in plans)  # one weight copy
    ref32 = direct(model, tok, convs, responses)
    ref64 = direct(copy.deepcopy(model).double(), tok, convs, responses)
    assert_agree_to_rounding(ref32, flat, ref64)
    # each prompt is encoded once per call, even with no cache across calls and buckets spanning conversations
    lean = RewardScorer(model, tok, cache_prompts=0, batch_size=4, share_batches=True)  # buckets of several batches
    many = [f"Question {k}: name a colour." for k in range(10)]
    lean.score(many, [["Love", "red green blue cyan teal navy gold"]] * len(many))
    assert lean.last_stats.prompt_passes == len(many) and len(lean._plans) == 0
    # alone, each conversation gives the same scores to fp32 rounding (other batch shapes, other sums)
    alone = np.array([x for c, rs in zip(convs, responses) for x in scorer.score([c], [rs])[0]])
    assert_agree_to_rounding(ref32, alone, ref64)


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_states_per_response_from_the_same_forward(tok, arch):
    """``score_with_states``: the scores are the bits ``score`` gives for the same call, and each response's
    states are HF's ``hidden_states`` of its whole conversation at the final position, to fp32 rounding
    (several prompts and lengths in one batch, so each row is read at its own position)."""
    model = T.tiny(arch, num_labels=1, pad_token_id=2)
    scorer = RewardScorer(model, tok, share_batches=True)
    scores, st = scorer.score_with_states(CONVS, RESPONSES, "1,last_normed")
    assert scores == scorer.score(CONVS, RESPONSES) and sorted(st) == ["1", "last_normed"]
    assert [t.shape[0] for t in st["1"]] == [len(r) for r in RESPONSES]
    L = model.config.num_hidden_layers
    with torch.no_grad(), pad_token_as(model, -1):
        for c, rs, s1, sn in zip(CONVS, RESPONSES, st["1"], st["last_normed"]):
            for j, r in enumerate(rs):
                hs = model(input_ids=torch.tensor([full_ids(tok, c, r)]), output_hidden_states=True).hidden_states
                torch.testing.assert_close(s1[j], hs[1][0, -1], rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(sn[j], hs[L][0, -1], rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="unknown layer"):
        scorer.score_with_states(CONVS, RESPONSES, "middle")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_bf16_ranks_as_well_as_hf_bf16(tok, arch):
    """In bf16 the scorer's ragged, many-prompt batches rank responses as well as the plain-HF bf16
    forward of each whole conversation does, both judged against the fp32 scores."""
    from scipy import stats

    model = T.tiny(arch, num_labels=1, pad_token_id=2)
    words = "red green blue cyan teal navy gold ruby jade sand pink plum love music tea".split()
    rng = np.random.default_rng(0)
    convs = CONVS + ["Hi", "What is best?"]
    responses = [[" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(40)] for _ in convs]
    truth = direct(model, tok, convs, responses)
    bf = copy.deepcopy(model).to(torch.bfloat16)
    ref = direct(bf, tok, convs, responses)
    got = np.array([x for s in RewardScorer(bf, tok, share_batches=True).score(convs, responses) for x in s])
    rho_got, rho_ref = stats.spearmanr(got, truth).statistic, stats.spearmanr(ref, truth).statistic
    assert rho_got > rho_ref - 0.01 and rho_got > 0.9, (rho_got, rho_ref)


def test_a_model_made_under_inference_mode_scores(tok):
    """Inference tensors keep no version counter: the stale-plan check must not trip on them."""
    with torch.inference_mode():
        model = T.tiny("llama", num_labels=1, pad_token_id=2)
    want = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok).score(CONVS[:1], RESPONSES[:1])
    assert RewardScorer(model, tok).score(CONVS[:1], RESPONSES[:1]) == want


def test_changed_weights_drop_cached_plans(tok):
    """A cached plan holds the prompt's keys/values and fused weight copies: after the weights change in
    place (an optimizer step), the next call scores with the new weights, not the cached ones."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    scorer = RewardScorer(model, tok)
    before = scorer.score(CONVS[:2], RESPONSES[:2])
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    after = scorer.score(CONVS[:2], RESPONSES[:2])
    assert after == RewardScorer(model, tok).score(CONVS[:2], RESPONSES[:2]) and after != before


def test_grpo_smoke_two_steps_with_the_trl_adapter(tok, tmp_path):
    """TRL's GRPOTrainer, a tiny random policy, rmfast's reward function: two steps run, and every reward
    TRL received is the scorer's score of that (prompt, completion) (empty completions: None, skipped)."""
    pytest.importorskip("trl", reason="trl is in the train extra: pip install -e '.[train]'")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rm = T.tiny("llama", num_labels=1, pad_token_id=2)
    reward = rmfast_reward((rm, tok))
    seen = []

    def recorded(prompts, completions, **kw):
        out = reward(prompts, completions, **kw)
        seen.append((prompts, completions, out))
        return out

    recorded.__name__ = "rmfast"
    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in ["Best thing?", "Worst thing?"] * 4]})
    cfg = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                     max_steps=2, learning_rate=1e-3, report_to="none", logging_steps=1, use_cpu=True, save_strategy="no")
    trainer = GRPOTrainer(model=T.tiny("llama", kind="causal_lm"), reward_funcs=[recorded], args=cfg, train_dataset=ds,
                          processing_class=tok)
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    scorer = RewardScorer(rm, tok, compat="decode-retokenize")
    for prompts, completions, out in seen:
        assert len(out) == len(prompts) == 4
        for p, c, r in zip(prompts, completions, out):
            text = c[0]["content"] if isinstance(c, list) else c
            assert (r is None) == (not text.strip())
            if r is not None:
                assert r == pytest.approx(scorer.score([p], [[text]])[0][0], abs=1e-5)


# ------------------------------------------------------------------ issue 35: the backend under hostile input

def _nan_head(tok):
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    with torch.no_grad():
        model.score.weight.fill_(float("nan"))  # every score NaN (as an overflowing head gives)
    return model


def test_nan_scores_are_counted_and_warned(tok):
    """RewardScorer and rerank: NaN scores are counted (last_stats.n_nonfinite) and named in one warning;
    nonfinite="count" counts without it."""
    import warnings

    s = RewardScorer(_nan_head(tok), tok)
    with pytest.warns(UserWarning, match=r"3 of 3 scores came out NaN or infinite \(responses conversation 0 "
                                         r"response 0, conversation 0 response 1, conversation 1 response 0\)"):
        got = s.score(["Hi", "Bye"], [["a", "b"], ["c"]])
    assert all(np.isnan(x) for r in got for x in r) and s.last_stats.n_nonfinite == 3
    with pytest.warns(UserWarning, match="came out NaN"):
        s.rerank("Hi", ["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.score(["Hi"], [["a"]], nonfinite="count")
    assert s.last_stats.n_nonfinite == 1


def test_grpo_adapter_never_feeds_nan_to_trl(tok):
    """The adapter's rule: a NaN reward raises (TRL's nansum would train on it as 0); nonfinite="warn" gives
    None with a warning; empty completions stay None."""
    reward = rmfast_reward((_nan_head(tok), tok))
    with pytest.raises(UserError, match=r"2 of 2 scores came out NaN .*\(completions 0, 1\).*TRL would sum"):
        reward(prompts=["Hi", "Hi"], completions=["a", "b"])
    warn = rmfast_reward((_nan_head(tok), tok), nonfinite="warn")
    with pytest.warns(UserWarning, match=r"1 of 2 scores came out NaN .*given as None"):
        assert warn(prompts=["Hi", "Hi"], completions=["a", " "]) == [None, None]
    with pytest.raises(UserError, match="nonfinite='never'"):
        rmfast_reward((_nan_head(tok), tok), nonfinite="never")


def test_cli_score_nan_head_warns_and_counts(tok, tmp_path, capsys):
    folder = tmp_path / "rm"
    _nan_head(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    inp = tmp_path / "pairs.csv"
    pd.DataFrame({"p": ["Hi", "Hi", "Bye"], "r": ["a", "b", "c"]}).to_csv(inp, index=False)
    argv = ["score", inp, "--model", folder, "--prompt-column", "p", "--response-column", "r", "--dtype", "float32",
            "--device", "cpu", "--no-progress"]
    with pytest.warns(UserWarning, match=r"3 of 3 scores came out NaN or infinite \(table rows 0, 1, 2\).*n_nonfinite"):
        rc, _, err = run(argv, capsys)
    assert rc == 0, err
    out = tmp_path / "pairs.scores.parquet"
    assert pd.read_parquet(out)["score"].isna().all()
    import json

    assert json.loads((tmp_path / "pairs.scores.parquet.json").read_text())["n_nonfinite"] == 3
    rc, _, err = run(argv + ["--out", tmp_path / "x.csv"], capsys)  # Parquet bytes under a .csv name: refused
    assert one_line_error(rc, err) and "give a path ending in .parquet" in err, err
    assert not (tmp_path / "x.csv").exists()


def test_cli_score_system_column_with_message_prompts(tok, tmp_path, capsys):
    """--system-column applies to message-list prompts too (it was ignored: scores bit-equal to a run without
    it); a row whose messages already begin with another system message is refused in one line; a bad
    response is named by its table row."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    folder = tmp_path / "rm"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    msgs = [[{"role": "user", "content": "Greatest thing?"}], [{"role": "user", "content": "Name a fruit."}]]
    inp = tmp_path / "pairs.parquet"
    pd.DataFrame({"p": msgs, "r": ["Love", "A pear."], "sys": [SYSTEM, "Be brief."]}).to_parquet(inp)
    argv = ["score", inp, "--model", folder, "--prompt-column", "p", "--response-column", "r", "--dtype", "float32",
            "--device", "cpu", "--no-progress", "--system-column", "sys"]
    rc, _, err = run(argv, capsys)
    assert rc == 0, err
    got = pd.read_parquet(tmp_path / "pairs.scores.parquet")["score"].to_numpy()
    want = RewardScorer(model, tok).score([[{"role": "system", "content": s}, *m] for s, m in zip([SYSTEM, "Be brief."], msgs)],
                                          [["Love"], ["A pear."]])
    np.testing.assert_array_equal(got, np.array([w[0] for w in want], np.float32))
    clash = tmp_path / "clash.parquet"
    pd.DataFrame({"p": [msgs[0], [{"role": "system", "content": "Other."}, *msgs[1]]], "r": ["Love", "A pear."],
                  "sys": [SYSTEM, SYSTEM]}).to_parquet(clash)
    rc, _, err = run(["score", clash, *argv[2:]], capsys)
    assert one_line_error(rc, err) and "row 2: the prompt's messages begin with a system message" in err, err
    rows = tmp_path / "rows.csv"
    pd.DataFrame({"p": ["Hi", "Bye"] * 4, "r": ["a", "b", "c", "d", "e", "f", "g", "  "]}).to_csv(rows, index=False)
    rc, _, err = run(["score", rows, *argv[2:-2]], capsys)
    assert one_line_error(rc, err) and "row 8 (response column) is only whitespace" in err, err


def test_weights_changed_through_data_drop_the_cached_plans(tok):
    """p.data.mul_() bypasses the version counter: the sampled fingerprint still sees it, so the scores are
    the changed model's (equal to a fresh scorer's); clear_cache() drops every plan by hand."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, tok)
    before = s.score(CONVS[:2], RESPONSES[:2])
    with torch.no_grad():
        for p in model.model.layers[0].parameters():
            p.data.mul_(1.5)
    after = s.score(CONVS[:2], RESPONSES[:2])
    fresh = RewardScorer(model, tok).score(CONVS[:2], RESPONSES[:2])
    assert after == fresh and after != before
    assert s.last_stats.prompt_passes == 2  # both prompts encoded again
    s.score(CONVS[:2], RESPONSES[:2])
    assert s.last_stats.prompt_passes == 0 and s.last_stats.prompts_from_cache == 2
    s.clear_cache()
    s.score(CONVS[:2], RESPONSES[:2])
    assert s.last_stats.prompt_passes == 2


def test_a_chat_template_changed_on_a_live_scorer_drops_what_it_rendered():
    """tokenizer.chat_template changed between calls (a default system turn added): the cached splits and plans
    were the old template's. Every response was refused as one that "merges with the template", and a plan kept
    past its split scored the old conversation. Now the next call renders afresh: a fresh scorer's scores."""
    base = T.chatml_tokenizer()
    t = copy.deepcopy(base)
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    s = RewardScorer(model, t)
    before = s.score(CONVS[:1], RESPONSES[:1])
    t.chat_template = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nBe a strict judge.<|im_end|>\n"
                       "{% endif %}" + T.CHATML)
    after = s.score(CONVS[:1], RESPONSES[:1])
    assert after == RewardScorer(model, t).score(CONVS[:1], RESPONSES[:1]) and after != before
    assert after == RewardScorer(model, base, template=t.chat_template).score(CONVS[:1], RESPONSES[:1])
    assert s.last_stats.prompt_passes == 1
    # score_rendered first after a change (its facts were cached for good), and the scorer's own template set live
    lm, msgs = T.tiny("llama", "causal_lm"), [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    s = RewardScorer(lm, base, head="logprob")
    s.score_rendered([base.apply_chat_template(msgs, tokenize=False)])
    old_template = base.chat_template
    base.chat_template = T.CHATML.replace("'<|im_end|>' + '\\n'", "'<|im_end|>' + '\\n\\n'")  # a blank line after
    try:
        texts = [base.apply_chat_template(msgs, tokenize=False)]
        assert texts[0].endswith("<|im_end|>\n\n")
        assert s.score_rendered(texts) == RewardScorer(lm, base, head="logprob").score_rendered(texts)
    finally:
        base.chat_template = old_template
    s = RewardScorer(model, base)
    s.score(CONVS[:1], RESPONSES[:1])
    s.template = "User: {prompt}\nAssistant: {response}"
    assert s.score(CONVS[:1], RESPONSES[:1]) == RewardScorer(model, base, template=s.template).score(CONVS[:1],
                                                                                                      RESPONSES[:1])


def test_the_kept_fingerprint_sees_what_a_fresh_one_sees():
    """WeightsWatch (a scorer's check at every call) keeps each parameter's sample view between calls: after each
    kind of change (an edit through .data of a contiguous and of a non-contiguous parameter, a swapped tensor, a
    cast, nothing) it equals a fresh weights_fingerprint, and it changes exactly when that does."""
    from rmfast.scoring.weights import WeightsWatch, weights_fingerprint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Linear(30, 2))
    model[1].weight = torch.nn.Parameter(torch.randn(30, 2).t())  # (2, 30), not contiguous
    watch = WeightsWatch()
    last = watch(model)
    assert last == weights_fingerprint(model) and watch(model) == last  # nothing changed: equal
    edits = [lambda: model[0].weight.data.mul_(2),  # bypasses the version counter; read through the kept view
             lambda: model[1].weight.data.add_(1),  # a non-contiguous parameter: sampled afresh
             lambda: setattr(model[0].bias, "data", model[0].bias.data + 1),  # new storage
             lambda: model[0].to(torch.bfloat16)]  # another dtype: a group of its own
    for i, edit in enumerate(edits):
        with torch.no_grad():
            edit()
        now = watch(model)
        assert now == weights_fingerprint(model) and now != last, f"edit {i}"
        last = now


def test_a_tokenizer_of_another_model_is_one_line(tok):
    """RewardScorer((model, other_tokenizer)): an id past the model's embedding is refused naming both sizes
    (it was an IndexError inside the forward)."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    model.resize_token_embeddings(64)  # the tokenizer's ids go up to 49,151
    s = RewardScorer((model, tok))
    with pytest.raises(UserError, match=r"the tokenizer gives id \d+ \(conversation 0\), but the model's embedding has "
                                        r"64 rows: the tokenizer \(49152 ids\) is not this model's"):
        s.score(["What is the greatest thing ever?"], [["Love"]])


def test_text_that_is_not_utf8_is_named_as_such(tok, tmp_path, capsys):
    """A lone surrogate (bytes that were not UTF-8) in a prompt or a response is named as bad text, not as a
    template that failed to render or a response that merges with the template."""
    s = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok)
    with pytest.raises(UserError, match=r"response 0 of conversation 0 is not valid text: a lone surrogate U\+D800"):
        s.score(["hi"], [["x \ud800 y"]])
    with pytest.raises(UserError, match=r"the prompt is not valid text: a lone surrogate U\+DCFF at character 4"):
        s.score(["bad \udcff prompt"], [["x"]])


def test_a_loaded_model_is_scored_as_it_is_and_keeps_its_mode(tok, recwarn):
    """Backend audit: a model passed in is never silently re-typed, moved or given a head (refused in one line),
    and a trainer's model keeps its training mode across a call (eval only inside it)."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    for kw, msg in [({"dtype": "float16"}, "dtype=float16 asked, but the model given is float32"),
                    ({"dtype": "fp64"}, "unknown dtype 'fp64'"),
                    ({"random_head_seed": 0}, "random_head_seed apply when RewardScorer loads the model"),
                    ({"dtpye": "float32"}, "dtpye apply when RewardScorer loads the model")]:
        with pytest.raises(UserError, match=msg):
            RewardScorer(model, tok, **kw)
    model.train()
    s = RewardScorer(model, tok, dtype="float32", device="cpu")  # what it is: accepted
    got = s.score(["Best?"], [["Love", "War"]])
    assert model.training and all(m.training for m in model.modules())  # the caller's mode, back
    model.eval()
    assert s.score(["Best?"], [["Love", "War"]]) == got  # scored in eval mode both times: no dropout
    assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]


def test_without_a_prompt_cache_the_layers_are_still_shared_across_calls(tok, monkeypatch):
    """cache_prompts=0 keeps no prompt encoding, but a call's plan still takes the layers (on CPU the fused weight
    copies) of the call before: they were rebuilt for every call."""
    import rmfast.scoring.scorer as S

    shared, real = [], S.plan_scoring
    monkeypatch.setattr(S, "plan_scoring", lambda *a, share_with=None, **k: shared.append(share_with) or
                        real(*a, share_with=share_with, **k))
    s = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok, cache_prompts=0)
    for prompt in ("One?", "Two?", "Three?"):
        s.score([prompt], [["yes"]])
    assert shared[0] is None and all(p is not None for p in shared[1:]) and not s._plans


def test_rerank_checks_k_first_and_takes_any_iterable(tok):
    s = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok)
    for k in (0, 1.5, "2"):
        with pytest.raises(UserError, match="k must be an integer >= 1"):
            s.rerank("Best?", ["a", "b"], k=k)
    best = s.rerank("Best?", (r for r in ["a", "b", "c"]), k=np.int64(2))
    assert [r.response for r in best] == [r.response for r in s.rerank("Best?", ["a", "b", "c"], k=2)]


def test_message_fields_beside_role_and_content_are_refused(tok):
    """A tool call (or a name) that the chat template would render, dropped, would change the score: refused."""
    s = RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=2), tok)
    conv = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": {}}}]},
            {"role": "user", "content": "So?"}]
    with pytest.raises(UserError, match=r"messages\[1\]: field\(s\) \['tool_calls'\] beside 'role' and 'content'"):
        s.score([conv], [["Sunny."]])


def test_the_backends_names_are_at_the_top_level():
    import rmfast

    for name in ("RewardScorer", "ScoringOptions", "ScoreStats", "Ranked", "rmfast_reward"):
        assert name in rmfast.__all__ and name in dir(rmfast)
        obj = getattr(rmfast, name)
        assert getattr(sys.modules[obj.__module__], name) is obj


def test_a_model_on_the_meta_device_is_refused_at_construction(tok):
    """Issue 50 item 3: a model whose weights were never loaded (on ``meta``) failed at the first score with
    ``NotImplementedError: Cannot copy out of meta tensor``; it is refused when the scorer is made, in one line."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2).to("meta")
    with pytest.raises(UserError, match=r"on the meta device \(its weights were never loaded\)") as e:
        RewardScorer((model, tok))
    assert "\n" not in str(e.value)


def _score_argv(inp, folder, *extra):
    return ["score", inp, "--model", folder, "--prompt-column", "p", "--response-column", "r", "--dtype", "float32",
            "--device", "cpu", "--no-progress", *extra]


def test_cli_score_system_cells_that_are_not_text_are_refused(rm_folder, tmp_path, capsys):
    """Issue 50 item 6: integers in --system-column were dropped (scores bit-equal to a run without the column, exit
    0) where a non-text response is refused; refused, naming the row. An empty cell is no system message."""
    inp = tmp_path / "t.parquet"
    pd.DataFrame({"p": ["Hi", "Bye"], "r": ["a", "b"], "sys": [3, 7]}).to_parquet(inp)
    rc, _, err = run(_score_argv(inp, rm_folder, "--system-column", "sys"), capsys)
    assert one_line_error(rc, err) and "row 1: the system message is int, not text" in err, err
    ok = tmp_path / "ok.parquet"
    pd.DataFrame({"p": ["Hi", "Bye"], "r": ["a", "b"], "sys": [None, ""]}).to_parquet(ok)
    rc, _, err = run(_score_argv(ok, rm_folder, "--system-column", "sys"), capsys)
    assert rc == 0, err


def test_cli_score_reads_jsonl_text_as_text(rm_folder, tmp_path, capsys):
    """Issue 50 item 9: numeric-looking strings in JSON Lines ("1", "2") were read as numbers and refused as
    "int, not text"; a JSON string is text, scored as the same text in a CSV is."""
    rows = [{"p": "Pick a number.", "r": "1"}, {"p": "Pick a number.", "r": "2"}]
    inp = tmp_path / "t.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, _, err = run(_score_argv(inp, rm_folder), capsys)
    assert rc == 0, err
    got = pd.read_parquet(tmp_path / "t.scores.parquet")
    csv = tmp_path / "t.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    rc, _, err = run(_score_argv(csv, rm_folder, "--out", tmp_path / "c.parquet"), capsys)
    assert rc == 0, err
    np.testing.assert_array_equal(got["score"], pd.read_parquet(tmp_path / "c.parquet")["score"])


def test_cli_score_refuses_a_column_named_twice(rm_folder, tmp_path, capsys):
    """Issue 50 item 10: a CSV with two 'r' columns was scored from the first without a word (pandas renamed the
    second 'r.1')."""
    inp = tmp_path / "t.csv"
    inp.write_text("p,r,r\nHi,a,b\n")
    rc, _, err = run(_score_argv(inp, rm_folder), capsys)
    assert one_line_error(rc, err) and "names column 'r' 2 times" in err, err


@pytest.mark.parametrize("body, holds", [('[{"p": "Hi", "r": "a"}]', None), ('["Hi", "a"]', "holds an array of str"),
                                         ('[["Hi", "a"]]', "holds an array of list"),
                                         ('{\n  "p": "Hi",\n  "r": "a"\n}\n', "is not JSON Lines")],
                         ids=["array-of-objects", "array-of-strings", "array-of-arrays", "one-object-over-lines"])
def test_cli_score_a_json_array(rm_folder, tmp_path, capsys, body, holds):
    """Issue 50 item 11: a .json file holding an array got "no column 'prompt'"; an array of objects is read (a row
    each), any other shape is one line saying what the file holds and which shapes are read."""
    inp = tmp_path / "t.json"
    inp.write_text(body)
    rc, _, err = run(_score_argv(inp, rm_folder), capsys)
    if holds is None:
        assert rc == 0, err
    else:
        assert one_line_error(rc, err) and holds in err and "rmfast reads JSON Lines" in err, err


def test_grpo_adapter_gives_none_for_a_completion_past_the_positions(tok):
    """Issue 50 item 8: a completion longer than the reward model's positions raised, against the adapter's rule
    ("a completion never stops training"): it gets None, with one warning, and the others their own scores."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    reward = rmfast_reward((model, tok))
    long = "x " * T.COMMON["max_position_embeddings"]
    with pytest.warns(UserWarning, match=r"1 of 3 completions are longer than the reward model's positions") as w:
        got = reward(prompts=["Hi", "Hi", "Bye"], completions=["Hello!", long, "See you."])
    assert len(w) == 1 and got[1] is None and None not in (got[0], got[2])
    assert [got[0], got[2]] == [s[0] for s in RewardScorer((model, tok)).score(["Hi", "Bye"], [["Hello!"], ["See you."]])]


def test_a_response_the_template_renders_as_nothing(tok):
    """A template that drops an assistant message's <think> block renders such a response as nothing. The strict
    path called it one that "merges with the template"; decode-retokenize's log-prob head summed every id to the
    end of the sequence (the '\\n' after <|im_end|> too). Now: the message says what happened, and the log-prob is
    the end of turn's, as for any response; the reward head reads the same whole sequence."""
    t = copy.deepcopy(tok)
    t.chat_template = ("{% for m in messages %}{% set c = m['content'] %}{% if m['role'] == 'assistant' and '</think>' "
                       "in c %}{% set c = c.split('</think>')[-1] %}{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + c"
                       " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                       "{% endif %}")
    conv, r = [{"role": "user", "content": "Capital of France?"}], "<think>It is Paris.</think>"
    model = T.tiny("llama", "causal_lm")
    with pytest.raises(UserError, match=r"response 0 of conversation 0 .* is rendered as nothing by the chat template"):
        RewardScorer(model, t, head="logprob").score([conv], [[r]])
    full = full_ids(t, conv, r)
    pre = t.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=False)
    pre = list(pre["input_ids"] if hasattr(pre, "keys") else pre)
    assert full[len(pre):] == t.convert_tokens_to_ids(["<|im_end|>", "Ċ"])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits[0].double(), -1)
    want = float(lp[len(pre) - 1, full[len(pre)]])  # log p(<|im_end|> | the conversation)
    got = RewardScorer(model, t, head="logprob", compat="decode-retokenize").score([conv], [[r]])[0]
    assert got == pytest.approx([want], abs=1e-4)
    rm = T.tiny("llama", num_labels=1, pad_token_id=2)
    got = RewardScorer(rm, t, compat="decode-retokenize").score([conv], [[r]])[0]
    assert got == pytest.approx(direct(rm, t, [conv], [[r]]).tolist(), abs=1e-5)


@pytest.mark.parametrize("norm, prompt", [("lowercase", "What is the capital of France?"),
                                          ("nfkc", "What is the ﬁnal answer, Ｈｉ?")])
def test_a_normalizing_tokenizer_is_split_not_refused(tok, norm, prompt):
    """An uncased tokenizer (a BERT-style classifier's) was refused for every template ("the template changes the
    response text": the probe decoded lower-cased), and a prompt an NFKC normalizer folds ('ﬁ', full-width letters)
    as "the prompt does not appear before the response slot". Both are split now, to the plain-HF scores."""
    from tokenizers import normalizers

    t = copy.deepcopy(tok)
    t.backend_tokenizer.normalizer = normalizers.Lowercase() if norm == "lowercase" else normalizers.NFKC()
    assert t.decode(t("Paris ﬁ")["input_ids"], skip_special_tokens=True).strip() != "Paris ﬁ"  # the case itself
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    responses = [["Paris.", "Lyon, I think"]]
    got = RewardScorer(model, t).score([prompt], responses)[0]
    assert got == pytest.approx(direct(model, t, [prompt], responses).tolist(), abs=1e-5)


def test_a_checkpoint_left_by_a_call_is_not_resumed_after_the_weights_changed(tok, tmp_path, monkeypatch):
    """An RL walk: a finished call's periodic checkpoint stayed on disk and the same call after an in-place weight
    change resumed from it: 2,518 of 3,000 rows came back with the old model's scores, silently. The checkpoint's key
    now holds the weights' sampled bits."""
    from rmfast.scoring import batching

    monkeypatch.setattr(batching, "CHECKPOINT_EVERY_N", 1)  # a save after every batch (a long call's periodic one)
    monkeypatch.setattr(batching, "CHECKPOINT_MIN_S", 0.0)
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    scorer = RewardScorer(model, tok, batch_size=2)
    ck = tmp_path / "ck.npz"
    texts = [["a", "b b", "c", "dd d", "e"]]
    first = scorer.score(["Hi"], texts, checkpoint=ck)
    assert ck.exists()  # what a finished call may leave behind
    with torch.no_grad():
        model.score.weight.mul_(-2)
    again = scorer.score(["Hi"], texts, checkpoint=ck)
    assert scorer.last_stats.resumed_rows == 0
    np.testing.assert_allclose(again[0], -2 * np.array(first[0]), rtol=1e-5, atol=1e-6)
    scorer.score(["Hi"], texts, checkpoint=ck)  # unchanged weights: the checkpoint resumes
    assert scorer.last_stats.resumed_rows > 0


def test_grpo_prompt_longer_than_the_model_gives_none_not_a_stop(tok):
    """An RL walk: a prompt past the RM's positions raised TooLong a second time inside the adapter's own handler,
    so the whole reward call failed (training stopped). Its completions are None now, with the one warning."""
    model = T.tiny("llama", num_labels=1, pad_token_id=2)
    reward = rmfast_reward(RewardScorer(model, tok))
    with pytest.warns(UserWarning, match="1 of 3 completions are longer"):
        got = reward(prompts=["Hi", "word " * 600, "Hi"], completions=["a", "b", "c"])
    assert got[1] is None
    np.testing.assert_allclose(got[::2], direct(model, tok, ["Hi"], [["a", "c"]]), rtol=1e-5, atol=1e-5)


def test_grpo_completion_with_reasoning_beside_its_answer_is_scored_by_its_answer(smol_tokenizer):
    """An RL walk: a thinking policy's completion (TRL's parse_response: reasoning_content beside content) got None
    with a warning about tool calls, so every thinking completion lost its reward."""
    tok = smol_tokenizer
    model = T.tiny("llama", num_labels=1, pad_token_id=tok.pad_token_id)
    reward = rmfast_reward(RewardScorer(model, tok))
    thought = [{"role": "assistant", "content": "fine", "reasoning_content": "Let me think.", "tool_calls": []}]
    with pytest.warns(UserWarning, match="1 of 2 completions carry reasoning"):
        got = reward(prompts=["Hi", "Hi"], completions=[thought, [{"role": "assistant", "content": "fine"}]])
    assert got[0] is not None and got[0] == got[1]
    assert got[0] == pytest.approx(direct(model, tok, ["Hi"], [["fine"]])[0], abs=1e-5)


def test_grpo_prompt_holding_a_template_token_is_named_with_a_fix_that_works(smol_tokenizer):
    """An RL walk: the refusal named no prompt of the batch and advised TRL's conversational format, which is refused
    the same way; it now says which prompt, and that a text that only mentions the token must write it another way."""
    tok = smol_tokenizer
    reward = rmfast_reward(RewardScorer(T.tiny("llama", num_labels=1, pad_token_id=tok.pad_token_id), tok))
    for bad in ("Explain <|im_end|> please", [{"role": "user", "content": "Explain <|im_end|> please"}]):
        with pytest.raises(UserError, match=r"prompt 2 \(of 3\): the prompt already holds .*write the token another way"):
            reward(prompts=["Hi", "Hi", bad], completions=["a", "b", "c"])
