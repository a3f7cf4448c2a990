"""Where a machine's files come from: the live system, or a directory (and, in
:mod:`numabind._tarroot`, a tarball in memory).

A :class:`Root` answers "read ``/sys/...``" and "list ``/sys/...``" for one machine.  The
live system is read as it is (``/sys`` and ``/proc`` are the kernel's own).  Anything else
is input that may have been crafted, and its paths resolve *inside* it, the way
``openat2(RESOLVE_IN_ROOT)`` would: a symbolic link is followed only within the capture
(an absolute target means the capture's own root; ``..`` stops at it), at most
:data:`MAX_LINKS` links per path, and a file opened is checked to lie under the capture
before a byte of it is read.  So a link to ``/etc/shadow`` or ``/dev/zero`` in a capture
reads the capture's own (absent) file, never the host's.

Tarballs are never extracted (:mod:`numabind._tarroot`, which resolves its paths with the
same :class:`Resolver`); the startup hook never loads that module.
"""

from __future__ import annotations

import errno
import os
import stat

from . import _sysfs

_PARENTS_CAP = 1 << 14  # directories remembered per root (a 1024-CPU capture needs ~3000)
MAX_LINKS = 40  # as the kernel's own limit on symbolic links in one lookup


class Root:
    """One machine's file tree.  ``read`` raises ``OSError`` (``FileNotFoundError`` for an
    absent file, :class:`numabind._sysfs.ReadError` for one refused); ``opt`` returns None
    instead."""

    description = "?"
    live = False

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        raise NotImplementedError

    def opt(self, path: str, cap: int = _sysfs.READ_CAP) -> str | None:
        try:
            return self.read(path, cap)
        except OSError:
            return None

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the root holds (a tarball's bytes)."""


class LiveRoot(Root):
    """This machine.  Its /sys and /proc are the kernel's, so paths are used as they are;
    reads still refuse anything but a regular file and stop at a cap."""

    description = "live system"
    live = True

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        return _sysfs.read_bytes(path, cap).decode("utf-8", "replace").strip()

    def opt(self, path: str, cap: int = _sysfs.READ_CAP) -> str | None:
        return _sysfs.read_opt(path, cap)

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        return _sysfs.listdir(path, cap)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)


def split_path(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


class Resolver:
    """Lexical resolution of a path inside a tree, one component at a time.

    ``kind(components)`` says what the tree holds at a (resolved, link-free) path: 'dir',
    'file', 'link' or None (absent); ``link(components)`` reads a link's target.
    Resolved directories are remembered, so a second file in the same directory costs
    nothing extra.
    """

    def __init__(self) -> None:
        self._dirs: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._parents: dict[str, tuple[str, ...]] = {}

    def kind(self, parts: tuple[str, ...]) -> str | None:
        raise NotImplementedError

    def link(self, parts: tuple[str, ...]) -> str:
        raise NotImplementedError

    def resolve(self, path: str, display: str) -> tuple[str, ...]:
        pending = split_path(path)
        done: tuple[str, ...] = ()
        hops = 0
        while pending:
            name = pending.pop(0)
            if name == "..":
                done = done[:-1]
                continue
            cand = (*done, name)
            if pending and cand in self._dirs:
                done = self._dirs[cand]
                continue
            what = self.kind(cand)
            if what is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", display)
            if what == "link":
                hops += 1
                if hops > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", display)
                target = self.link(cand)
                if target.startswith("/"):
                    done = ()  # absolute: the capture's own root
                pending = split_path(target) + pending
                continue
            if pending:
                if what != "dir":
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", display)
                self._dirs[cand] = cand
            done = cand
        return done

    def parent(self, path: str, display: str) -> tuple[tuple[str, ...], str]:
        """``path``'s directory, resolved (and remembered by its spelling), and the last
        component, not yet looked at.  Every file of one PCI function or one CPU shares a
        directory reached through the same links, so those links are followed once per
        root, not once per file; the last component is the caller's to check."""
        head, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            return self.resolve(path, display), ""
        parts = self._parents.get(head)
        if parts is None:
            parts = self.resolve(head, display)
            if self.kind(parts) != "dir":
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", display)
            if len(self._parents) < _PARENTS_CAP:
                self._parents[head] = parts
        return parts, name


_O_READ = _sysfs.OPEN_FLAGS | os.O_NOFOLLOW


class DirRoot(Root, Resolver):
    """A capture laid out as a directory (what ``hwloc-gather-topology`` writes, or a
    tree named by ``NUMABIND_SYSROOT``), read without ever leaving it."""

    def __init__(self, path: str) -> None:
        Resolver.__init__(self)
        self.description = path
        self._real = os.path.realpath(path)

    def _host(self, parts: tuple[str, ...]) -> str:
        return self._real + "/" + "/".join(parts) if parts else self._real

    def kind(self, parts: tuple[str, ...]) -> str | None:
        try:
            st = os.lstat(self._host(parts))
        except OSError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return "link"
        return "dir" if stat.S_ISDIR(st.st_mode) else "file"

    def link(self, parts: tuple[str, ...]) -> str:
        return os.readlink(self._host(parts))

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        display = _sysfs.join(self.description, path)
        parts, name = self.parent(path, display)
        host = self._host((*parts, name) if name else parts)
        try:
            # O_NOFOLLOW refuses a link in the last component (ELOOP): only then is it
            # resolved the slow way, inside the capture
            fd = os.open(host, _O_READ)
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise FileNotFoundError(errno.ENOENT, "no such file", display) from None
            if err.errno != errno.ELOOP:
                raise
            host = self._host(self.resolve(path, display))
            fd = os.open(host, _O_READ)
        try:
            # The components were checked one by one; a directory swapped for a link
            # since then would show here, in the path the kernel actually opened.
            try:
                opened = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                opened = host
            if opened != self._real and not opened.startswith(self._real.rstrip("/") + "/"):
                raise _sysfs.ReadError(f"{display}: resolves outside the capture; not read")
            data = _sysfs.read_fd(fd, display, cap)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace").strip()

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        try:
            parts = self.resolve(path, path)
        except OSError:
            return []
        if self.kind(parts) != "dir":
            return []
        return _sysfs.listdir(self._host(parts), cap)

    def isdir(self, path: str) -> bool:
        try:
            return self.kind(self.resolve(path, path)) == "dir"
        except OSError:
            return False


def for_path(path: str) -> Root:
    """The root for ``NUMABIND_SYSROOT``-style paths: live for ``/``, else a directory."""
    if path in ("", "/"):
        return LiveRoot()
    return DirRoot(path)
