"""numabind's one way of speaking from inside a process: one line on stderr,
``numabind: ...``.

A leaf: every entry point that prints a binding (:meth:`numabind._apply.Binding.report`)
or a warning comes here, so the rules hold everywhere.  The line is escaped
(:func:`numabind._sysfs.escape`: a newline or an escape sequence in an environment value
cannot forge a second line or drive the terminal), written with one ``write(2)`` whose
errors are ignored (a full or closed stderr must never turn a user's exit status 0 into
120, as a buffered write would at interpreter exit), and only after Python's own buffer is
flushed, so it stays in order.

It is written only where it was meant to go.  An interpreter started with file
descriptor 2 closed (``2>&-``, daemons) has ``sys.stderr`` None, and the first file the
program opens *becomes* descriptor 2: a later line would land in the user's file.  So
nothing is written when stderr was not open at start, nor when descriptor 2 is no longer
the file it was when numabind first looked (:data:`_STDERR_AT_START`).
"""

from __future__ import annotations

import os
import sys

import _numabind_base

from ._sysfs import escape


def _identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# what descriptor 2 was when the interpreter started: as the startup hook saw it before the
# program's first statement (its fast path binds without loading this module), else when
# numabind was first imported
_START = sys.modules.get("_numabind_start")
_STDERR_AT_START: tuple[int, int] | None = (
    _numabind_base.stderr_at_start
    if _START is not None and getattr(_START, "_done", None)
    else (_identity(2) if sys.__stderr__ is not None else None)
)


def _target() -> int | None:
    """The descriptor to write to, or None when a line would land somewhere else."""
    if sys.__stderr__ is None or _STDERR_AT_START is None:
        return None  # fd 2 was not open when the interpreter started
    stream = sys.stderr
    try:
        fd = stream.fileno() if stream is not None else 2
    except Exception:
        fd = 2
    if fd == 2 and _identity(2) != _STDERR_AT_START:
        return None  # closed and reused since: not the stderr the user meant
    return fd


def say_lines(lines: list[str]) -> None:
    """Several lines (a report) in one write, each escaped and marked ``numabind:``."""
    _write("".join(f"numabind: {escape(line, 8000)}\n" for line in lines))


def say(message: str) -> None:
    """One line on stderr, whatever the message holds and whatever stderr is."""
    _write(f"numabind: {escape(message, 8000)}\n")


said = 0  # lines written (numabind._replay keeps no answer of a process that said one)


def _write(text: str) -> None:
    global said
    said += 1
    fd = _target()
    if fd is None or not text:
        return
    data = text.encode("utf-8", "replace")
    try:
        sys.stderr.flush()
    except Exception:
        pass
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass
