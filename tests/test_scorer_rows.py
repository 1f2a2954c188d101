"""What a RewardScorer records about its rows is what ran (a helper's review, /work/review48b.md): the rows and
share_batches decisions follow the head, the stats count the batches that ran packed or padded, a form asked for
runs or is refused before any work, and a length-dependent RoPE never sees a sequence longer than a real one.
Scores are checked against plain HF over each whole conversation (fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tiny_models as T
from rmfast.errors import UserError
from rmfast.fast import engine as E
from rmfast.fast.arch import arch_spec
from rmfast.scoring.hf_path import pad_token_as
from rmfast.scoring.scorer import RewardScorer, as_conversation, messages_of


@pytest.fixture(scope="module")
def tok():
    return T.chatml_tokenizer()


@torch.no_grad()
def _hf(model, tok, convs, responses) -> np.ndarray:
    """Plain HF over each whole conversation, read at its final position (the reference)."""
    out = []
    with pad_token_as(model, -1):
        for c, rs in zip(convs, responses):
            for r in rs:
                ids = tok.apply_chat_template(messages_of(as_conversation(c), r), tokenize=True, return_dict=False)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
                out.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
    return np.array(out)


def _gated():
    """A tiny ArmoRM-like model: a gated head (gating from the last <|im_start|>) on a tiny Llama."""
    from rmfast.fast.heads import GatedHead, GatingLayer
    from rmfast.loading.custom_heads import CustomRewardModel

    g = torch.Generator().manual_seed(0)
    head = GatedHead(regression=torch.randn(2, 64, generator=g), transform=torch.randn(2, 2, generator=g),
                     gating=[GatingLayer("linear", torch.randn(2, 64, generator=g))], temperature=1.0,
                     logit_scale=torch.ones(1), num_quantiles=1, pattern=(3,))
    return CustomRewardModel(T.tiny("llama", "causal_lm").model, head, "armorm").eval()


def _counting(monkeypatch, module, name: str) -> dict:
    calls, real = {"n": 0}, getattr(module, name)

    def counted(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_shared_batches_keep_a_long_rope_within_the_real_sequences(tok):
    """Phi-3's RoPE changes past 256 tokens (LongRoPE): a long prompt's short rows batched with a short prompt's
    longer rows made no sequence longer than the limit, yet each prompt's positions ran to the batch's longest row
    (a refusal naming a 258-token sequence). Each prompt's positions now end at its own longest row; the scores
    equal HF's."""
    model = T.tiny("phi3", num_labels=1)
    limit = arch_spec(model).rope_max_len
    sc = RewardScorer(model, tok, share_batches=True)
    longp = "w " * 93
    P = len(sc.template_for(as_conversation(longp)).prefix_ids)
    n = lambda c, r: len(sc.prepare([c], [[r]]).rows[0][1].ids)  # noqa: E731 - response tokens of r after c
    r_long = next("ab " * k for k in range(1, 40) if n(longp, "ab " * (k + 1)) + P + 2 > limit)
    r_short = next("ab " * k for k in range(1, 40) if n("Hi", "ab " * k) + P + 2 > limit)
    assert P + n(longp, r_long) + 2 <= limit  # the long conversation fits the limit
    convs, resp = [longp, "Hi"], [[r_long], [r_short]]
    got = np.array([x for s in sc.score(convs, resp) for x in s])
    np.testing.assert_allclose(got, _hf(model, tok, convs, resp), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["causal_lm", "gated"])
def test_heads_that_read_a_row_alone_are_not_recorded_as_sharing(tok, monkeypatch, kind):
    """A logprob or a gated head runs one conversation's rows of one length per batch: the decisions say so
    (share_batches False, rows one length per batch), whatever was asked, and nothing ran shared or packed."""
    from rmfast.scoring import plan as PL

    calls = _counting(monkeypatch, PL, "score_prompts")
    sc = RewardScorer(_gated() if kind == "gated" else T.tiny("llama", "causal_lm"), tok, attention="cascade",
                      share_batches=True)
    sc.score(["Hi", "Hello there"], [["a", "Love it", "The universe."], ["x", "kindness and more", "no"]])
    assert calls["n"] == 0 and sc.last_stats.packed_batches == 0
    assert sc.decisions["share_batches"]["value"] is False and "one length per batch" in sc.decisions["share_batches"]["reason"]
    assert sc.decisions["rows"]["value"] == "one length per batch"


def test_stats_count_the_batches_that_ran_packed(tok, monkeypatch):
    """Under a sliding window that the longest row passes, the wave's rows of every length still run packed (each
    token windowed by its own position): one packed batch, no pad token, the plain-HF scores."""
    monkeypatch.setitem(T.ARCHS["mistral"][1], "sliding_window", 40)
    model = T.tiny("mistral", num_labels=1)
    ran = _counting(monkeypatch, E, "_packed_rows_pass")
    sc = RewardScorer(model, tok, attention="cascade")
    convs, resp = ["Hi"], [["a", "Love", "ok", "abc", "The universe, obviously, and everything in it at once."]]
    got = np.array(sc.score(convs, resp)[0])
    np.testing.assert_allclose(got, _hf(model, tok, convs, resp), atol=1e-5, rtol=0)
    assert ran["n"] == sc.last_stats.packed_batches == 1 and sc.last_stats.padded_tokens == 0


