"""The template split: prefix + tokens(word) + suffix == apply_chat_template(tokenize=True)."""

import pytest

from rmfast.errors import UserError
from rmfast.template import build_template, response_ids

PROMPT = "What, in one word, is the greatest thing ever?"


def chat_ids(tok, prompt, response, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return list(tok.apply_chat_template(msgs, tokenize=True, return_dict=False))


@pytest.mark.parametrize("word", ["love", "freedom", "Pizza", "42"])
def test_split_matches_apply_chat_template(smol_tokenizer, word):
    tok = smol_tokenizer
    t = build_template(tok, PROMPT)
    full = chat_ids(tok, PROMPT, word)
    mid = tok.encode(word, add_special_tokens=False)
    assert list(t.prefix_ids) + mid + list(t.suffix_ids) == full
    assert response_ids(tok, t, word) == mid


def test_chatml_pieces(smol_tokenizer):
    tok = smol_tokenizer
    t = build_template(tok, PROMPT, system="Be brief.")
    assert tok.decode(list(t.prefix_ids)).endswith("<|im_start|>assistant\n")
    assert "Be brief." in tok.decode(list(t.prefix_ids))
    assert tok.decode(list(t.suffix_ids)) == "<|im_end|>\n"
    assert t.continuation_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)  # end of turn, not the newline
    # the candidate goes in by id, exactly once, with no second BOS or re-tokenization
    assert t.sequence([123]) == [*t.prefix_ids, 123, *t.suffix_ids]


def test_plain_format(smol_tokenizer):
    tok = smol_tokenizer
    t = build_template(tok, PROMPT, template="User: {prompt}\nAssistant: {response}")
    assert t.kind == "plain" and t.suffix_ids == () and t.n_continuation == 0
    full = tok("User: " + PROMPT + "\nAssistant: love")["input_ids"]
    assert list(t.prefix_ids) + response_ids(tok, t, "love") + list(t.suffix_ids) == full
    t2 = build_template(tok, PROMPT, template="User: {prompt}\nAssistant: {response}\n")
    assert tok.decode(list(t2.suffix_ids)) == "\n" and t2.n_continuation == 1


def test_plain_format_with_an_unknown_placeholder_is_refused(smol_tokenizer):
    """{foo} (a typo of {prompt}, say) was scored as literal text: refused, naming it (issue 35)."""
    with pytest.raises(UserError, match=r"template has the placeholder \{foo\}, which a plain format does not fill"):
        build_template(smol_tokenizer, PROMPT, template="{foo} User: {prompt}\nAssistant: {response}")


def test_jinja_template(smol_tokenizer):
    jinja = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    t = build_template(smol_tokenizer, PROMPT, template=jinja)
    assert t.kind == "jinja"
    assert "You are a helpful" not in smol_tokenizer.decode(list(t.prefix_ids))  # no default system turn


def test_errors(smol_tokenizer):
    tok = smol_tokenizer
    with pytest.raises(UserError, match="prompt is empty"):
        build_template(tok, "   ")
    with pytest.raises(UserError, match="cannot split"):  # a template that rewrites the response
        build_template(tok, PROMPT, template="{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}")
    with pytest.raises(UserError, match="no \\{system\\} placeholder"):
        build_template(tok, PROMPT, template="Q: {prompt} A: {response}", system="x")
    saved = tok.chat_template
    try:
        tok.chat_template = None
        with pytest.raises(UserError, match="no chat template"):
            build_template(tok, PROMPT)
    finally:
        tok.chat_template = saved


# ------------------------------------------------------------------ templates that would run for minutes (issue 25)

