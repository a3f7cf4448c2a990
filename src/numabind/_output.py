"""numabind's one way of speaking: one line on stderr, ``numabind: ...``.

A leaf: every entry point that prints a binding or a warning comes here, so the rules
hold everywhere.  The line is cleaned (a newline in an environment value cannot forge a
second line), written with one ``write(2)`` whose errors are ignored (a full or closed
stderr must never turn a user's exit status 0 into 120, as a buffered write would at
interpreter exit), and only after Python's own buffer is flushed, so it stays in order.
"""

from __future__ import annotations

import os
import sys

from ._sysfs import clean_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._binding import Binding


def say(message: str) -> None:
    """One line on stderr, whatever the message holds and whatever stderr is."""
    data = f"numabind: {clean_line(message, 8000)}\n".encode("utf-8", "replace")
    try:
        sys.stderr.flush()
    except Exception:
        pass
    try:
        fd = sys.stderr.fileno() if sys.stderr is not None else 2
    except Exception:
        fd = 2
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass


def report(binding: Binding, verbose: bool, prefix: str = "") -> None:
    """The rule for printing a binding, at every entry point: a failure, a replaced CPU
    mask or a refused call always get their line; anything else only when verbose."""
    if binding.worth_a_line(verbose):
        say(prefix + str(binding))
