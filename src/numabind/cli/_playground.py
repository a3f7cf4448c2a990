"""``numabind gather --example NAME DIR``: an example machine written out as a sysroot, a
playground for every knob.

``show --example`` plans for a generated machine in memory; on disk, the same tree lets
everything that reads a machine read it: ``NUMABIND_SYSROOT=DIR`` points the startup
hook, ``run``, ``check``, ``doctor`` and the Python API at it (``numabind show``,
``LOCAL_RANK=5 numabind run -- CMD``, ``numabind.plan_for(device=5)``), so that the knobs
can be tried on a DGX, a GB200 or an MI300X from a laptop.  The binding itself is still
this kernel's: a plan for CPUs this machine does not have is refused by it, and the line
saying so is what a rank on that machine would not print.

The folder is numabind's own from the first call: created here (or an empty one this
user owns that no one else may write), filled through directory descriptors with
``O_EXCL | O_NOFOLLOW``, links made by numabind itself; nothing is written through a
link or into a folder another user can change.  ``DIR`` ending in ``.tar``, ``.tar.gz``,
``.tgz``, ``.tar.bz2`` or ``.tar.xz`` writes a capture tarball of the example instead
(what ``numabind gather`` writes on a real machine).
"""

from __future__ import annotations

import errno
import os
import stat

from .._errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

TARBALL = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def is_tarball(path: str) -> bool:
    return path.endswith(TARBALL)


def _usage(path: str, why: str) -> UsageError:
    return UsageError(f"numabind gather --example: {path!r}: {why}")


# the file gather leaves in a folder it wrote: what --force may replace (nothing else)
MARK = ".numabind-example"


def _clear(fd: int, depth: int = 0) -> None:
    """Empty the folder ``fd`` (this user's, no one else may write it: checked), through
    descriptors, never following a link out of it."""
    if depth > 64:  # deeper than any tree gather writes
        raise OSError(errno.ELOOP, "too deep")
    for name in os.listdir(fd):
        if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=fd)  # fmt: skip
            try:
                _clear(inner, depth + 1)
            finally:
                os.close(inner)
            os.rmdir(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)


def _open_target(path: str, force: bool = False) -> int:
    """A descriptor of the folder to fill: made now (mode 0755), or an empty folder this
    user owns that group and others cannot write (``mktemp -d``); with ``force`` also such
    a folder gather wrote before (its :data:`MARK`), emptied first."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        pass
    except OSError as err:
        raise _usage(path, err.strerror or str(err)) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        why = (
            "not a folder (a link or a file)"
            if err.errno in (errno.ENOTDIR, errno.ELOOP)
            else (err.strerror or str(err))
        )
        raise _usage(path, why) from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not by this user"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = "writable by group or others"
    elif os.listdir(fd):
        ours = MARK in os.listdir(fd)
        if force and ours:
            try:
                _clear(fd)
            except OSError as err:
                problem = f"cannot empty it ({err.strerror or err})"
        elif ours:
            problem = "not empty: give a new or an empty folder, or --force to replace it"
        else:
            problem = "not empty: give a new or an empty folder" + (
                ": --force replaces only a folder numabind gather --example wrote" if force else ""
            )
    if problem:
        os.close(fd)
        raise _usage(path, problem)
    return fd


def _dir_at(parent: int, name: str) -> int:
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)


def _place(top: int, path: str) -> tuple[int, str]:
    """A descriptor of the folder that holds ``path`` (made as needed), and its name."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise OSError(errno.EINVAL, f"not a path in the tree: {path!r}")
    fd = os.dup(top)
    for part in parts[:-1]:
        inner = _dir_at(fd, part)
        os.close(fd)
        fd = inner
    return fd, parts[-1]


def write_tree(
    path: str, files: Mapping[str, str], links: Mapping[str, str], force: bool = False
) -> int:
    """Write ``files`` (path -> text) and ``links`` (path -> absolute target in the
    tree, made relative as sysfs has them) under the folder ``path``, and the mark that
    lets ``--force`` replace it later; returns how many files were written."""
    top = _open_target(path, force)
    try:
        files = {**files, MARK: "written by numabind gather --example; --force replaces it\n"}
        for name, text in files.items():
            fd, leaf = _place(top, name)
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                out = os.open(leaf, flags, 0o644, dir_fd=fd)
                try:
                    data = memoryview(text.encode())
                    while data:
                        data = data[os.write(out, data) :]
                finally:
                    os.close(out)
            finally:
                os.close(fd)
        for name, target in links.items():
            fd, leaf = _place(top, name)
            try:
                rel = os.path.relpath(target, os.path.dirname(name))
                os.symlink(rel, leaf, dir_fd=fd)
            finally:
                os.close(fd)
    except OSError as err:
        raise _usage(path, f"cannot write it ({err.strerror or err})") from None
    finally:
        os.close(top)
    return len(files) - 1


def sysroot_note(path: str) -> str | None:
    """Why ``NUMABIND_SYSROOT=path`` would be ignored here (root and a path another user
    could change), or None."""
    from .._environ import BY_NAME, _redirect

    notes: list[str] = []
    used = _redirect(BY_NAME["NUMABIND_SYSROOT"], path, True, notes)
    return None if used == path else "; ".join(notes) or "NUMABIND_SYSROOT would be ignored"
