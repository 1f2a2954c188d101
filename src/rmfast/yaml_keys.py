"""YAML as rmfast reads a user's configs and metadata: PyYAML's safe loader, except that a key given twice in one
mapping is an error marked at the second (PyYAML keeps the last and drops the first without a word)."""

from __future__ import annotations

import functools


def yaml_load_unique(text: str):
    """``yaml.safe_load(text)``, except that a key given twice in one mapping (at any depth) is a YAML
    error marked at the second one.

    PyYAML keeps the last of two equal keys, so a config with a model or a prompt listed twice under
    one key would silently lose the first. Keys that a ``<<`` merge brings in may be overridden (that is
    what merging is for); only keys written twice in the same mapping are refused.

    >>> yaml_load_unique("a: 1\\nb: {c: 2}\\n")
    {'a': 1, 'b': {'c': 2}}
    >>> yaml_load_unique("a: 1\\nb:\\n  c: 2\\n  c: 3\\n")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    yaml.constructor.ConstructorError: ...duplicate key 'c', first given at line 3...
    """
    import yaml

    return yaml.load(text, Loader=_unique_key_loader())


def yaml_problem(e) -> str:
    """A PyYAML error in a few words with its line: ``at line 4 (duplicate key 'a', ...)``.

    >>> import yaml
    >>> try:
    ...     yaml_load_unique("a: 1\\na: 2\\n")
    ... except yaml.YAMLError as e:
    ...     yaml_problem(e)
    "at line 2 (duplicate key 'a', first given at line 1; give each key once)"
    """
    mark = getattr(e, "problem_mark", None)
    at = f"at line {mark.line + 1} " if mark is not None else ""
    return f"{at}({getattr(e, 'problem', None) or str(e).splitlines()[0] or type(e).__name__})"


@functools.lru_cache(maxsize=None)
def _unique_key_loader():
    """The SafeLoader subclass behind :func:`yaml_load_unique` (built on first use: yaml is imported lazily)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}, first given at line {first.line + 1}; give each key once",
                        key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader
