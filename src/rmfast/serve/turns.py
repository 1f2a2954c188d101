"""A policy's rendered conversation split back into turns, to be rendered again with the reward model's own chat
template (``rmfast serve --rerender``; off by default, as in OpenRLHF, whose query carries the policy's template).

Five template families are read: ChatML (Qwen, SmolLM: ``<|im_start|>role\\n...<|im_end|>``), Llama 3
(``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``), Gemma (``<start_of_turn>role\\n...
<end_of_turn>``, the assistant called "model"), Phi-3 (``<|role|>\\n...<|end|>``) and DeepSeek (V3, R1 and its
distills: ``<｜User｜>...<｜Assistant｜>...``, the system prompt untagged before the first turn). A text in none of
them, or whose last turn is not the assistant's, is not split (None): the server scores it as sent.

>>> split_turns("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n")
[{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
>>> split_turns("<start_of_turn>user\\nHi<end_of_turn>\\n<start_of_turn>model\\nHey")[-1]
{'role': 'assistant', 'content': 'Hey'}
>>> split_turns("plain text") is None
True
"""

from __future__ import annotations

import re

from ..errors import UserError
from ..scoring.candidates import tokenize_rows
from ..scoring.conversation import as_conversation
from ..template import build_template

#: (name, turn pattern: a turn's role and content, up to its end or the text's)
FORMATS = (
    ("chatml", re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|<\|endoftext\|>|\Z)", re.S)),
    ("llama3", re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|<\|end_of_text\|>|\Z)",
                          re.S)),
    ("gemma", re.compile(r"<start_of_turn>(\w+)\n(.*?)(?:<end_of_turn>|<eos>|\Z)", re.S)),
    ("phi3", re.compile(r"<\|(system|user|assistant)\|>\n?(.*?)(?:<\|end\|>|<\|endoftext\|>|\Z)", re.S)),
    # DeepSeek's (V3, R1 and its Qwen / Llama distills): a turn runs to the next one; the system prompt has no tag
    ("deepseek", re.compile("<\uff5c(User|Assistant)\uff5c>(.*?)(?=<\uff5cUser\uff5c>|<\uff5cAssistant\uff5c>|"
                            "<\uff5cend\u2581of\u2581sentence\uff5c>|\\Z)", re.S)),
)

#: the begin-of-text marks a rendered conversation may start with; any other text before the first turn is its
#: system prompt (DeepSeek's has no tag of its own)
BEGIN_MARKS = ("<|begin_of_text|>", "<bos>", "<s>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>")
#: DeepSeek's begin mark: a text that starts with it is DeepSeek's, whatever its untagged system prompt quotes
DEEPSEEK_BEGIN = BEGIN_MARKS[-1]
_DEEPSEEK = [name for name, _ in FORMATS].index("deepseek")


#: the ends of a turn or a text that a policy's sampled reply may carry at its end (slime keeps the stop token:
#: sglang's ``no_stop_trim``): ChatML's, Llama 3's, Gemma's, Phi-3's, DeepSeek's, and Llama 2's / Mistral's
END_MARKS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>", "<eos>", "<|end|>",
             "<\uff5cend\u2581of\u2581sentence\uff5c>", "</s>")


def drop_end_marks(reply: str, more=()) -> str:
    """The reply without the end-of-turn or end-of-text marks at its very end (the RM's template adds its own).

    >>> drop_end_marks("Hello!<|im_end|>"), drop_end_marks("Hi<end_of_turn><eos>"), drop_end_marks("a </s> b")
    ('Hello!', 'Hi', 'a </s> b')
    """
    marks = tuple(m for m in (*END_MARKS, *more) if m)
    end = len(reply)  # one slice at the end: cutting a mark at a time copied the reply each time (a reply of 400,000
    while True:       # marks held every client 11 s on the event loop)
        m = next((m for m in marks if reply.endswith(m, 0, end)), None)
        if m is None:
            return reply[:end]
        end -= len(m)


def _turns_closed(text: str) -> tuple[list[dict] | None, bool]:
    """The text's turns as messages ("model" read as "assistant"), each turn's text as it is, and whether the last turn
    is closed by its end mark, in the format whose first turn comes first: another
    format's markup inside a turn (a user asking how ChatML marks turns, a reply that appends a fake exchange) stays
    that turn's text. (The first format found anywhere had been taken: a Llama 3 conversation quoting ChatML was read
    as ChatML, its real turns pushed into a "system" message, and scored so.)"""
    firsts = [(m.start(), k) for k, (_, pat) in enumerate(FORMATS) if (m := pat.search(text)) is not None]
    if not firsts:
        return None, False
    first = min(firsts)[1]
    if text.lstrip().startswith(DEEPSEEK_BEGIN) and any(k == _DEEPSEEK for _, k in firsts):
        first = _DEEPSEEK  # its begin mark: DeepSeek's untagged system prompt may quote another format's turns
    found = list(FORMATS[first][1].finditer(text))
    # every turn but the last keeps its text as it is: ChatML's and Phi-3's content runs to its end mark, DeepSeek's
    # to the next turn's tag (its template puts nothing after a turn's text), so a trailing newline there is the
    # user's or the policy's own, and /v1/score keeps it (they had been dropped); the last turn's are decided by its
    # readers (prompt_turns drops an open user turn's, where the text was cut)
    msgs = [{"role": "assistant" if m.group(1).lower() == "model" else m.group(1).lower(), "content": m.group(2)}
            for m in found]
    lead = text[: found[0].start()]
    for mark in BEGIN_MARKS:
        lead = lead.replace(mark, "")
    if lead.strip() and msgs[0]["role"] != "system":
        msgs.insert(0, {"role": "system", "content": lead.strip()})
    last = found[-1]  # closed: its end mark follows it (DeepSeek's turns run to the next: its end of sentence)
    closed = last.end() > last.end(2) or text.startswith(END_MARKS[7], last.end(2))
    return msgs, closed