def test_packed_batches_are_sized_in_tokens(tok, monkeypatch):
    """A packed group's batches hold as many rows as fit the tokens its batch size of longest rows would: one
    long row and many short ones at 4 rows per batch (auto's choice, here made 4) run in fewer batches than 4-row
    cuts, each within that budget, with the plain-HF scores. (A batch size the caller asks for caps the rows too:
    test_batch_size_one_scores_each_row_alone_in_the_packed_form.)"""
    model = T.tiny("llama", num_labels=1)
    ran = _counting(monkeypatch, E, "_packed_rows_pass")
    sc = RewardScorer(model, tok, attention="cascade")
    monkeypatch.setattr(sc.decided, "rows_per_batch", lambda *a, **k: 4)
    resp = [["a", "b", "c", "d", "e", "f", "g", "h", "ok", "no", "yes",
             "The universe, obviously, and everything in it at once, as long as it takes to say."]]
    got = np.array(sc.score(["Hi"], resp)[0])
    np.testing.assert_allclose(got, _hf(model, tok, ["Hi"], resp), atol=1e-5, rtol=0)
    st = sc.last_stats
    assert st.n_batches == ran["n"] == st.packed_batches < -(-len(resp[0]) // 4) and st.padded_tokens == 0


def test_a_form_that_cannot_run_as_asked_is_refused_before_any_work(tok, monkeypatch):
    """The block-diagonal form reads one prompt's packed keys per batch: asked for with shared batches, it would
    have run another form under its own name (refused now); the Triton form on a CPU without Triton's interpreter
    failed at the first batch (refused now, in one line naming the fix)."""
    model = T.tiny("llama", num_labels=1)
    with pytest.raises(UserError, match="share_batches=False"):
        RewardScorer(model, tok, attention="block-diagonal", share_batches=True)
    sc = RewardScorer(model, tok, attention="block-diagonal")  # auto: no sharing on CPU; the form runs as recorded
    from rmfast.fast import ops

    bd = _counting(monkeypatch, ops, "shared_prefix_attention_blockdiag")
    sc.score(["Hi", "Hello there"], [["a", "Love it"], ["x", "kindness"]])
    assert sc.last_stats.attention == "block-diagonal" and bd["n"] > 0
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UserError, match="needs CUDA") as e:
        RewardScorer(model, tok, attention="triton")
    assert "attention='triton'" in str(e.value) and "--attention triton" in e.value.cli_message()
    monkeypatch.setenv("RMFAST_KERNELS", "triton")
    with pytest.raises(UserError, match="RMFAST_KERNELS=triton: Triton kernels need CUDA"):
        RewardScorer(model, tok)


def test_a_bidirectional_gemma3_takes_the_plain_hf_path(tok):
    """A Gemma 3 config with use_bidirectional_attention (EmbeddingGemma-style: every token attends to every other)
    was taken onto the fast path, causal by construction: its scores were another model's, off by ~0.1 on a tiny
    model, with no word. Now it is not on the fast path: auto takes the plain-HF path with a line saying why, and
    --engine fast is refused."""
    from rmfast.fast.arch import bidirectional

    m = T.tiny("gemma3", num_labels=1, pad_token_id=tok.pad_token_id, seed=0)
    m.config.use_bidirectional_attention = True
    for layer in m.model.layers:  # as a model built from such a config has it
        layer.self_attn.is_causal = False
    assert bidirectional(m.config) and arch_spec(m) is None
    prompt, resps = "What is the best thing?", ["Love", "A cup of tea.", "x" * 20]
    with pytest.warns(UserWarning, match="'gemma3_text' with bidirectional attention .* is not on the fast path"):
        sc = RewardScorer(m, tok, dtype="float32", device="cpu")
        got = np.asarray(sc.score([prompt], [resps])[0])
    assert np.abs(got - _hf(m, tok, [prompt], [resps])).max() < 1e-5
    with pytest.raises(UserError, match="bidirectional attention"):
        RewardScorer(m, tok, dtype="float32", device="cpu", engine="fast")


def test_batch_size_one_scores_each_row_alone_in_the_packed_form(tok):
    """docs/backend.md: "batch_size=1 makes every score independent of the rest of the call". In the packed cascade
    form (CUDA's form for texts) a batch was sized in tokens only (batch_size x the longest row), so short rows were
    packed together and their last bits moved with the call (6 of 8 here). A batch size asked for now caps a packed
    batch's rows too; auto still packs by tokens."""
    m = T.tiny("llama", num_labels=1, pad_token_id=tok.pad_token_id, seed=7)
    prompt = "What, in one word, is the greatest thing ever? " * 3
    resps = [" ".join(["word"] * n) for n in (1, 60, 5, 32, 17, 50, 3, 25)]
    sc = RewardScorer(m, tok, dtype="float32", device="cpu", batch_size=1, attention="cascade")
    whole = sc.score([prompt], [resps])[0]
    assert sc.last_stats.n_batches == len(resps)
    alone = [sc.score([prompt], [[r]])[0][0] for r in resps]
    assert np.array_equal(np.asarray(alone), np.asarray(whole))
    two = RewardScorer(m, tok, dtype="float32", device="cpu", batch_size=2, attention="cascade")
    two.score([prompt], [resps])
    assert two.last_stats.n_batches == 4
    auto = RewardScorer(m, tok, dtype="float32", device="cpu", attention="cascade")
    assert np.abs(np.asarray(auto.score([prompt], [resps])[0]) - whole).max() < 1e-5 and auto.last_stats.n_batches == 1
