"""A conversation up to the assistant's next turn: what :class:`rmfast.scoring.scorer.RewardScorer` scores
responses to. A prompt string (one user turn), or a list of chat messages
``[{"role": "system", ...}?, {"role": "user", ...}, {"role": "assistant", ...}, ..., {"role": "user", ...}]``
whose last message is the user's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class Conversation:
    """A conversation up to the assistant's next turn: the final user turn, a system message and the
    turns in between, hashable (the key of its cached plan).

    >>> as_conversation([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    Conversation(prompt='Hi', system='Be brief.', history=())
    """

    prompt: str
    system: str | None = None
    history: tuple = ()  # ((role, content), ...) between the system message and the final user turn


def blank_words(text) -> str:
    """What a response that is no text is, in words: "empty", "only whitespace", or its type.

    >>> blank_words(""), blank_words("  "), blank_words(None)
    ('empty', 'only whitespace', 'NoneType')
    """
    return type(text).__name__ if not isinstance(text, str) else "only whitespace" if text else "empty"


def as_list(x, what: str, each: str) -> list:
    """``x`` (a list, tuple, array or generator of ``each``) as a list. A string is refused (iterated, it would be
    scored character by character), as are bytes, a dict, None and a scalar: one line naming ``what``.

    >>> as_list(("a", "b"), "responses", "response strings")
    ['a', 'b']
    """
    if isinstance(x, (str, bytes, bytearray)):
        raise UserError(f"{what} must be a list of {each}, got one {type(x).__name__}: put it in a list ([...])")
    if isinstance(x, dict) or not hasattr(x, "__iter__"):
        raise UserError(f"{what} must be a list of {each}, got {type(x).__name__}")
    if isinstance(x, (set, frozenset)):  # its order is the hash's, another in every process: scores would not line up
        raise UserError(f"{what} must be a list of {each}, got a {type(x).__name__}, whose order changes between "
                        "processes: give a list (sorted(...), if any order will do)")
    return list(x)


def call_lists(conversations, responses) -> tuple[list, list[list]]:
    """A score call's ``conversations`` and ``responses`` (one list of response strings per conversation) as two
    lists of one length, each of ``responses`` a list (:func:`as_list`; a generator is read once, here)."""
    conversations = as_list(conversations, "conversations", "prompts (strings or lists of chat messages)")
    responses = as_list(responses, "responses", "response lists (one list of strings per conversation)")
    if len(conversations) != len(responses):
        raise UserError(f"{len(conversations)} conversations but {len(responses)} response lists; give one list "
                        "of responses per conversation")
    return conversations, [as_list(rs, f"responses[{i}]", "response strings") for i, rs in enumerate(responses)]


def as_conversation(c, where: str = "conversation") -> Conversation:
    """A prompt string or a list of {"role", "content"} messages (last one the user's) as a :class:`Conversation`."""
    if isinstance(c, Conversation):
        return c
    if isinstance(c, str):
        if not c.strip():
            raise UserError(f"{where} is an empty prompt")
        return Conversation(c)
    if isinstance(c, (dict, bytes, bytearray)) or not hasattr(c, "__iter__"):
        raise UserError(f"{where} must be a prompt string or a list of chat messages, got {type(c).__name__}")
    msgs = list(c)
    for k, m in enumerate(msgs):
        if not (hasattr(m, "get") and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise UserError(f"{where}, messages[{k}]: each message needs a string 'role' and a string 'content'")
        other = sorted(set(m) - {"role", "content"}) if hasattr(m, "keys") else []
        if other:  # a chat template renders them (tool calls, names): dropped, the score would not be the model's
            raise UserError(f"{where}, messages[{k}]: field(s) {other} beside 'role' and 'content'; rmfast scores "
                            "conversations of role and content only (the chat template would render the others, so "
                            "dropping them would change the score): remove them, or fold them into the content")
    if not msgs or msgs[-1]["role"] != "user":
        got = f"; its last is a {msgs[-1]['role']!r} message" if msgs else "; there is none"
        raise UserError(f"{where}: the last message must be the user's (the response is the assistant's next turn)"
                        + got)
    if not msgs[-1]["content"].strip():
        raise UserError(f"{where}: the final user message is empty")
    system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
    body = msgs[1 if system is not None else 0:-1]
    return Conversation(msgs[-1]["content"], system, tuple((m["role"], m["content"]) for m in body))


def messages_of(conv: Conversation, response: str | None = None) -> list[dict]:
    """The conversation as chat messages (plus the assistant's ``response`` when given)."""
    out = [{"role": "system", "content": conv.system}] if conv.system is not None else []
    out += [{"role": r, "content": c} for r, c in conv.history] + [{"role": "user", "content": conv.prompt}]
    return out + ([{"role": "assistant", "content": response}] if response is not None else [])


__all__ = ["Conversation", "as_conversation", "messages_of"]
