"""What sequence is scored: the one source of truth shared by the engine, the reference and GCG.

A response is placed in the assistant turn of the model's chat template (or a plain format
for base models). We render the conversation with several probe words, tokenize each the way
``apply_chat_template(tokenize=True)`` does, and take the longest common prefix and suffix of
the id sequences. Candidates are then inserted *by id* between them — never decoded and
re-tokenized — so byte-fallback pieces, special tokens and BOS are exactly what the ids say.

If the probes do not share a prefix and suffix (a template that rewrites the response, or a
tokenizer that merges the response with its surroundings), the template cannot be split and
we stop with a clear error rather than score the wrong sequence.

A chat template is code. Before transformers renders it, every conversation is rendered once in a
bounded Jinja sandbox (:func:`check_render_bounds`: time, size, ranges), so a template that loops
for minutes or builds gigabytes is refused in one line instead.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from dataclasses import dataclass, field

from . import template_tail
from .errors import UserError

# Probe words: common, different first and last letters, single words in every tokenizer we know.
PROBES = ("hello", "world", "Paris", "blue", "seven")

#: Bounds on rendering one conversation with a Jinja chat template. A template is code (from a model
#: folder, or --template): Jinja's sandbox keeps it from reading what it should not, not from running
#: for hours (loops nested in loops) or filling the memory (a string doubled in a loop).
RENDER_SECONDS = 2.0
RENDER_CHARS = 2_000_000  # any string, list or number it builds, and its output
RANGE_ITEMS = 100_000  # the items of one range() (the sandbox's own bound)
_clock = time.monotonic  # (tests replace it with a clock that runs fast)
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("rmfast_render_deadline", default=None)


def is_plain_format(template: str) -> bool:
    """A plain format such as ``'User: {prompt}\\nAssistant: {response}'`` (not a Jinja template)."""
    return "{response}" in template and "{%" not in template and "{{" not in template


def unescape(template: str | None) -> str | None:
    r"""A template typed in a shell or a YAML single-quoted string: in a plain format the two-character
    escapes backslash-n and backslash-t become a newline and a tab; Jinja is left alone.

    >>> print(unescape(r"User: {prompt}\nAssistant: {response}"))
    User: {prompt}
    Assistant: {response}
    """
    if template is None or "{%" in template or "{{" in template:
        return template
    return template.replace("\\n", "\n").replace("\\t", "\t")


@dataclass(frozen=True)
class Template:
    """A prompt split around the response slot.

    Attributes:
        prefix_ids: ids before the response (BOS, system turn, user turn, assistant header).
        suffix_ids: ids after the response (end of turn and whatever the template appends).
        n_continuation: how many leading suffix ids form the end-of-turn continuation scored by
            the logprob head (up to and including the first token the tokenizer flags special,
            :func:`special_flagged_ids`; all of a suffix without special tokens).
        prompt, system, kind ("chat_template" | "jinja" | "plain"), format: what was rendered.
        history: earlier turns between the system message and the final user turn, as
            ((role, content), ...) pairs (multi-turn conversations; () for one turn).

    Example:
        >>> from transformers import AutoTokenizer  # doctest: +SKIP
        >>> t = build_template(tok, "What, in one word, is the greatest thing ever?")  # doctest: +SKIP
        >>> t.sequence([tok.convert_tokens_to_ids("love")])  # doctest: +SKIP
    """

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    n_continuation: int
    prompt: str
    system: str | None
    kind: str
    format: str | None = None
    probe_check: dict = field(default_factory=dict, compare=False)
    history: tuple = ()

    @property
    def continuation_ids(self) -> tuple[int, ...]:
        return self.suffix_ids[: self.n_continuation]

    def sequence(self, response_ids) -> list[int]:
        """prefix + response ids + suffix."""
        return [*self.prefix_ids, *response_ids, *self.suffix_ids]

    def manifest(self) -> dict:
        return {
            "kind": self.kind,
            "format": self.format,
            "system": self.system,
            "prefix_ids": list(self.prefix_ids),
            "suffix_ids": list(self.suffix_ids),
            "n_continuation": self.n_continuation,
            "probe_check": self.probe_check,
            **({"history": [list(t) for t in self.history]} if self.history else {}),
        }


def renderer(tokenizer, prompt: str, template: str | None, system: str | None, history=()):
    """Returns (kind, fn(response_texts) -> [list[int], ...]): each response's whole conversation as ids, all
    tokenized in ONE tokenizer call (a batch: the fast tokenizers encode it in parallel; per text it is the
    call a single text gets). ``history``: earlier ((role, content), ...) turns rendered between the system
    message and the final user turn (chat templates only)."""
    if template is not None and is_plain_format(template):
        kind, texts, _ = text_renderer(tokenizer, prompt, template, system, history)

        def render_plain(responses: list[str]) -> list[list[int]]:
            return [list(ids) for ids in tokenizer(texts(responses), add_special_tokens=True)["input_ids"]]

        return kind, render_plain
    kind, chat_template = _chat_kind(tokenizer, template)

    def render_chat(responses: list[str]) -> list[list[int]]:
        out = _apply_chat(tokenizer, chat_template, _conversations(prompt, system, history, responses), tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return [list(ids) for ids in out]

    return kind, render_chat


def text_renderer(tokenizer, prompt: str, template: str | None, system: str | None, history=()):
    """Returns (kind, fn(response_texts) -> [str, ...], add_special_tokens): each response's whole conversation
    as the TEXT :func:`renderer` tokenizes, and whether that call adds the tokenizer's specials (a plain format:
    yes, BOS and the like; a chat template: no, as ``apply_chat_template`` tokenizes). The same checks and
    refusals as :func:`renderer`."""
    if template is not None and is_plain_format(template):
        _check_plain(template, system, history)
        head = template.replace("{system}", system or "").replace("{prompt}", prompt)
        return "plain", lambda responses: [head.replace("{response}", r) for r in responses], True
    kind, chat_template = _chat_kind(tokenizer, template)

    def chat_texts(responses: list[str]) -> list[str]:
        return list(_apply_chat(tokenizer, chat_template, _conversations(prompt, system, history, responses),
                                tokenize=False))

    return kind, chat_texts, False


def _check_plain(template: str, system: str | None, history) -> None:
    """Refuse a plain format that cannot hold this conversation, or whose placeholders are mistyped."""
    if history:
        raise UserError("a multi-turn conversation needs a chat template; a plain --template holds one turn")
    if "{prompt}" not in template:
        raise UserError("--template plain format needs a {prompt} placeholder, e.g. 'User: {prompt}\\nAssistant: {response}'")
    if system is not None and "{system}" not in template:
        raise UserError("--system given but the plain --template has no {system} placeholder; add one or drop --system")
    check_placeholders(template)


def check_placeholders(template: str) -> None:
    """Refuse a plain format's placeholder it does not fill: a typo such as {promt} would be scored as literal text.

    >>> check_placeholders("User: {promt} Assistant:")
    Traceback (most recent call last):
    rmfast.errors.UserError: template has the placeholder {promt}, which a plain format does not fill: it knows {system}, {prompt} and {response}
    """
    unknown = sorted(set(re.findall(r"\{(\w+)\}", template)) - {"system", "prompt", "response"})
    if unknown:
        raise UserError(f"--template has the placeholder {{{unknown[0]}}}, which a plain format does not fill: it "
                        "knows {system}, {prompt} and {response}")


def _chat_kind(tokenizer, template: str | None) -> tuple[str, str | None]:
    """(kind, the chat template to render with: None for the tokenizer's own), refusing what is neither."""
    if template is not None and "{%" not in template and "{{" not in template:
        raise UserError("--template has no {response} placeholder: a plain format needs {prompt} and {response}, "
                        "e.g. 'User: {prompt}\\nAssistant: {response}' (or pass a Jinja chat template)")
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "this model's tokenizer has no chat template; pass --template, e.g. "
            "--template 'User: {prompt}\\nAssistant: {response}'"
        )
    return ("jinja" if template is not None else "chat_template"), template


