"""Which statistic an analysis computes: rmfast's own, or the papers' exactly as published.

``method="rmfast"`` (the default) is the form rmfast documents as better; ``method="paper"``
reproduces what the authors' scripts compute, quirks included, so a published number can be
regenerated and then set beside rmfast's. ``docs/paper_methods.md`` lists every difference
and how much it moves the results on the published data.
"""

from __future__ import annotations

from ...errors import UserError

#: The two forms every method-aware analysis accepts.
METHODS = ("rmfast", "paper")


def check_method(method: str) -> str:
    """Return ``method`` if known, else raise a one-line :class:`UserError`.

    >>> check_method("paper")
    'paper'
    """
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; use one of {METHODS} "
                        "(rmfast: rmfast's statistic; paper: the authors' exactly)")
    return method
