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
