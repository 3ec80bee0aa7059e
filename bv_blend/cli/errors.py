"""How a command fails on input the user can fix: one line that names the problem and the fix, no traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable


class CommandError(Exception):
    """Bad input or a missing prerequisite, reported as ``<prog>: error: <message>`` with exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def run_guarded(prog: str, command: Callable[[], int]) -> int:
    """``command()``'s exit code; a :class:`CommandError` or Ctrl-C becomes a message and a non-zero code.

    Anything else keeps its traceback: it is a defect to report, not input to fix.
    """
    try:
        return command()
    except CommandError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