def _conversations(prompt: str, system: str | None, history, responses: list[str]) -> list[list[dict]]:
    """One message list per response: system?, the history, the user prompt, the assistant response."""
    head = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": r, "content": c} for r, c in history] + [{"role": "user", "content": prompt}]
    return [head + [{"role": "assistant", "content": r}] for r in responses]


def _apply_chat(tokenizer, chat_template: str | None, convs: list[list[dict]], *, tokenize: bool):
    """``apply_chat_template`` of a list of conversations (rendered one by one; tokenized, where asked, as one
    batch), each first rendered in the bounded sandbox; a template that fails is one UserError line."""
    for messages in convs:
        _check_bounds(tokenizer, chat_template, messages)
    try:
        return tokenizer.apply_chat_template(convs, chat_template=chat_template, tokenize=tokenize, return_dict=False)
    except Exception as e:  # jinja errors, templates that refuse roles, ...
        raise UserError(f"the chat template failed to render ({type(e).__name__}: {str(e).splitlines()[0]}); pass a working --template") from None


def _over(what: str) -> UserError:
    """The one-line refusal of a template that went over a bound (``what`` names it)."""
    return UserError(f"the chat template {what}; pass a --template that stays within it")


def _tick() -> None:
    """Stop a render that has run past its deadline (called on every loop item, call and output piece)."""
    d = _deadline.get()
    if d is not None and _clock() > d:
        raise _over(f"ran past the render time limit of {RENDER_SECONDS:g} s (a loop too long?)")


