"""One definition each (issue 34, item 4): the next-token log-softmax, the model dimensions a config
gives, the results' shared table methods and the "rows of several lengths or prompts may share a batch"
rule are each written once, and every caller uses that one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import tiny_models as T
from rmfast.fast import ops

SRC = Path(__file__).resolve().parents[1] / "src" / "rmfast"
PROMPT = "What, in one word, is the greatest thing ever?"


# ----------------------------------------------------------------------------- the next-token log-softmax

@pytest.fixture(scope="module")
def chatml():
    return T.chatml_tokenizer()


@pytest.mark.parametrize("arch", ["llama", "gemma2"])  # gemma2: final_logit_softcapping 3.0
def test_engine_and_logprobs_take_the_one_log_softmax_and_agree(arch, chatml, monkeypatch):
    """The engine's prompt pass and ``rmfast logprobs`` both end in :func:`rmfast.fast.ops.vocab_logprobs`
    (a spy sees each call), and give the same log-probabilities of the prompt's next token."""
    from rmfast.fast.engine import Engine
    from rmfast.logprobs import logprobs
    from rmfast.template import build_template

    seen = []
    real = ops.vocab_logprobs

    def spy(logits, **kw):
        seen.append((tuple(logits.shape), kw.get("final_softcap")))
        return real(logits, **kw)

    monkeypatch.setattr(ops, "vocab_logprobs", spy)
    m = T.tiny(arch, "causal_lm", seed=3)
    tmpl = build_template(chatml, PROMPT)
    eng = Engine(m, tmpl, head="logprob")
    assert seen == [((T.VOCAB,), m.config.final_logit_softcapping if arch == "gemma2" else None)]
    res = logprobs(m, chatml, PROMPT)
    assert res.manifest["template"]["prefix_ids"] == list(tmpl.prefix_ids)
    assert seen[1] == ((T.VOCAB,), None)  # HF's forward applied the model's own softcap
    torch.testing.assert_close(torch.from_numpy(res.scores), eng.prefix_logprobs, atol=2e-5, rtol=0)


def test_vocab_logprobs_is_fp32_and_softcaps_before_the_softmax():
    x = torch.tensor([[0.5, -2.0, 9.0]], dtype=torch.bfloat16)
    out = ops.vocab_logprobs(x, final_softcap=3.0)
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.log_softmax(torch.tanh(x.float() / 3.0) * 3.0, dim=-1))
    assert torch.equal(ops.vocab_logprobs(x), torch.log_softmax(x.float(), dim=-1))


def test_no_other_next_token_log_softmax():
    """The engine and logprobs compute no log-softmax of their own (their docstrings may name it)."""
    for rel in ("fast/engine.py", "logprobs.py"):
        calls = [n for n in ast.walk(ast.parse((SRC / rel).read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) in
                 ("log_softmax", "logsumexp")]
        assert not calls, rel


def test_logprobs_refuses_what_the_scan_refuses_in_its_own_words(chatml):
    """logprobs' head check is the scan's (:func:`rmfast.scoring.plan.choose_head`), its message its own."""
    from rmfast.errors import UserError
    from rmfast.logprobs import logprobs
    from rmfast.scoring.plan import choose_head

    clf = T.tiny("llama", "classifier")
    with pytest.raises(UserError, match="--head logprob needs a causal language model"):
        choose_head(clf, "logprob", 0)
    with pytest.raises(UserError, match=r"^logprobs needs a causal language model; this model has no LM head$"):
        logprobs(clf, chatml, PROMPT)
