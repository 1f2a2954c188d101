"""User-facing errors.

A :class:`UserError` is a problem with what the user asked for (a missing file, a bad
option, an unsplittable template). The CLI prints its message on one line and exits
with status 2, with no traceback. Anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message names the problem and, where possible, the fix."""

    exit_code = 2
