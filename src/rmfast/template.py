"""What sequence is scored: the one source of truth shared by the engine, the reference and GCG.

A response is placed in the assistant turn of the model's chat template (or a plain format
for base models). We render the conversation with several probe words, tokenize each the way
``apply_chat_template(tokenize=True)`` does, and take the longest common prefix and suffix of
the id sequences. Candidates are then inserted *by id* between them — never decoded and
re-tokenized — so byte-fallback pieces, special tokens and BOS are exactly what the ids say.

If the probes do not share a prefix and suffix (a template that rewrites the response, or a
tokenizer that merges the response with its surroundings), the template cannot be split and
we stop with a clear error rather than score the wrong sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserError

# Probe words: common, different first and last letters, single words in every tokenizer we know.
PROBES = ("hello", "world", "Paris", "blue", "seven")


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
            the logprob head (up to and including the first special token; all of a suffix
            without special tokens).
        prompt, system, kind ("chat_template" | "jinja" | "plain"), format: what was rendered.

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
        }


def renderer(tokenizer, prompt: str, template: str | None, system: str | None):
    """Returns (kind, fn(response_text) -> list[int])."""
    if template is not None and is_plain_format(template):
        if "{prompt}" not in template:
            raise UserError("--template plain format needs a {prompt} placeholder, e.g. 'User: {prompt}\\nAssistant: {response}'")
        if system is not None and "{system}" not in template:
            raise UserError("--system given but the plain --template has no {system} placeholder; add one or drop --system")

        def render_plain(response: str) -> list[int]:
            text = template.replace("{system}", system or "").replace("{prompt}", prompt).replace("{response}", response)
            return list(tokenizer(text, add_special_tokens=True)["input_ids"])

        return "plain", render_plain

    if template is not None and "{%" not in template and "{{" not in template:
        raise UserError("--template has no {response} placeholder: a plain format needs {prompt} and {response}, "
                        "e.g. 'User: {prompt}\\nAssistant: {response}' (or pass a Jinja chat template)")
    chat_template = template
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "this model's tokenizer has no chat template; pass --template, e.g. "
            "--template 'User: {prompt}\\nAssistant: {response}'"
        )
    kind = "jinja" if template is not None else "chat_template"

    def render_chat(response: str) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": response},
        ]
        try:
            out = tokenizer.apply_chat_template(messages, chat_template=chat_template, tokenize=True, return_dict=False)
        except Exception as e:  # jinja errors, templates that refuse roles, ...
            raise UserError(f"the chat template failed to render ({type(e).__name__}: {str(e).splitlines()[0]}); pass a working --template") from None
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)

    return kind, render_chat


def common_prefix_len(seqs) -> int:
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == seqs[0][i] for s in seqs):
        i += 1
    return i


def build_template(
    tokenizer,
    prompt: str,
    *,
    template: str | None = None,
    system: str | None = None,
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

    Raises:
        UserError: empty prompt, no chat template and no ``template``, or a template whose
            rendering cannot be split into prefix + response + suffix.
    """
    if prompt is None or not prompt.strip():
        raise UserError("the prompt is empty; pass --prompt 'What, in one word, is the greatest thing ever?'")
    kind, render = renderer(tokenizer, prompt, template, system)
    rendered = [render(w) for w in PROBES]
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
        if not middle or text.strip() != word:
            raise UserError(
                f"cannot split the template around the response: the probe {word!r} rendered as {text!r} between a "
                "shared prefix and suffix; the template changes the response text — pass a --template that inserts it verbatim"
            )
    if not prefix:
        raise UserError("cannot split the template: nothing precedes the response slot (the prompt is missing from the rendering); check --template")
    if prompt.strip() not in tokenizer.decode(list(prefix)):
        raise UserError("cannot split the template: the prompt does not appear before the response slot; check --template")

    special = set(getattr(tokenizer, "all_special_ids", []) or [])
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
    )


def response_ids(tokenizer, tmpl: Template, text: str) -> list[int]:
    """Ids of a response text exactly as the template tokenizes it in context.

    Renders the full conversation with ``text`` as the response and checks that it starts with
    the template's prefix and ends with its suffix; raises UserError otherwise.
    """
    _, render = renderer(tokenizer, tmpl.prompt, tmpl.format, tmpl.system)
    ids = render(text)
    P, S = len(tmpl.prefix_ids), len(tmpl.suffix_ids)
    if tuple(ids[:P]) != tmpl.prefix_ids or (S and tuple(ids[len(ids) - S :]) != tmpl.suffix_ids) or len(ids) <= P + S:
        raise UserError(f"the response {text[:40]!r} merges with the template around it; it cannot be scored by id")
    return ids[P : len(ids) - S]
