"""A policy's rendered conversation split back into turns, to be rendered again with the reward model's own chat
template (``rmfast serve --rerender``; off by default, as in OpenRLHF, whose query carries the policy's template).

Three template families are read: ChatML (Qwen, SmolLM: ``<|im_start|>role\\n...<|im_end|>``), Llama 3
(``<|start_header_id|>role<|end_header_id|>\\n\\n...<|eot_id|>``) and Gemma (``<start_of_turn>role\\n...
<end_of_turn>``, the assistant called "model"). A text in none of them, or whose last turn is not the assistant's,
is not split (None): the server scores it as sent.

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

#: (name, turn pattern: role and content, end of a turn, text to drop before the first turn)
FORMATS = (
    ("chatml", re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|<\|endoftext\|>|$)", re.S)),
    ("llama3", re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|<\|end_of_text\|>|$)",
                          re.S)),
    ("gemma", re.compile(r"<start_of_turn>(\w+)\n(.*?)(?:<end_of_turn>|<eos>|$)", re.S)),
)


def split_turns(text: str) -> list[dict] | None:
    """The text's turns as chat messages (the last the assistant's), or None (module doc)."""
    for name, pat in FORMATS:
        turns = [(m.group(1), m.group(2)) for m in pat.finditer(text)]
        if not turns:
            continue
        msgs = [{"role": "assistant" if r == "model" else r, "content": c.rstrip("\n") if r != turns[-1][0] else c}
                for r, c in turns]
        msgs[-1]["content"] = msgs[-1]["content"].rstrip("\n")
        if msgs[-1]["role"] != "assistant" or len(msgs) < 2 or msgs[-2]["role"] != "user":
            return None
        return msgs
    return None


def rerender_query(core, text: str) -> list[int] | None:
    """The query's conversation rendered with the reward model's template, as ids (the response's in context), or
    None where the text does not split into turns or its response merges with the template."""
    msgs = split_turns(text)
    if msgs is None or not msgs[-1]["content"].strip():
        return None
    try:
        conv = as_conversation(msgs[:-1])
        t = build_template(core.tokenizer, conv.prompt, template=core.template, system=conv.system, history=conv.history)
        (row,) = tokenize_rows(core.tokenizer, [(0, msgs[-1]["content"], 0, 0)], [t])
    except UserError:
        return None
    return [*t.prefix_ids, *row.ids, *t.suffix_ids]