def _sized(x):
    """``x``, unless it is a string, list or mapping over the size limit."""
    if isinstance(x, (str, list, tuple, dict)) and len(x) > RENDER_CHARS:
        what = "a string of {:,} characters" if isinstance(x, str) else f"a {type(x).__name__} of {{:,}} items"
        raise _over(f"built {what.format(len(x))}, over the size limit of {RENDER_CHARS:,}")
    return x


def _check_args(args) -> None:
    """Refuse a number over the size limit given to a string method or filter that sizes its result by it
    ('x'.ljust(10**9), center(10**9), ...) before it allocates."""
    for v in args:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > RENDER_CHARS:
            raise _over(f"passed the number {v:,} to a function, over the size limit of {RENDER_CHARS:,}")


def _check_binop(op: str, a, b) -> None:
    """Refuse a repetition ('x' * n) or a power (n ** m) whose result is over the size limit, before it is made."""
    if op == "*":
        for seq, n in ((a, b), (b, a)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > RENDER_CHARS:
                raise _over(f"repeats {len(seq):,} items {n:,} times, over the size limit of {RENDER_CHARS:,} items")
    if op == "**" and isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and \
            abs(a).bit_length() * b > 4 * RENDER_CHARS:
        raise _over(f"raises a number to the power {b:,}, over the size limit of {RENDER_CHARS:,}")


def _bounded_range(*args) -> range:
    """``range`` for templates: refused over :data:`RANGE_ITEMS`, naming the limit (the sandbox's own
    refusal is an OverflowError that would read as a broken template)."""
    r = range(*args)
    if len(r) > RANGE_ITEMS:
        raise _over(f"asked for a range of {len(r):,} items, over the limit of {RANGE_ITEMS:,}")
    return r


def _each(items):
    """A loop's items, one deadline check each (the filter every ``{% for %}`` is rewritten to go through)."""
    for x in items:
        _tick()
        yield x


def _bounded_filter(f):
    """Jinja filter ``f`` with the bounds: a deadline check, its numbers (center(10**9)) and its result sized."""
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def run(*args, **kwargs):
        _tick()
        _check_args([*args[1:], *kwargs.values()])
        return _sized(f(*args, **kwargs))
    return run


@functools.lru_cache(maxsize=1)
def _bounded_env():
    """A Jinja sandbox like transformers' (trim_blocks, lstrip_blocks, loop controls, ``{% generation %}``,
    raise_exception, strftime_now) whose every loop item, call, filter, ``*``, ``**``, ``+`` and ``~`` is
    checked against the bounds above."""
    from datetime import datetime

    from jinja2 import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # transformers' assistant-mask tag: here only its body
        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            _tick()
            _check_binop(operator, left, right)
            return _sized(super().call_binop(context, operator, left, right))

        def call(self, context, obj, /, *args, **kwargs):
            _tick()
            if isinstance(getattr(obj, "__self__", None), str) or obj is self.globals.get("lipsum"):
                _check_args([*args, *kwargs.values()])  # 'x'.ljust(n), lipsum(n): n sizes the result
            return _sized(super().call(context, obj, *args, **kwargs))

    def raise_exception(message):
        raise TemplateError(message)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, Generation])
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.filters.update(rmfast_each=_each, rmfast_sized=_sized)
    env.globals.update(range=_bounded_range, raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env


@functools.lru_cache(maxsize=16)
def _bounded_template(source: str):
    """``source`` compiled in the bounded sandbox, every ``{% for %}`` iterating through ``rmfast_each``
    and every ``~`` through ``rmfast_sized`` (Python's own loops and joins cannot be interrupted)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def wrap(node, name):
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    class Bound(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = wrap(node.iter, "rmfast_each")
            return node

        def visit_Concat(self, node):
            return wrap(self.generic_visit(node), "rmfast_sized")

    env = _bounded_env()
    return env.from_string(Bound().visit(env.parse(source)))


def check_render_bounds(source: str, **context) -> None:
    """Render ``source`` with ``context`` in the bounded sandbox and refuse, in one line naming the limit,
    a template that runs past :data:`RENDER_SECONDS` or builds more than :data:`RENDER_CHARS`.

    Only the bounds are judged here: a template that fails for any other reason is left to
    transformers' own rendering, which says why (and which stays the one that is scored).
    """
    token = _deadline.set(_clock() + RENDER_SECONDS)
    try:
        total = 0
        for piece in _bounded_template(source).generate(**context):
            total += len(piece)
            if total > RENDER_CHARS:
                raise _over(f"wrote more than {RENDER_CHARS:,} characters, over the size limit")
            _tick()
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - not a bound: transformers' render reports it
        return
    finally:
        _deadline.reset(token)


def _check_bounds(tokenizer, chat_template: str | None, messages) -> None:
    """:func:`check_render_bounds` for the template and variables ``apply_chat_template`` renders with."""
    try:
        source = tokenizer.get_chat_template(chat_template)
    except Exception:  # noqa: BLE001 - no template: apply_chat_template says so
        return
    if isinstance(source, str):
        check_render_bounds(source, messages=messages, add_generation_prompt=False, tools=None, documents=None,
                            **dict(getattr(tokenizer, "special_tokens_map", {}) or {}))


def common_prefix_len(seqs) -> int:
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == seqs[0][i] for s in seqs):
        i += 1
    return i


def check_text(text, what: str) -> None:
    """Refuse a string a tokenizer cannot take: one holding a lone surrogate (bytes that were not UTF-8,
    as Python decodes a command-line argument, or a YAML/JSON ``\\udcff`` escape), named with where it
    is, instead of a tokenizer's TypeError reported as something else.

    >>> check_text("caf\\udce9", "--prompt")
    Traceback (most recent call last):
    rmfast.errors.UserError: prompt is not valid text: a lone surrogate U+DCE9 at character 3 (bytes that are not UTF-8?); write it as UTF-8
    """
    at = lone_surrogate(text) if isinstance(text, str) else None
    if at is not None:
        raise UserError(f"{what} is not valid text: a lone surrogate U+{ord(text[at]):04X} at character {at} "
                        "(bytes that are not UTF-8?); write it as UTF-8")


def lone_surrogate(text: str) -> int | None:
    """Where ``text``'s first lone surrogate is (a string no tokenizer takes: not valid text), or None.

    >>> lone_surrogate("caf\\udce9"), lone_surrogate("café")
    (3, None)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def build_template(
    tokenizer,
    prompt: str,
    *,
    template: str | None = None,
    system: str | None = None,
    history=(),
) -> Template:
    """Split the conversation (system?, user prompt, assistant response) around the response.

    Args:
        tokenizer: a Hugging Face tokenizer.
        prompt: the user turn, e.g. "What, in one word, is the greatest thing ever?".
        template: None to use the tokenizer's chat template; a Jinja chat template; or a plain
            format with ``{prompt}`` and ``{response}`` (and optionally ``{system}``) placeholders
            such as ``"User: {prompt}\\nAssistant: {response}"``. Plain formats are tokenized
            with the tokenizer's special tokens (BOS) added.
        system: optional system message.
        history: earlier turns before the final user turn, ((role, content), ...) or message dicts
            (multi-turn conversations; default none).

    Raises:
        UserError: empty prompt, no chat template and no ``template``, or a template whose
            rendering cannot be split into prefix + response + suffix.
    """
    if prompt is not None and not isinstance(prompt, str):
        raise UserError(f"the prompt must be one string (the user turn), got {type(prompt).__name__}; for many prompts "
                        "call once per prompt, or use RewardScorer.score(conversations, responses)")
    if prompt is None or not prompt.strip():
        raise UserError("the prompt is empty; pass --prompt 'What, in one word, is the greatest thing ever?'")
    history = tuple((m["role"], m["content"]) if isinstance(m, dict) else tuple(m) for m in history or ())
    check_text(prompt, "the prompt")
    check_text(system, "the system message")
    for k, (_, content) in enumerate(history):
        check_text(content, f"history message {k} (counted from 0)")
    kind, render = renderer(tokenizer, prompt, template, system, history)
    rendered = render(list(PROBES))
    n_pre = common_prefix_len(rendered)
    n_suf = common_prefix_len([r[::-1] for r in rendered])
    shortest = min(len(r) for r in rendered)
    n_suf = min(n_suf, shortest - n_pre - 1) if shortest - n_pre - 1 >= 0 else 0
    prefix = tuple(rendered[0][:n_pre])
    suffix = tuple(rendered[0][len(rendered[0]) - n_suf :]) if n_suf else ()
    check = {}
    for word, ids in zip(PROBES, rendered):
        middle = ids[n_pre : len(ids) - n_suf]
        text = tokenizer.decode(middle)
        check[word] = middle
        if not middle or text.strip() not in (word, normalized(tokenizer, word).strip()):  # an uncased tokenizer's
            raise UserError(
                f"cannot split the template around the response: the probe {word!r} rendered as {text!r} between a "
                "shared prefix and suffix; the template changes the response text — pass a --template that inserts it verbatim"
            )
    if not prefix:
        raise UserError("cannot split the template: nothing precedes the response slot (the prompt is missing from the rendering); check --template")
    seen = tokenizer.decode(list(prefix))
    if prompt.strip() not in seen and normalized(tokenizer, prompt).strip() not in seen:  # (NFKC: 'ﬁ' as 'fi')
        raise UserError("cannot split the template: the prompt does not appear before the response slot; check --template")

    special = special_flagged_ids(tokenizer)
    n_cont = len(suffix)
    for i, t in enumerate(suffix):
        if t in special:
            n_cont = i + 1
            break
    return Template(
        prefix_ids=prefix,
        suffix_ids=suffix,
        n_continuation=n_cont,
        prompt=prompt,
        system=system,
        kind=kind,
        format=template,
        probe_check={w: list(m) for w, m in check.items()},
        history=history,
    )


def normalized(tokenizer, text: str) -> str:
    """``text`` as the tokenizer's normalizer reads it (lower-cased by an uncased one, NFKC-folded by a
    SentencePiece ``nmt_nfkc`` one); ``text`` where it has none. Its decoded ids hold this form, not the text."""
    norm = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return norm.normalize_str(text) if norm is not None else text


def special_flagged_ids(tokenizer) -> set[int]:
    """Ids the tokenizer flags special: its named special tokens (``all_special_ids``) and every added token
    marked ``special``. A tokenizer converted from a GGUF (Gemma 3's) flags ``<end_of_turn>`` special in
    ``added_tokens_decoder`` but names it nowhere, so ``all_special_ids`` alone misses the end of a turn."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    try:  # (listing Gemma's 6,384 added tokens takes ~10 ms: the table is kept per tokenizer; a wrapper works too)
        return ids | template_tail.added_table(tokenizer).special
    except (AttributeError, TypeError):  # a tokenizer-like object without added tokens, or without a length
        return ids


def response_ids(tokenizer, tmpl: Template, text: str) -> list[int]:
    """Ids of a response text exactly as the template tokenizes it in context.

    Renders the full conversation with ``text`` as the response and checks that it starts with
    the template's prefix and ends with its suffix; raises UserError otherwise.
    """
    (ids,) = responses_ids(tokenizer, tmpl, [text])
    if ids is None:
        raise UserError(f"the response {text[:40]!r} merges with the template around it; it cannot be scored by id")
    return ids


def responses_ids(tokenizer, tmpl: Template, texts: list[str]) -> list[list[int] | None]:
    """:func:`response_ids` of many texts, their conversations tokenized in one batch: per text its ids, or None
    where it merges with the template around it (the caller names it).

    The ids are those of the whole conversation, as :func:`_responses_ids_whole` tokenizes it, but where the
    tokenizer provably splits the conversation at an added token inside the prompt (a chat template's turn
    header), only the text from there on is tokenized per response and the ids before it are reused
    (:mod:`rmfast.template_tail`): a long prompt is not tokenized once per response. Texts it does not cover
    take the whole-conversation path."""
    texts = list(texts)
    if not texts:
        return _responses_ids_whole(tokenizer, tmpl, texts)
    got = _tail_ids(tokenizer, tmpl, texts)
    rest = [i for i, ids in enumerate(got) if ids is None]
    if rest:
        _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
        for i, ids in zip(rest, render([texts[i] for i in rest])):
            got[i] = ids
        template_tail.counts["whole"] += len(rest)
    return [_split(tmpl, ids) for ids in got]


def _responses_ids_whole(tokenizer, tmpl: Template, texts: list[str]) -> list[list[int] | None]:
    """:func:`responses_ids` by tokenizing every whole conversation (the reference the tail path must equal)."""
    _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
    return [_split(tmpl, ids) for ids in render(list(texts))]


def _split(tmpl: Template, ids: list[int]) -> list[int] | None:
    """The response's ids between the template's prefix and suffix, or None where the conversation does not
    start with the prefix and end with the suffix around at least one id (it merged with them)."""
    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    ok = tuple(ids[:P]) == tmpl.prefix_ids and (not S or tuple(ids[len(ids) - S :]) == tmpl.suffix_ids) and len(ids) > P + S
    return ids[P : len(ids) - S] if ok else None


#: two responses that differ in their first character: their renderings share exactly the text before the slot
_TAIL_PROBES = ("hello", "world")


def tail_plan(tokenizer, tmpl: Template):
    """Where :func:`responses_ids` cuts ``tmpl``'s conversations (a :class:`rmfast.template_tail.TailCut`), or
    why it tokenizes them whole (a str); planned once per tokenizer and template, then cached."""
    return _tail_setup(tokenizer, tmpl)[0]


def _tail_setup(tokenizer, tmpl: Template, n_texts: int | None = None):
    """(the tail plan, fn(responses) -> their conversation texts); ``n_texts``: see ``template_tail.cut_for``."""
    _, texts, add = text_renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system, tmpl.history)
    cut = template_tail.cut_for(tokenizer, tmpl, lambda: texts(list(_TAIL_PROBES)), add, tmpl.prefix_ids, n_texts)
    return cut, texts


def _tail_ids(tokenizer, tmpl: Template, texts: list[str]) -> list[list[int] | None]:
    """Each text's whole-conversation ids by the tail path, None where it does not apply (all of them, where
    the template has no cut)."""
    cut, render_texts = _tail_setup(tokenizer, tmpl, len(texts))
    if not isinstance(cut, template_tail.TailCut):
        return [None] * len(texts)
    return template_tail.tail_ids(tokenizer, cut, render_texts(texts))
