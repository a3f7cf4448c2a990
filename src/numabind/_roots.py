"""Captures laid out as a directory (and, with :mod:`numabind.capture._tarroot`, the linear
resolver both capture readers share).

The live system is read as it is by :class:`numabind._sources.LiveRoot`.  Anything else
is input that may have been crafted, and its paths resolve *inside* it, the way
``openat2(RESOLVE_IN_ROOT)`` would: a symbolic link is followed only within the capture
(an absolute target means the capture's own root; ``..`` stops at it), at most
:data:`MAX_LINKS` links and :data:`PATH_MAX` bytes per target, and a file opened is
checked to lie under the capture before a byte of it is read: through
``/proc/self/fd`` where there is one, else by opening one component at a time with
``O_NOFOLLOW`` from the capture's own directory descriptor.  So a link to ``/etc/shadow``
or ``/dev/zero`` in a capture reads the capture's own (absent) file, never the host's.

Resolution is linear in what the path and its links spell (a stack of directories, never
a list rebuilt per component), and every root counts its work in a
:class:`~numabind._sysfs.Budget`.

Tarballs are never extracted (:mod:`numabind.capture._tarroot`, which resolves its paths with the
same :class:`Resolver`); the startup hook never loads that module.
"""

from __future__ import annotations

import errno
import os
import stat

from . import _sysfs
from ._sources import Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PARENTS_CAP = 1 << 14  # directories remembered per root (a 1024-CPU capture needs ~3000)
MAX_LINKS = 40  # as the kernel's own limit on symbolic links in one lookup
PATH_MAX = 4096  # as the kernel's: the longest path or link target followed


