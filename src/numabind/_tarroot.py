"""Capture tarballs as a :class:`~numabind._roots.Root`, never extracted.

A tarball someone sent is input: its members are indexed in memory (decompressed size and
member count capped: :data:`TAR_CAP`, :data:`TAR_MEMBERS`) and only the members the reader
asks for are read, which is what makes an 11,000-member capture open in well under a
second.  Paths resolve inside the archive as in a directory capture
(:class:`~numabind._roots.Resolver`): a link to ``/etc/shadow`` names the archive's own
(absent) member, and nothing is ever written to disk.  Only ``show --input`` and its
relatives import this; the startup hook never reads a tarball.
"""

from __future__ import annotations

import errno
import os
import stat

from . import _sysfs
from ._roots import Resolver, Root, split_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    import tarfile
    from typing import Any

TAR_CAP = 64 << 20  # decompressed bytes of a capture tarball (hwloc's biggest: 9 MiB)
TAR_MEMBERS = 50_000  # members of one (hwloc's biggest test capture has 11,495)


class TarRoot(Root, Resolver):
    """A capture tarball, indexed in memory.  Nothing is written to disk."""

    def __init__(self, path: str, tar: tarfile.TarFile, members: list[tarfile.TarInfo]) -> None:
        Resolver.__init__(self)
        self.description = path
        self._tar: tarfile.TarFile | None = tar
        self._index: dict[tuple[str, ...], tarfile.TarInfo] = {}
        self._children: dict[tuple[str, ...], set[str]] = {(): set()}
        for m in members:
            parts = tuple(p for p in split_path(m.name) if p != "..")
            if not parts:
                continue
            self._index[parts] = m
            for i in range(len(parts)):
                self._children.setdefault(parts[:i], set()).add(parts[i])
            if m.isdir():
                self._children.setdefault(parts, set())

    @classmethod
    def open(cls, path: str) -> TarRoot:
        """Index a tarball (plain, gzip, bzip2 or xz); ``OSError`` if it is not one."""
        import io
        import tarfile

        data = _decompress(path)
        try:
            tar = tarfile.open(fileobj=io.BytesIO(data), mode="r:")  # noqa: SIM115 (kept open)
            members: list[tarfile.TarInfo] = []
            for m in tar:
                members.append(m)
                if len(members) > TAR_MEMBERS:
                    raise _sysfs.ReadError(f"{path}: more than {TAR_MEMBERS} members; not read")
        except tarfile.TarError as err:
            raise _sysfs.ReadError(f"{path}: not a readable tar archive ({err})") from err
        return cls(path, tar, members)

    def kind(self, parts: tuple[str, ...]) -> str | None:
        m = self._index.get(parts)
        if m is None:
            return "dir" if parts in self._children else None
        if m.issym():
            return "link"
        if m.isdir():
            return "dir"
        return "file"

    def link(self, parts: tuple[str, ...]) -> str:
        return self._index[parts].linkname

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        display = f"{self.description}:{path}"
        parts, name = self.parent(path, display)
        if name:
            parts = (*parts, name)
            what = self.kind(parts)
            if what == "link":
                parts = self.resolve(path, display)
            elif what is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", display)
        m = self._index.get(parts)
        if m is not None and m.islnk():  # a hard link names another member
            m = self._index.get(tuple(split_path(self.link(parts))))
        if m is None or not m.isreg() or self._tar is None:
            raise _sysfs.ReadError(f"{display}: not a regular file; not read")
        if m.size > cap:
            raise _sysfs.ReadError(f"{display}: larger than {cap} bytes; not read")
        f = self._tar.extractfile(m)
        if f is None:
            raise _sysfs.ReadError(f"{display}: not a regular file; not read")
        return f.read(cap).decode("utf-8", "replace").strip()

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        try:
            parts = self.resolve(path, path)
        except OSError:
            return []
        return sorted(self._children.get(parts, ()))[:cap]

    def isdir(self, path: str) -> bool:
        try:
            return self.kind(self.resolve(path, path)) == "dir"
        except OSError:
            return False

    def close(self) -> None:
        self._tar = None
        self._index.clear()
        self._children.clear()


def _decompress(path: str) -> bytes:
    """The tarball's bytes, decompressed, at most :data:`TAR_CAP` of them (a crafted
    archive that inflates to terabytes stops there)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _sysfs.ReadError(f"{path}: not a regular file; not read")
        magic = f.read(6)
    opener: Any = None
    if magic[:2] == b"\x1f\x8b":
        import gzip

        opener = gzip.open
    elif magic[:3] == b"BZh":
        import bz2

        opener = bz2.open
    elif magic == b"\xfd7zXZ\x00":
        import lzma

        opener = lzma.open
    try:
        if opener is None:
            data = _sysfs.read_bytes(path, TAR_CAP)
        else:
            with opener(path, "rb") as z:
                data = z.read(TAR_CAP + 1)
    except (EOFError, ValueError) as err:  # truncated or corrupt compressed data
        raise _sysfs.ReadError(f"{path}: corrupt compressed data ({err})") from err
    except OSError as err:
        if isinstance(err, _sysfs.ReadError):
            raise
        raise _sysfs.ReadError(f"{path}: corrupt compressed data ({err})") from err
    if len(data) > TAR_CAP:
        raise _sysfs.ReadError(f"{path}: decompresses to more than {TAR_CAP >> 20} MiB; not read")
    return data
