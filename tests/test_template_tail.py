"""The tail path of responses_ids (rmfast.template_tail): the ids before a cut inside the prompt are reused and
only each conversation's tail is tokenized. It must give exactly what tokenizing every whole conversation
gives (``_responses_ids_whole``: ids equal, None where that is None), run where a cut is established, and fall
back where it is not."""

import random

import pytest
import tiny_models
from tokenizers import AddedToken

from rmfast import template_tail as TT
from rmfast.errors import UserError
from rmfast.bench.random_init import FAMILIES, synthetic_tokenizer
from rmfast.template import _responses_ids_whole, build_template, responses_ids, tail_plan

PROMPT = "What, in one word, is the greatest thing ever?"

#: responses the tail must treat exactly as the whole path does: empty, whitespace at either end, special-token
#: text (ChatML's, Gemma's, Llama 3's), unicode, one long one
TEXTS = ["love", "", " love", "love ", "  ", "\n", "\n\nlove\n", "\tx", "Sure! <|im_end|> then", "<|im_end|>",
         "<|im_start|>assistant\nhi", "<start_of_turn>model\n", "<end_of_turn>", "<|eot_id|><|start_header_id|>",
         "café — 日本語 🙂 naïve", "Ünïcødé\u200b zero-width", "x" * 3000, " ".join(["word"] * 400)]

GEMMA_CHAT = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else "
              "m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
               "{{ m['content'] | trim }}<|eot_id|>{% endfor %}")


@pytest.fixture(autouse=True)
def _plan_at_once(monkeypatch):
    """Plan every template on its first call (the short prompts here would otherwise wait for more texts)."""
    monkeypatch.setattr(TT, "PLAN_AFTER_TOKENS", 0)
    TT.counts.clear()


def _embedded_tokenizer(alias: str):
    """An embedded model's tokenizer alone (its converted folder; no weights loaded), or a skip."""
    try:
        from transformers import AutoTokenizer

        from rmfast.loading.loader import _converted
        from rmfast.loading.sources import cache_root, embedded

        cache = cache_root()
        folder, _ = _converted(embedded(alias).gguf_path(cache), cache, check_header=False)
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # the packages are test dependencies: say which is missing
        pytest.skip(f"embedded {alias} unavailable: {e}")


@pytest.fixture(scope="module")
def smol():
    return _embedded_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def gemma():
    return _embedded_tokenizer("gemma3-270m")


def _family_tokenizer(fam: str, chat_template=None):
    f = FAMILIES[fam]
    return synthetic_tokenizer(1024, bos=f["bos"], eos=f["eos"], pad=f["pad"], extra=f["extra"], chat_template=chat_template)


def _long_prompt(n_words: int = 1500) -> str:
    rng = random.Random(0)
    words = ["the", "best", "thing", "is", "love", "and", "a", "good", "meal,", "perhaps", "music.", "Why?", "\n"]
    return PROMPT + " " + " ".join(rng.choice(words) for _ in range(n_words))


def _same(tok, tmpl, texts=TEXTS, *, tail: bool = True):
    """Both paths on ``texts``: equal ids (None where None), and the tail path ran on all of them (or none)."""
    TT.counts.clear()
    fast = responses_ids(tok, tmpl, texts)
    ran = dict(TT.counts)
    assert fast == _responses_ids_whole(tok, tmpl, texts)
    assert ran.get("tail", 0) == (len(texts) if tail else 0), (ran, tail_plan(tok, tmpl))
    assert ran.get("whole", 0) == (0 if tail else len(texts))
    return fast


# --------------------------------------------------------------------------------------------
# real tokenizers


@pytest.mark.parametrize("case", ["plain_prompt", "system", "history", "long"])
def test_smollm2_chatml(smol, case):
    kw = {"system": dict(system="Be brief. <|im_end|> is not the end."), "history": dict(
        history=(("user", "Hi!"), ("assistant", " Hello <|im_start|> there\n"))), "long": {}, "plain_prompt": {}}[case]
    prompt = _long_prompt() if case == "long" else PROMPT
    t = build_template(smol, prompt, **kw)
    plan = tail_plan(smol, t)
    assert isinstance(plan, TT.TailCut), plan
    assert plan.prefix_text[plan.cut:] == "<|im_start|>assistant\n"  # the cut: at the start of the last header
    out = _same(smol, t)
    assert out[0] == smol.encode("love", add_special_tokens=False)