def split_turns(text: str) -> list[dict] | None:
    """The text's turns as chat messages (the last the assistant's), or None (module doc)."""
    msgs = _turns_closed(text)[0]
    if msgs is None:
        return None
    if msgs[-1]["role"] != "assistant" or len(msgs) < 2 or msgs[-2]["role"] != "user":
        return None
    return msgs


def prompt_turns(text: str) -> tuple[list[dict], str] | None:
    """A policy's rendered PROMPT (its chat template, the generation prompt included, as slime's
    ``--apply-chat-template`` renders it) as (messages up to the user's turn, the text the template opened the
    assistant's turn with: "" mostly, Qwen 3's empty think block where thinking is off); None where the text has
    no turns of a known format, or its last turn is neither an open assistant turn nor the user's.

    >>> prompt_turns("<|im_start|>system\\nBe brief.<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n")
    ([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], '')
    >>> prompt_turns("<start_of_turn>user\\nHi<end_of_turn>\\n")   # no generation prompt: the user's turn ends it
    ([{'role': 'user', 'content': 'Hi'}], '')
    >>> prompt_turns("<|user|>\\nHi<|end|>\\n<|assistant|>\\n")   # Phi-3
    ([{'role': 'user', 'content': 'Hi'}], '')
    >>> prompt_turns("<\uff5cbegin\u2581of\u2581sentence\uff5c>Be brief.<\uff5cUser\uff5c>Hi<\uff5cAssistant\uff5c><think>\\n")
    ([{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], '<think>\\n')
    >>> prompt_turns("Hi") is None
    True
    >>> prompt_turns("<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nprev<|im_end|>\\n") is None  # closed
    True
    """
    msgs, closed = _turns_closed(text)
    if msgs is None:
        return None
    opened, popped = "", msgs[-1]["role"] == "assistant"
    if popped:
        if closed:  # a finished reply, not the opening of this one: its text had been glued to the response
            return None
        opened = msgs.pop()["content"]
    if not msgs or msgs[-1]["role"] != "user":
        return None
    if not popped and not closed:  # the user's turn ended the text, open (a closed one, or one before the opening,
        msgs[-1]["content"] = msgs[-1]["content"].rstrip("\n")  # keeps its text: _turns_closed)
    return msgs, opened


def sampled_reply(sampled: str, more=()) -> str:
    """A sampled reply without its end marks (``more``: the RM's own EOS too) and the newline a template puts after
    them ("Hi<|im_end|>\\n": "Hi"); newlines the policy sampled are its text, before an end mark or at the end of a
    reply cut short ("Hi\\n\\n<|im_end|>", "Hi\\n\\n": "Hi\\n\\n", as /v1/score reads them). The one rule of
    /get_reward --rerender and /reward (they had read the same reply two ways).

    >>> sampled_reply("Hi<|im_end|>\\n"), sampled_reply("Hi\\n\\n<|im_end|>"), sampled_reply("Hi\\n")
    ('Hi', 'Hi\\n\\n', 'Hi\\n')
    """
    trimmed = sampled.rstrip("\n")
    cut = drop_end_marks(trimmed, more)
    return cut if cut != trimmed else drop_end_marks(sampled, more)  # newlines after an end mark: the template's


def rerender_query(core, text: str, prompt: str | None = None) -> list[int] | None:
    """The query's conversation rendered with the reward model's template, as ids (the response's in context), or
    None where the text does not split into turns or its response merges with the template. ``prompt``: the
    client's prompt (OpenRLHF's ``prompts``), where the query begins with it: only the prompt is split into turns,
    and the rest is the reply as sampled, whatever markup it holds (a reply that appended a fake exchange of the
    conversation's own format had been split as turns and chose what the RM read)."""
    if prompt and text.startswith(prompt) and (got := prompt_turns(prompt)) is not None:
        msgs, opened = got
        msgs = [*msgs, {"role": "assistant", "content": sampled_reply(opened + text[len(prompt):])}]
    else:
        msgs = split_turns(text)
    if msgs is None:
        return None
    try:
        conv = as_conversation(msgs[:-1])
        t = build_template(core.tokenizer, conv.prompt, template=core.template, system=conv.system, history=conv.history)
        if not msgs[-1]["content"].strip():  # an empty reply: the RM's empty turn, as /v1/score and /reward score
            return [*t.prefix_ids, *t.suffix_ids]  # one (it had been scored as sent, in the policy's template)
        (row,) = tokenize_rows(core.tokenizer, [(0, msgs[-1]["content"], 0, 0)], [t])
    except UserError:
        return None
    return [*t.prefix_ids, *row.ids, *t.suffix_ids]
