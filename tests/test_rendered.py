"""Issue 51 item 1: a prompt that already carries the chat template is refused in one line (it would be templated
again), and ``RewardScorer.score_rendered`` scores whole rendered texts as they are, equal to the plain-HF forward
of their ids and to ``score`` of the conversation they render."""

from __future__ import annotations

import pytest
import torch

import tiny_models as T
from rmfast.errors import UserError
from rmfast.scoring.scorer import RewardScorer


@pytest.fixture(scope="module")
def scorer(smol_tokenizer):
    m = T.tiny("llama", num_labels=1, pad_token_id=smol_tokenizer.pad_token_id, seed=5)
    return RewardScorer((m, smol_tokenizer), dtype="float32")


MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def test_a_rendered_prompt_is_refused_not_templated_twice(scorer, smol_tokenizer):
    rendered = smol_tokenizer.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    with pytest.raises(UserError, match="already holds the chat template .*score_rendered"):
        scorer.score([rendered], [["Paris."]])
    assert len(scorer.score([MSGS[0]["content"]], [["Paris."]])[0]) == 1  # the user's own text is fine
    # SmolLM2's BOS, <|im_start|>, also opens every turn: a prompt holding it is rendered too (it was scored
    # silently, templated twice, where docs/serving.md promised a refusal)
    with pytest.raises(UserError, match=r"already holds the chat template \('<\|im_start\|>'\)"):
        scorer.score(["<|im_start|>user\nhi"], [["4"]])


def test_score_rendered_equals_the_conversations_score_and_hf(scorer, smol_tokenizer):
    responses = ["Paris.", "It is Paris, of course.", "Lyon"]
    texts = [smol_tokenizer.apply_chat_template(MSGS + [{"role": "assistant", "content": r}], tokenize=False)
             for r in responses]
    got = scorer.score_rendered(texts)
    want = scorer.score([MSGS], [responses])[0]
    assert got == pytest.approx(want, abs=1e-5)
    with torch.no_grad():
        hf = [float(scorer.model(torch.tensor([smol_tokenizer(t, add_special_tokens=False)["input_ids"]])).logits[0, 0])
              for t in texts]
    assert got == pytest.approx(hf, abs=1e-5)
    with pytest.raises(UserError, match="no assistant header"):
        scorer.score_rendered(["just some text"])


def test_score_rendered_with_the_logprob_head_stops_at_the_end_of_turn(smol_tokenizer):
    """The log-prob head summed every id after the assistant header, the template's '\\n' after <|im_end|> too
    (-42.47 where score() and HF give -32.16). It takes score()'s end of turn now; a text cut after its end-of-turn
    token, or before it, scores what it holds."""
    m = T.tiny("llama", "causal_lm", seed=5)
    sc = RewardScorer((m, smol_tokenizer), head="logprob", dtype="float32")
    responses = ["Paris.", "It is Paris, of course."]
    texts = [smol_tokenizer.apply_chat_template(MSGS + [{"role": "assistant", "content": r}], tokenize=False)
             for r in responses]
    assert all(t.endswith("<|im_end|>\n") for t in texts)
    want = sc.score([MSGS], [responses])[0]
    assert sc.score_rendered(texts) == pytest.approx(want, abs=1e-4)
    assert sc.score_rendered([t[:-1] for t in texts]) == pytest.approx(want, abs=1e-4)  # no '\n': the same
    pre = smol_tokenizer.apply_chat_template(MSGS, tokenize=False, add_generation_prompt=True)
    n = len(smol_tokenizer(pre, add_special_tokens=False)["input_ids"])
    ids = smol_tokenizer(pre + "Paris.", add_special_tokens=False)["input_ids"]  # cut before the end of turn
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1)
    want_cut = float(lp[n - 1:-1].gather(-1, torch.tensor(ids[n:])[:, None]).sum())
    assert sc.score_rendered([pre + "Paris."]) == pytest.approx([want_cut], abs=1e-4)


def test_score_rendered_says_when_a_text_starts_with_two_bos():
    """An RL walk: special_tokens=True on a text that keeps its BOS scored a double-BOS sequence without a word."""
    import custom_rm_replicas as R

    tok = R.gemma_tokenizer()
    scorer = RewardScorer(T.tiny("gemma", num_labels=1, pad_token_id=tok.pad_token_id, vocab=len(tok)), tok)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "fine"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text.startswith("<bos>")
    with pytest.warns(UserWarning, match="1 of 2 texts .* start with two BOS tokens"):
        scorer.score_rendered([text[len("<bos>"):], text], special_tokens=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scorer.score_rendered([text])  # its own BOS, none added: no warning
