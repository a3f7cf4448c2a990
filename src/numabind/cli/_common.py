"""What every ``numabind`` command shares, owned once: the exit statuses (one table), how
text reaches a terminal, how a file is written, and how notes and problems look.

* **Exit statuses**: :data:`EXITS`; ``--help`` and docs/cli.rst are checked against it.
* **Text**: every line a command prints goes through :func:`write_lines`, which escapes
  whatever is not printable in each line (:func:`numabind._sysfs.escape`): fields read
  from another user's registry entry, from ``/proc/PID/*`` or from a capture can neither
  start a line of their own nor drive the terminal, whichever command prints them.  JSON
  (``json.dump`` escapes control characters itself) goes through :func:`write_json`.
* **Files**: every file a command writes goes through :class:`OutputFile`, checked before
  any work is done (an existing output is replaced only with ``--force``, as ``lstopo``
  does: otherwise one line and exit status 2), then written to a fresh file created with
  ``O_EXCL|O_NOFOLLOW|O_NONBLOCK`` in the target's own directory and moved into place: a
  link planted at the output is replaced, never followed; a FIFO there never blocks.
  ``-`` is standard output, for every output option, and two options both asking for it
  are a usage error.
* **Notes and problems**: lists of one-line strings in JSON (``notes``, ``problems``,
  ``warnings``), ``note: ...`` / ``problem: ...`` lines in text (:func:`notice_lines`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys

from .._errors import UsageError
from .._model import Record
from .._sysfs import escape

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import IO, Any


class Exit(Record):
    """One exit status of the ``numabind`` command: what it means overall (``meaning``,
    the top-level ``--help`` and docs/cli.rst) and for each command that returns it
    (``by_command``: a command's ``--help`` lists only its own)."""

    code: int
    name: str
    meaning: str
    by_command: tuple[tuple[str, str], ...] = ()


_USAGE = (
    "usage error: bad arguments, an unreadable or malformed input, an output that exists "
    "(without --force)"
)
COMMANDS = ("show", "gather", "run", "check", "bench", "doctor")
EXITS: tuple[Exit, ...] = (
    Exit(
        code=0,
        name="ok",
        meaning="success; for check: every process checked is on its plan",
        by_command=(
            *((c, "success") for c in COMMANDS if c != "check"),
            ("check", "every process checked is on its plan"),
        ),
    ),
    Exit(
        code=1,
        name="off-plan",
        meaning="check: a process is off its plan (--job: a rank of any node); run: strict "
        "mode could not bind, or --device/--node/--cpus could not be honoured (the command "
        "is not run); doctor: something keeps ranks from being bound",
        by_command=(
            ("check", "a process is off its plan (--job: a rank of any node)"),
            (
                "run",
                "strict mode could not bind, or --device/--node/--cpus could not be honoured "
                "(the command is not run)",
            ),
            ("doctor", "something keeps ranks from being bound"),
        ),
    ),
    Exit(
        code=2,
        name="usage",
        meaning=f"{_USAGE}; check --job: no such job, Slurm is not installed here, or the "
        "collector's interpreter, numabind or Slurm's tools could be changed by another user "
        "(they are not run)",
        by_command=(
            *((c, _USAGE) for c in COMMANDS if c != "check"),
            (
                "check",
                f"{_USAGE}; --job: no such job, Slurm is not installed here, or the "
                "collector's interpreter, numabind or Slurm's tools could be changed by "
                "another user (they are not run)",
            ),
        ),
    ),
    Exit(
        code=3,
        name="unreachable",
        meaning="check --pid: a process named is gone (or a zombie), or has no plan to check "
        "against; check --all: a rank not reached before --deadline; check --job: no rank "
        "off plan, but a node did not answer (or sent an invalid record, or would not run "
        "the collector) or a rank could not be checked; check --store, --ray: the store or "
        "dashboard could not be reached or read",
        by_command=(
            (
                "check",
                "--pid: a process named is gone (or a zombie), or has no plan to check "
                "against; --all: a rank not reached before --deadline; --job: no rank off "
                "plan, but a node did not answer (or sent an invalid record, or would not run "
                "the collector) or a rank could not be checked; --store, --ray: the store or "
                "dashboard could not be reached or read",
            ),
        ),
    ),
    Exit(
        code=127,
        name="not-run",
        meaning="run: the command could not be executed",
        by_command=(("run", "the command could not be executed"),),
    ),
)
OK, OFF_PLAN, USAGE, UNREACHABLE, NOT_RUN = (e.code for e in EXITS)


def exit_help(command: str | None = None) -> str:
    """The exit-status section of ``--help``, from :data:`EXITS`: every status for the
    top-level help, only the command's own (in its words) for ``numabind COMMAND``."""
    if command is None:
        return "exit status:\n" + "\n".join(f"  {e.code:<3} {e.meaning}" for e in EXITS)
    rows = [(e.code, dict(e.by_command)[command]) for e in EXITS if command in dict(e.by_command)]
    return "exit status:\n" + "\n".join(f"  {code:<3} {meaning}" for code, meaning in rows)


# --- text and JSON -----------------------------------------------------------------------------


def write_lines(lines: Iterable[str], stream: IO[str] | None = None) -> None:
    """Print ``lines``, each escaped to one printable line (see the module docstring)."""
    out = sys.stdout if stream is None else stream
    out.write("".join(escape(line, 20000) + "\n" for line in lines))


def write_json(data: Any, stream: IO[str] | None = None) -> None:
    out = sys.stdout if stream is None else stream
    json.dump(data, out, indent=2)
    out.write("\n")


def write_json_line(data: Any, stream: IO[str] | None = None) -> None:
    """``data`` as one line of JSON (a collector's record: srun --label passes a line
    through whole); ASCII, so control characters in it are escapes, never bytes."""
    out = sys.stdout if stream is None else stream
    out.write(json.dumps(data, separators=(",", ":"), ensure_ascii=True) + "\n")


def unreachable(host: str, port: int, timeout: float) -> str | None:
    """Why a TCP service (a job's store, a Ray cluster) cannot be reached, or None: one
    plain connection, so that a client that retries for minutes is never started for
    nothing."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def notice_lines(kind: str, items: Iterable[str], indent: str = "") -> list[str]:
    """``note: ...`` or ``problem: ...`` lines, one per item."""
    return [f"{indent}{kind}: {item}" for item in items]


# --- files -------------------------------------------------------------------------------------


class OutputFile:
    """One output of a command (``--svg FILE``, ``gather FILE``): a path, or ``-`` for
    standard output.  :meth:`check` runs before the command does any work; :meth:`write`
    writes the whole content at once (see the module docstring)."""

    def __init__(self, path: str, option: str, command: str, force: bool = False) -> None:
        self.path = path
        self.option = option
        self.command = command
        self.force = force
        self.stdout = path == "-"

    def _usage(self, why: str) -> UsageError:
        return UsageError(f"numabind {self.command}: {self.option} {self.path!r}: {why}")

    def check(self) -> OutputFile:
        """Refuse now what the write would refuse later; returns self."""
        if self.stdout:
            return self
        if not self.path or "\0" in self.path:
            raise self._usage("not a file name")
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise self._usage(f"no such folder {directory!r}")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise self._usage(f"the folder {directory!r} is not writable")
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return self
        except OSError as err:
            raise self._usage(err.strerror or str(err)) from None
        if stat.S_ISDIR(st.st_mode):
            raise self._usage("is a directory")
        if not self.force:
            raise self._usage("exists; --force replaces it")
        return self

    def write(self, data: bytes | str) -> None:
        """Write the content (bytes, or text as UTF-8); raises :class:`UsageError` with
        one line when the file cannot be written."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if self.stdout:
            sys.stdout.flush()
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        name = os.path.basename(self.path)
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise self._usage(err.strerror or str(err)) from None
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            self._write_at(dfd, tmp, raw)
            self._move(dfd, tmp, name)
        except OSError as err:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise self._usage(err.strerror or str(err)) from None
        finally:
            os.close(dfd)

    @staticmethod
    def _write_at(dfd: int, tmp: str, raw: bytes) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def _move(self, dfd: int, tmp: str, name: str) -> None:
        if self.force:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return
        # without --force, a file that appeared since check() is not replaced either:
        # link(2) fails with EEXIST where rename would overwrite
        try:
            os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            raise OSError(errno.EEXIST, "appeared meanwhile; --force replaces it") from None
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            try:  # a file system without hard links: the check and a rename
                os.lstat(name, dir_fd=dfd)
            except FileNotFoundError:
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
                return
            raise OSError(errno.EEXIST, "appeared meanwhile; --force replaces it") from None
        os.unlink(tmp, dir_fd=dfd)


def one_stdout(outputs: Iterable[tuple[str, bool]], command: str) -> None:
    """At most one option may send its output to standard output: ``(option, wants)``.
    The way out offered is the one that exists: an option given ``-`` (``--svg -``) can
    go to a file instead; the others (``--json``, ``--matrix``, ...) print only."""
    wanting = [option for option, wants in outputs if wants]
    if len(wanting) > 1:
        to_file = [o.removesuffix(" -") for o in wanting if o.endswith(" -")]
        fix = (
            f"give {to_file[0]} a FILE instead of -"
            if to_file
            else "give one of them (each prints only to standard output)"
        )
        raise UsageError(
            f"numabind {command}: {' and '.join(wanting)} both write to standard output; {fix}"
        )