def split_path(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


class Resolver:
    """Lexical resolution of a path inside a tree, one component at a time, over the
    tree's own *handles* (a directory entry, an index node).

    Subclasses say what the tree's top is (``_top``), what a directory holds under a name
    (``_child``: a handle, None when absent), what a handle is (``_kind``: 'dir', 'file',
    'link' or 'special') and where a link points (``_target``).  Each component costs one
    ``_child`` call; ``..`` pops a stack; a link pushes its target's components: the work
    is linear in the components spelled, at most :data:`MAX_LINKS` targets of
    :data:`PATH_MAX` bytes.  The directory of a path is remembered by its spelling
    (:meth:`parent`), so the second file of a directory costs one lookup.
    """

    def __init__(self) -> None:
        self._parents: dict[str, Any] = {}

    def _top(self) -> Any:
        raise NotImplementedError

    def _child(self, handle: Any, name: str) -> Any | None:
        raise NotImplementedError

    def _kind(self, handle: Any) -> str:
        raise NotImplementedError

    def _target(self, handle: Any) -> str:
        raise NotImplementedError

    def resolve(self, path: str, display: str) -> Any:
        """The handle ``path`` names, every link followed inside the tree."""
        return self._follow(path, display)[0]

    def realpath(self, path: str) -> str | None:
        """Where ``path`` leads inside the tree, links followed (None: nowhere)."""
        try:
            return "/" + "/".join(self._follow(path, path)[1])
        except OSError:
            return None

    def _follow(self, path: str, display: str) -> tuple[Any, list[str]]:
        if len(path) > PATH_MAX:
            raise OSError(errno.ENAMETOOLONG, "path too long", display)
        top = self._top()
        stack = [top]
        names: list[str] = []
        pending = split_path(path)
        pending.reverse()
        hops = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if len(stack) > 1:
                    stack.pop()
                    names.pop()
                continue
            handle = self._child(stack[-1], name)
            if handle is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", display)
            kind = self._kind(handle)
            if kind == "link":
                hops += 1
                if hops > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many symbolic links", display)
                target = self._target(handle)
                if len(target) > PATH_MAX:
                    raise OSError(errno.ENAMETOOLONG, "link target too long", display)
                if target.startswith("/"):
                    stack, names = [top], []  # absolute: the capture's own root
                more = split_path(target)
                more.reverse()
                pending.extend(more)
                continue
            if pending and kind != "dir":
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", display)
            stack.append(handle)
            names.append(name)
        return stack[-1], names

    def parent(self, path: str, display: str) -> tuple[Any, str]:
        """``path``'s directory, resolved (and remembered by its spelling), and the last
        component, not yet looked at.  Every file of one PCI function or one CPU shares a
        directory reached through the same links, so those links are followed once per
        root, not once per file; the last component is the caller's to check."""
        head, _, name = path.rpartition("/")
        if name in ("", ".", ".."):
            return self.resolve(path, display), ""
        handle = self._parents.get(head)
        if handle is None:
            handle = self.resolve(head, display)
            if self._kind(handle) != "dir":
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", display)
            if len(self._parents) < _PARENTS_CAP:
                self._parents[head] = handle
        return handle, name

    def lookup(self, path: str, display: str) -> Any:
        """The handle of ``path`` through :meth:`parent`: the last component resolved
        only when it is a link."""
        handle, name = self.parent(path, display)
        if not name:
            return handle
        child = self._child(handle, name)
        if child is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", display)
        if self._kind(child) == "link":
            return self.resolve(path, display)
        return child


_O_READ = _sysfs.OPEN_FLAGS | os.O_NOFOLLOW
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class _Entry:
    """A DirRoot handle: the components below the capture's top, and what lstat saw."""

    __slots__ = ("kind", "parts")

    def __init__(self, parts: tuple[str, ...], kind: str) -> None:
        self.parts = parts
        self.kind = kind


def _kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "special"


class DirRoot(Root, Resolver):
    """A capture laid out as a directory (what ``hwloc-gather-topology`` writes, or a
    tree named by ``NUMABIND_SYSROOT``), read without ever leaving it.

    The directory is opened once, here (a missing one raises ``FileNotFoundError``, one
    that is not a directory ``NotADirectoryError``); every later open starts from that
    descriptor, so a top directory renamed or swapped afterwards changes nothing."""

    realpath = Resolver.realpath

    def __init__(self, path: str) -> None:
        self.description = path
        Root.__init__(self)
        Resolver.__init__(self)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NONBLOCK)
        self._fd: int | None = fd
        try:
            self._real: str | None = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            self._real = None  # no /proc: every open walks from the descriptor
        if self._real is not None and not self._real.startswith("/"):
            self._real = None

    # --- the tree, as the resolver sees it
    def _top(self) -> _Entry:
        return _Entry((), "dir")

    def _child(self, handle: _Entry, name: str) -> _Entry | None:
        if len(name) > 255 or len(handle.parts) >= PATH_MAX // 2:
            return None
        parts = (*handle.parts, name)
        try:
            st = os.lstat("/".join(parts), dir_fd=self._root_fd())
        except OSError:
            return None
        return _Entry(parts, _kind_of(st.st_mode))

    def _kind(self, handle: _Entry) -> str:
        return handle.kind

    def _target(self, handle: _Entry) -> str:
        return os.readlink("/".join(handle.parts), dir_fd=self._root_fd())

    def _root_fd(self) -> int:
        if self._fd is None:
            raise OSError(errno.EBADF, "capture closed", self.description)
        return self._fd

    # --- opening inside it
    def _open(self, parts: tuple[str, ...], flags: int, display: str) -> int:
        """Open the resolved (link-free) ``parts`` and prove the result lies inside."""
        top = self._root_fd()
        if not parts:
            return os.open(".", flags & ~os.O_NOFOLLOW, dir_fd=top)
        if self._real is None:
            return self._walk(parts, flags)
        fd = os.open("/".join(parts), flags, dir_fd=top)
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            os.close(fd)
            return self._walk(parts, flags)  # /proc went away: the slow, sure way
        real = self._real.rstrip("/")
        if opened != self._real and not opened.startswith(real + "/"):
            os.close(fd)
            raise _sysfs.ReadError(f"{display}: resolves outside the capture; not read")
        return fd

    def _walk(self, parts: tuple[str, ...], flags: int) -> int:
        """One component at a time with ``O_NOFOLLOW`` from the top descriptor: no link
        is followed, so the file opened is inside whatever was swapped meanwhile."""
        cur = self._root_fd()
        try:
            for name in parts[:-1]:
                nxt = os.open(name, _O_DIR, dir_fd=cur)
                if cur != self._fd:
                    os.close(cur)
                cur = nxt
            return os.open(parts[-1], flags, dir_fd=cur)
        finally:
            if cur != self._fd:
                os.close(cur)

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        display = _sysfs.join(self.description, path)
        handle = self.lookup(path, display)
        if handle.kind != "file":
            raise _sysfs.ReadError(f"{display}: not a regular file; not read")
        try:
            fd = self._open(handle.parts, _O_READ, display)
        except FileNotFoundError:
            raise FileNotFoundError(errno.ENOENT, "no such file", display) from None
        except OSError as err:
            if isinstance(err, _sysfs.ReadError):
                raise
            if err.errno == errno.ELOOP:  # swapped for a link since it was looked at
                raise _sysfs.ReadError(
                    f"{display}: resolves outside the capture; not read"
                ) from None
            raise
        try:
            data = _sysfs.read_fd(fd, display, cap)
        finally:
            os.close(fd)
        self.budget.charge(files=1, nbytes=len(data))
        return data.decode("utf-8", "replace").strip()

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        try:
            handle = self.resolve(path, path)
            if handle.kind != "dir":
                return []
            fd = self._open(handle.parts, _O_DIR, path)
        except OSError:
            return []
        try:
            names, _ = _sysfs.entries(fd, cap)
        except OSError:
            return []
        finally:
            os.close(fd)
        self.budget.charge(files=1)
        return sorted(names)

    def isdir(self, path: str) -> bool:
        try:
            return bool(self.resolve(path, path).kind == "dir")
        except OSError:
            return False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def for_path(path: str) -> Root:
    """The root for ``NUMABIND_SYSROOT``-style paths: live for ``/``, else a directory
    (``OSError`` when it is missing or not a directory)."""
    if path in ("", "/"):
        from ._sources import LiveRoot

        return LiveRoot()
    return DirRoot(path)