def test_smollm2_prompt_with_special_token_text(smol):
    """A prompt holding special-token text: the template's own headers still cut (the last one before the slot)."""
    t = build_template(smol, "Say <|im_end|>\n<|im_start|>assistant\nok? " + PROMPT)
    assert isinstance(tail_plan(smol, t), TT.TailCut)
    _same(smol, t)


def test_smollm2_plain_format_falls_back(smol):
    """``User: {prompt}\\nAssistant: {response}``: nothing but ordinary text before the slot, no cut."""
    t = build_template(smol, PROMPT, template="User: {prompt}\nAssistant: {response}")
    assert "no added token" in tail_plan(smol, t)
    _same(smol, t, tail=False)


def test_gemma3_chat_template(gemma):
    """Gemma's newline is an added token: the cut is the newline after ``model`` (a response that starts with a
    newline makes ``\\n\\n`` there, in the tail as in the whole conversation)."""
    for kw in ({}, {"system": "Be brief."}, {"history": (("user", "Hi"), ("assistant", "Hello\n\n"))}):
        t = build_template(gemma, PROMPT, template=GEMMA_CHAT, **kw)
        plan = tail_plan(gemma, t)
        assert isinstance(plan, TT.TailCut), plan
        assert plan.head_ids[0] == gemma.bos_token_id
        _same(gemma, t)
    _same(gemma, build_template(gemma, _long_prompt(), template=GEMMA_CHAT))


def test_gemma3_plain_falls_back(gemma):
    """Gemma's plain default: the cut at the prompt's newline would be a boundary, but ``Assistant: `` ends in a
    space that merges with the response (``:▁`` vs ``▁hello``), so the prefix text's ids are not the template's
    prefix ids: the check refuses it and the whole path runs."""
    t = build_template(gemma, PROMPT, template="User: {prompt}\nAssistant: {response}")
    assert "prefix ids" in tail_plan(gemma, t)
    _same(gemma, t, tail=False)


# --------------------------------------------------------------------------------------------
# generated tokenizers


def test_tiny_models_chatml():
    tok = tiny_models.chatml_tokenizer()
    for kw in ({}, {"system": "S"}, {"history": (("user", "a"), ("assistant", "b"))}):
        _same(tok, build_template(tok, PROMPT, **kw))
    _same(tok, build_template(tok, _long_prompt()))


@pytest.mark.parametrize("fam, chat", [("llama", LLAMA3_CHAT), ("gemma2", GEMMA_CHAT), ("qwen3", tiny_models.CHATML)])
def test_random_init_families_chat(fam, chat):
    tok = _family_tokenizer(fam, chat)
    t = build_template(tok, PROMPT, system="Be brief.")
    assert isinstance(tail_plan(tok, t), TT.TailCut), tail_plan(tok, t)
    _same(tok, t)


#: plain formats whose only special token is the family's end of turn, after the response (the bench's before it
#: gave its random-init models their family's chat template)
PLAIN = {fam: "User: {prompt}\nAssistant: {response}" + f["eos"] + ("" if fam == "llama" else "\n")
         for fam, f in FAMILIES.items()}


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_random_init_families_default_is_the_tail_path(fam):
    """The bench's random-init tokenizers carry their family's chat template (no default plain format), so a
    best-of-N benchmark tokenizes as with a real reward model: the response's tail alone, the same ids."""
    from rmfast.bench.random_init import random_init_model

    lm = random_init_model({"llama": "llama-3.1-8b", "gemma2": "gemma-2-9b", "qwen3": "qwen3-8b"}[fam], layers=1,
                           tiny=True, dtype="float32")
    assert lm.default_template is None and lm.tokenizer.chat_template == FAMILIES[fam]["chat_template"]
    t = build_template(lm.tokenizer, PROMPT)
    assert len(t.suffix_ids) == FAMILIES[fam]["suffix"]
    assert isinstance(tail_plan(lm.tokenizer, t), TT.TailCut), tail_plan(lm.tokenizer, t)
    _same(lm.tokenizer, t)
    _same(lm.tokenizer, build_template(lm.tokenizer, _long_prompt(), system="Be brief."))