TURNS = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
HOSTILE = {  # each renders a valid conversation after its detour (unbounded: seconds to hours, or gigabytes)
    "nested-loops": ("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}",
                     "render time limit of 2 s"),
    "huge-range": ("{% for i in range(10**9) %}{% endfor %}", "range of 1,000,000,000 items, over the limit of 100,000"),
    "doubling": ("{% set ns = namespace(s='x') %}{% for i in range(27) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 "string of 2,097,152 characters, over the size limit of 2,000,000"),
    "repetition": ("{% set s = 'x' * 10**8 %}", "over the size limit of 2,000,000"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_template_over_the_render_bounds_is_refused(case, smol_tokenizer, monkeypatch):
    """Looping or string-building templates are refused in one UserError naming the bound. The render
    clock is replaced by one that advances 1 ms per reading, so the time bound does not depend on this
    machine's speed (the nested loops stop after about 2,000 items, not 9 million)."""
    import itertools

    from rmfast import template

    ticks = itertools.count()
    monkeypatch.setattr(template, "_clock", lambda: next(ticks) * 0.001)
    detour, words = HOSTILE[case]
    with pytest.raises(UserError, match="the chat template") as e:
        build_template(smol_tokenizer, PROMPT, template=detour + TURNS)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bounds_leave_real_templates_alone(smol_tokenizer):
    """The model's own template, and one with transformers' {% generation %} tag, pass the bounded render and
    split as before (the bounded render is only a check; transformers' render is what is scored)."""
    tagged = TURNS.replace("{{ m['content'] }}", "{% generation %}{{ m['content'] }}{% endgeneration %}")
    mid = smol_tokenizer.encode("love", add_special_tokens=False)
    own = build_template(smol_tokenizer, PROMPT)
    assert list(own.prefix_ids) + mid + list(own.suffix_ids) == chat_ids(smol_tokenizer, PROMPT, "love")
    assert response_ids(smol_tokenizer, build_template(smol_tokenizer, PROMPT, template=tagged), "love") == mid


def test_end_of_turn_flagged_special_but_unnamed_ends_the_continuation():
    """A GGUF-converted tokenizer (the embedded Gemma 3's) flags its end-of-turn token special in
    ``added_tokens_decoder`` but lists it in no special-token attribute, so it is not in ``all_special_ids``.
    The log-prob head scored the template's '\\n' after it too (1-2.5 nats, response-dependent), and engine='hf'
    shares the template, so only a reference over the whole conversation sees it."""
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import tiny_models as T
    from rmfast import RewardScorer

    named = T.chatml_tokenizer()
    tk = Tokenizer(models.BPE(vocab=dict(named.get_vocab()), merges=[]))
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False)
                           for s in ("<|endoftext|>", "<|im_end|>", "<|pad|>", "<|im_start|>")])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>")  # no eos / extra names
    tok.chat_template = T.CHATML
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert end not in tok.all_special_ids and tok.added_tokens_decoder[end].special  # the case itself
    t = build_template(tok, PROMPT)
    assert tok.convert_ids_to_tokens(list(t.suffix_ids)) == ["<|im_end|>", "Ċ"] and t.n_continuation == 1

    class Wrapped:  # a delegating wrapper (the second recheck: its class has no added_tokens_decoder of its own)
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

        def __len__(self):
            return len(self._inner)

        def __call__(self, *a, **kw):
            return self._inner(*a, **kw)

    assert build_template(Wrapped(tok), PROMPT).n_continuation == 1

    model = T.tiny("llama", "causal_lm")
    texts = ["love", " a very long answer", "x"]
    pre = len(build_template(tok, PROMPT).prefix_ids)
    want = []
    for text in texts:
        ids = T.chat_ids(tok, PROMPT, text)
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        terms = lp[pre - 1:len(ids) - 1].gather(-1, torch.tensor(ids[pre:])[:, None])[:, 0]
        want.append(float(terms[:-1].sum()))  # the response and <|im_end|>, not the '\n' after it
    for engine in ("fast", "hf"):
        got = RewardScorer((model, tok), head="logprob", engine=engine).score([PROMPT], [texts])[0]
        assert got == pytest.approx(want, abs=1e-3), engine
