"""The one exception type for mistakes a user can make (recipe, data, reward), as opposed to bugs.

The CLI prints a `UserError` as one line on stderr and exits with code 2; everything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A mistake the user can fix: the message names the file, key or row and what was expected."""

    def __init__(self, message: str):
        # Collapse to one line: the CLI contract is exactly one line on stderr.
        super().__init__(" ".join(str(message).split()))