@pytest.mark.parametrize("fam", sorted(FAMILIES))
def test_random_init_families_plain_falls_back(fam):
    """Plain formats: the only special token is after the response, so no cut, the whole path."""
    tok = _family_tokenizer(fam)
    t = build_template(tok, PROMPT, template=PLAIN[fam])
    assert "no added token" in tail_plan(tok, t)
    _same(tok, t, tail=False)


def test_plain_format_with_special_token_in_prompt():
    """A plain format whose prompt holds a special token cuts there; the BOS the whole path adds leads the head."""
    tok = _family_tokenizer("llama")
    t = build_template(tok, "<|start_header_id|>" + PROMPT, template=PLAIN["llama"])
    plan = tail_plan(tok, t)
    assert isinstance(plan, TT.TailCut), plan
    assert plan.prefix_text[plan.cut:].startswith("<|start_header_id|>What") and plan.head_ids[0] == tok.bos_token_id
    assert plan.head_ids[1:] == tuple(tok.encode("User: ", add_special_tokens=False))
    _same(tok, t)


def test_metaspace_first_cut_at_token_start():
    """A Metaspace pre-tokenizer that prepends "▁" only at offset 0: a tail cut AFTER the header token would
    start at offset 0 and gain a "▁"; cut at the token's start, the piece after it is never at offset 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "▁", "é", "日", "本", "語"]
    vocab = {s: i for i, s in enumerate(specials + list(dict.fromkeys(chars)))}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="<|im_end|>", unk_token="<unk>")
    tok.chat_template = tiny_models.CHATML
    t = build_template(tok, PROMPT)
    plan = tail_plan(tok, t)
    assert isinstance(plan, TT.TailCut), plan
    after = plan.cut + len("<|im_start|>")
    assert tok.encode(plan.prefix_text[after:], add_special_tokens=False)[0] == vocab["▁"]  # why not cut there
    _same(tok, t)


def test_lstrip_token_is_not_a_cut():
    """An added token that strips the whitespace to its left would take it from the head's side of the cut: the
    cut goes to the added token before it instead (the end of the user turn)."""
    tok = tiny_models.chatml_tokenizer()
    tok.backend_tokenizer.add_special_tokens([AddedToken("<|im_start|>", special=True, lstrip=True, normalized=False)])
    assert tok.added_tokens_decoder[3].lstrip
    t = build_template(tok, PROMPT)
    plan = tail_plan(tok, t)
    assert isinstance(plan, TT.TailCut) and plan.prefix_text[plan.cut:].startswith("<|im_end|>"), plan
    _same(tok, t)


def test_token_across_the_cut_falls_back():
    """An added token that would match from before the cut into the response (here one that swallows the header
    and a response's first word): the prefix text alone cannot show it, so there is no cut."""
    tok = tiny_models.chatml_tokenizer()
    tok.backend_tokenizer.add_special_tokens([AddedToken("\n<|im_start|>assistant\nSure", special=True, normalized=False)])
    t = build_template(tok, PROMPT)
    assert "across the cut" in tail_plan(tok, t)
    _same(tok, t, ["Sure thing", "love"], tail=False)


def test_split_special_tokens_falls_back():
    tok = tiny_models.chatml_tokenizer()
    tok.split_special_tokens = True  # special tokens encoded as their text: no boundary at them
    t = build_template(tok, PROMPT)
    assert "split_special_tokens" in tail_plan(tok, t)
    _same(tok, t, ["love", "<|im_end|>"], tail=False)


def test_tokenizer_subclass_that_rewrites_text_falls_back():
    tok = tiny_models.chatml_tokenizer()

    class Rewrites(type(tok)):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    tok.__class__ = Rewrites
    t = build_template(tok, PROMPT)
    assert "overrides _encode_plus" in tail_plan(tok, t)
    _same(tok, t, ["love"], tail=False)


def test_conversation_that_renders_the_prompt_differently_takes_the_whole_path():
    """A template that renders the turns before the response differently for some responses: those texts do not
    start with the prefix text, so they (only) take the whole path; a merged response stays None."""
    tok = tiny_models.chatml_tokenizer()
    tmpl_src = ("{% for m in messages %}{% if m['role'] == 'user' and 'PING' in messages[-1]['content'] %}"
                "<|im_start|>note\nping<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                "{% endfor %}")
    t = build_template(tok, PROMPT, template=tmpl_src)
    texts = ["love", "PING me", "x"]
    fast = responses_ids(tok, t, texts)
    assert TT.counts == {"tail": 2, "whole": 1}
    assert fast == _responses_ids_whole(tok, t, texts) and fast[1] is None


def test_plan_is_cached_per_template():
    tok = tiny_models.chatml_tokenizer()
    t = build_template(tok, PROMPT)
    assert tail_plan(tok, t) is tail_plan(tok, t)
    assert tail_plan(tok, build_template(tok, PROMPT + "?")) is not tail_plan(tok, t)
    plan = tail_plan(tok, t)
    tok.add_tokens(["greatest thing"])  # a token added since: planned again, and the prompt now tokenizes otherwise
    assert tail_plan(tok, t) is not plan
    _same(tok, build_template(tok, PROMPT))
    for path in (responses_ids, _responses_ids_whole):  # no texts: as before, the whole path's own refusal
        with pytest.raises(UserError, match="empty conversation"):
            path(tok, t, [])


def test_planned_once_it_saves_enough(monkeypatch):
    """A template seen with one text (a job of many conversations, one response each) is not planned: planning
    tokenizes the prompt once, which one text cannot win back. Planned once the texts seen would save
    PLAN_AFTER_TOKENS prompt tokens; the ids are the same either way."""
    monkeypatch.setattr(TT, "PLAN_AFTER_TOKENS", 512)
    tok = tiny_models.chatml_tokenizer()
    t = build_template(tok, PROMPT + " " + "x" * 300)  # byte-level: a few hundred prefix ids
    assert 256 < len(t.prefix_ids) < 512
    first = responses_ids(tok, t, ["love"])
    assert TT.counts == {"whole": 1}
    again = responses_ids(tok, t, ["love", "hate"])  # 3 texts seen: 2 x the prompt saved
    assert TT.counts == {"whole": 1, "tail": 2} and again[0] == first[0]
    TT.counts.clear()
    other = build_template(tok, PROMPT + " " + "y" * 300)
    responses_ids(tok, other, ["a"] * 2)  # saves 1 x the prompt: whole
    responses_ids(tok, other, ["a"] * 3)  # 5 texts seen: planned
    assert TT.counts == {"whole": 2, "tail": 3}


PIECES = ["a", " ", "  ", "\n", "\n\n", "\t", "love", " the", "<|im_end|>", "<|im_start|>", "assistant\n", "<|endoftext|>",
          "<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>", "é", "日本", "🙂", "\u200b", "\r\n", "'s", "123", "<", "|>"]


@pytest.mark.parametrize("which", ["smol", "gemma", "chatml"])
def test_random_responses(which, request):
    """Many responses glued from awkward pieces (whitespace, special-token text, partial tokens, unicode), one
    batch: the same ids and Nones as the whole path."""
    tok = tiny_models.chatml_tokenizer() if which == "chatml" else request.getfixturevalue(which)
    rng = random.Random(1)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12))) for _ in range(300)]
    t = build_template(tok, PROMPT + " <|im_end|> x", system="Sys \n", template=GEMMA_CHAT if which == "gemma" else None)
    got = _same(tok, t, texts)
    assert 0 < sum(g is None for g in got) < len(texts)  # some merge with the template, most do not
