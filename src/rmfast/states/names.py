"""The names of a model's hidden states, as ``--states`` takes them and a states folder stores them.

Residual-stream indices ``k`` are HF's ``hidden_states[k]``: 0 the input embeddings, k the stream after
decoder layer k (1-based). Two states sit at the end of the stack, easy to mistake for each other:

- ``last_prenorm``: the residual stream after the last decoder layer, *before* the final norm (the
  norm's input). HF's tuple does not hold it.
- ``last_normed``: the final norm's output, what the head reads. This is what HF's
  ``hidden_states[-1]`` is (``output_hidden_states=True``) for Llama-family models (Llama, Gemma,
  Gemma 2/3, Qwen2, Mistral, ...): transformers (5.x, ``utils.output_capturing.capture_outputs``)
  replaces the tuple's last entry with the model's ``last_hidden_state``, which the final norm made.

``last`` was the name of ``last_prenorm`` before: it is still read, as input (a ``--states`` spec, an
analysis's layers) with a warning naming both new names, and in a states folder written with it, whose
``last`` reads as ``last_prenorm`` (:class:`rmfast.states.StatesSet`).

Example:
    >>> parse_layers("16,0,last_prenorm", 30), parse_layers("all", 2)
    (['0', '16', 'last_prenorm'], ['0', '1', 'last_prenorm', 'last_normed'])
    >>> canonical_layer("8"), layer_index("last_prenorm", 30), layer_index("last_normed", 30)
    ('8', 30, 'last_normed')
"""

from __future__ import annotations

import warnings

from ..errors import UserError

#: the residual stream after the last decoder layer, before the final norm (what the norm reads)
LAST_PRENORM = "last_prenorm"
#: the final norm's output: what the head reads, HF's ``hidden_states[-1]``
LAST_NORMED = "last_normed"
#: the old name of :data:`LAST_PRENORM`, still read (input: with a warning; stored: silently)
OLD_LAST = "last"
#: the canonical name of the state after the last layer (the one ``last`` meant)
LAST = LAST_PRENORM

OLD_LAST_NOTE = ("rmfast: note: layer 'last' is read as 'last_prenorm': the residual stream after the last decoder "
                 "layer, before the final norm; what the head reads (HF's hidden_states[-1]) is 'last_normed'. "
                 "Say last_prenorm or last_normed")


def canonical_layer(name: str, *, note: bool = True) -> str:
    """The canonical spelling of a layer name: the old ``last`` is ``last_prenorm`` (with a warning naming
    both new names when ``note``; said once per process by the default warning filter); others unchanged."""
    if name == OLD_LAST:
        if note:
            warnings.warn(OLD_LAST_NOTE, UserWarning, stacklevel=1)
        return LAST_PRENORM
    return name


class ByLayer(dict):
    """States by canonical layer name that also answer the old name: ``d["last"]`` is ``d["last_prenorm"]``
    (what the Python API hands back, so ``st["last"]`` after asking for ``"last"`` keeps working).

    >>> ByLayer(last_prenorm=1)["last"], "last" in ByLayer(last_prenorm=1)
    (1, False)
    """

    def __missing__(self, key):
        if key == OLD_LAST and LAST_PRENORM in self:
            return self[LAST_PRENORM]
        raise KeyError(key)


def parse_layers(spec, n_layers: int | None) -> list[str]:
    """Canonical layer names for ``--states SPEC`` on a model with ``n_layers`` decoder layers.

    ``k`` (0 <= k < n_layers) is HF's ``hidden_states[k]``: 0 the input embeddings, k the residual
    stream after decoder layer k (1-based). ``last_prenorm`` is the output of the last decoder layer, the
    state the final norm reads (HF keeps only its normed form); ``last_normed`` is that norm's
    output, the state the head reads (HF's ``hidden_states[n_layers]``, its ``hidden_states[-1]``). ``all``
    is every one of them. ``n_layers`` itself is refused (say ``last_prenorm`` or ``last_normed``). The old
    ``last`` is ``last_prenorm``, with a warning (:func:`canonical_layer`). Names keep the order
    0..n_layers-1, last_prenorm, last_normed; repeats are dropped. ``n_layers`` None: check the names only
    (in the order given, ``all`` kept).

    >>> parse_layers("16,0,last_prenorm", 30), parse_layers("8,last_normed", None)
    (['0', '16', 'last_prenorm'], ['8', 'last_normed'])
    """
    if isinstance(spec, int) and not isinstance(spec, bool):
        spec = str(spec)  # one index
    if not isinstance(spec, str) and (isinstance(spec, (bytes, dict)) or not hasattr(spec, "__iter__")):
        raise UserError(f"--states: give layers as a string (e.g. '0,8,last_prenorm', or all) or a list of names "
                        f"and indices, got {type(spec).__name__}")
    items = spec.split(",") if isinstance(spec, str) else [str(x) for x in spec]
    items = [canonical_layer(x.strip()) for x in items if x.strip()]
    if not items:
        raise UserError("--states needs layers: e.g. 0,8,last_prenorm, or all")
    if n_layers is None:  # names only (before the model is loaded)
        bad = [x for x in items if x not in ("all", LAST_PRENORM, LAST_NORMED) and not x.lstrip("-").isdigit()]
        if bad:
            raise UserError(f"--states {bad[0]!r}: unknown layer; give indices, last_prenorm, last_normed or all")
        return items
    names: set[str] = set()
    for x in items:
        if x == "all":
            names.update([*map(str, range(n_layers)), LAST_PRENORM, LAST_NORMED])
        elif x in (LAST_PRENORM, LAST_NORMED):
            names.add(x)
        elif x.lstrip("-").isdigit():
            k = int(x)
            if k == n_layers:
                raise UserError(f"--states {k}: the model has {n_layers} layers, and {k} is their output; say last_prenorm "
                                "(before the final norm) or last_normed (after it, HF's hidden_states[-1])")
            if not 0 <= k < n_layers:
                raise UserError(f"--states {k}: layer out of range; this model has indices 0..{n_layers - 1}, "
                                "last_prenorm and last_normed")
            names.add(str(k))
        else:
            raise UserError(f"--states {x!r}: unknown layer; give indices 0..{n_layers - 1}, last_prenorm, "
                            "last_normed or all")
    return sorted(names, key=lambda n: layer_index(n, n_layers) if n != LAST_NORMED else n_layers + 1)


def layer_index(name: str, n_layers: int) -> int | str:
    """The residual-stream index of a canonical name (``last_prenorm``, or the old ``last``, -> n_layers),
    or ``last_normed``."""
    name = canonical_layer(name, note=False)
    return n_layers if name == LAST_PRENORM else name if name == LAST_NORMED else int(name)
