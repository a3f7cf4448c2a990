"""Capture tarballs as a :class:`~numabind._roots.Root`, never extracted, read by
numabind's own bounded parser.

A tarball someone sent is input.  It is opened once, without blocking (a FIFO in its place
is refused by ``fstat``), decompressed from that descriptor up to :data:`TAR_CAP` bytes,
and its headers are parsed here rather than by :mod:`tarfile`, whose behaviour on crafted
archives depends on the interpreter (the pax-header ReDoS of CVE-2024-6232 on 3.11.7,
extraction filters absent on Debian's 3.11.2):

* every header's checksum is verified, its size is octal or base-256 within the archive,
  and a pax header is parsed under numabind's own bound (:data:`PAX_CAP` bytes,
  :data:`PAX_RECORDS` records): no regular expression ever sees a 400,000-digit header;
* a member's name and link target are at most :data:`~numabind._roots.PATH_MAX` bytes and
  :data:`MAX_COMPONENTS` components, and all names together at most :data:`NAME_BUDGET`
  bytes and :data:`COMPONENT_BUDGET` components (a 227-byte archive cannot claim 40 GB);
* the index is a tree of directories keyed by the parent (each member costs its own
  components, never every prefix of its name), and paths resolve inside the archive with
  the same linear :class:`~numabind._roots.Resolver` as a directory capture: a link to
  ``/etc/shadow`` names the archive's own (absent) member.

Every malformed archive is one :class:`~numabind._sysfs.ReadError` naming what was wrong.
Only ``show --input`` and its relatives import this; the startup hook never reads a
tarball.
"""

from __future__ import annotations

import os
import stat

from .. import _sysfs
from .._roots import PATH_MAX, Resolver, split_path
from .._sources import Root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TAR_CAP = 64 << 20  # decompressed bytes of a capture tarball (hwloc's biggest: 9 MiB)
TAR_MEMBERS = 50_000  # members of one (hwloc's biggest test capture has 11,495)
MAX_COMPONENTS = 512  # path components of one member name (sysfs paths have ~12)
NAME_BUDGET = 16 << 20  # bytes of all member names and link targets together
COMPONENT_BUDGET = 1 << 20  # path components of all member names together
PAX_CAP = 1 << 16  # bytes of one pax extended header
PAX_RECORDS = 64  # records in one pax header

_BLOCK = 512
_KINDS = {b"0": "file", b"\0": "file", b"7": "file", b"1": "hard", b"2": "link", b"5": "dir"}


class _Member:
    __slots__ = ("kind", "offset", "size", "target")

    def __init__(self, kind: str, offset: int, size: int, target: str) -> None:
        self.kind = kind
        self.offset = offset
        self.size = size
        self.target = target


class _Node:
    """One directory entry of the archive: its member (None: a directory only implied by
    deeper names) and, for a directory, its children by name."""

    __slots__ = ("children", "member")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.member: _Member | None = None


def _octal(field: bytes, what: str, where: str, limit: int) -> int:
    """A header number: octal digits, or GNU's base-256 (top bit set); bounded."""
    if field[:1] and field[0] & 0x80:
        if field[0] == 0xFF:
            raise _sysfs.ReadError(f"{where}: a negative {what}; not a readable tar archive")
        value = int.from_bytes(field[1:], "big")
    else:
        text = field.replace(b"\0", b" ").strip()
        if not text:
            return 0
        if len(text) > 12 or not all(48 <= c <= 55 for c in text):
            raise _sysfs.ReadError(
                f"{where}: {what} {_sysfs.short(text.decode('ascii', 'replace'))} is not an "
                "octal number; not a readable tar archive"
            )
        value = int(text, 8)
    if value > limit:
        raise _sysfs.ReadError(f"{where}: {what} {value} is beyond {limit}; not read")
    return value


def _pax(data: bytes, where: str) -> dict[str, str]:
    """The records of a pax extended header (``"%d %s=%s\\n"``), parsed by hand."""
    out: dict[str, str] = {}
    pos = 0
    count = 0
    while pos < len(data):
        if data[pos] == 0:  # padding
            break
        space = data.find(b" ", pos, pos + 8)
        digits = data[pos:space] if space > 0 else b""
        if not digits.isdigit():
            raise _sysfs.ReadError(f"{where}: a malformed pax header; not a readable tar archive")
        length = int(digits)
        end = pos + length
        if length < len(digits) + 3 or end > len(data) or data[end - 1 : end] != b"\n":
            raise _sysfs.ReadError(f"{where}: a malformed pax record; not a readable tar archive")
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep:
            raise _sysfs.ReadError(f"{where}: a malformed pax record; not a readable tar archive")
        count += 1
        if count > PAX_RECORDS:
            raise _sysfs.ReadError(f"{where}: more than {PAX_RECORDS} pax records; not read")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos = end
    return out


def _checksum_ok(block: bytes) -> bool:
    try:
        want = _octal(block[148:156], "checksum", "", 1 << 24)
    except _sysfs.ReadError:
        return False
    unsigned = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if want == unsigned:
        return True
    high = sum(1 for b in block[:148] if b > 127) + sum(1 for b in block[156:] if b > 127)
    return want == unsigned - 256 * high  # some old tars summed signed bytes


def is_tar(data: bytes) -> bool:
    """Whether ``data`` starts with a tar header (ustar magic or a valid checksum)."""
    head = data[:_BLOCK]
    return len(head) == _BLOCK and (head[257:262] == b"ustar" or _checksum_ok(head))


def _cstr(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "replace")


def _within(body: int, size: int, data: bytes, where: str) -> None:
    if body + size > len(data):
        raise _sysfs.ReadError(f"{where}: truncated member; not a readable tar archive")


def _extension(flag: bytes, payload: bytes, override: dict[str, str], where: str) -> bool:
    """A header that describes the next member (pax, GNU long names): its records go to
    ``override``; True when ``flag`` is one."""
    if flag in (b"x", b"X", b"g"):
        if len(payload) > PAX_CAP:
            raise _sysfs.ReadError(
                f"{where}: a pax header of {len(payload)} bytes (more than {PAX_CAP}); not read"
            )
        records = _pax(payload, where)
        if flag != b"g":  # a global header's path would rename everything: ignored
            override.update(records)
        return True
    if flag in (b"L", b"K"):
        if len(payload) > PATH_MAX + 1:
            raise _sysfs.ReadError(f"{where}: a name longer than {PATH_MAX}; not read")
        override["path" if flag == b"L" else "linkpath"] = _cstr(payload)
        return True
    return False


def _names(block: bytes, override: dict[str, str], size: int, where: str) -> tuple[str, str, int]:
    """A member's name, link target and size, with what extension headers said."""
    name = _cstr(block[0:100])
    if block[257:263] == b"ustar\0":  # POSIX; GNU's "ustar  " has no prefix field
        prefix = _cstr(block[345:500])
        if prefix:
            name = f"{prefix}/{name}"
    name = override.get("path", name)
    target = override.get("linkpath", _cstr(block[157:257]))
    if "size" in override:
        text = override["size"]
        if not (text.isascii() and text.isdigit() and len(text) < 12):
            raise _sysfs.ReadError(f"{where}: a malformed pax size; not read")
        size = int(text)
    if len(name) > PATH_MAX or len(target) > PATH_MAX:
        raise _sysfs.ReadError(
            f"{where}: a member name or link target longer than {PATH_MAX} bytes; not read"
        )
    return name, target, size


class _Counts:
    """The archive-wide budgets: members, name bytes, path components."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.members = self.names = self.components = 0

    def member(self, name: str, target: str) -> list[str]:
        """Count one member; its path components (``..`` dropped)."""
        where = self.where
        self.members += 1
        if self.members > TAR_MEMBERS:
            raise _sysfs.ReadError(f"{where}: more than {TAR_MEMBERS} members; not read")
        parts = [p for p in split_path(name) if p != ".."]
        if len(parts) > MAX_COMPONENTS:
            raise _sysfs.ReadError(
                f"{where}: a member name of {len(parts)} components (more than "
                f"{MAX_COMPONENTS}); not read"
            )
        self.names += len(name) + len(target)
        self.components += len(parts)
        if self.names > NAME_BUDGET or self.components > COMPONENT_BUDGET:
            raise _sysfs.ReadError(
                f"{where}: member names add up to more than {NAME_BUDGET >> 20} MiB or "
                f"{COMPONENT_BUDGET} components; not read"
            )
        return parts


class TarRoot(Root, Resolver):
    """A capture tarball, indexed in memory.  Nothing is written to disk."""

    realpath = Resolver.realpath

    def __init__(self, data: bytes, description: str) -> None:
        self.description = description
        Root.__init__(self)
        Resolver.__init__(self)
        self._data = data
        self._top_node = _Node()
        self._top_node.children = {}
        self._index(data, description)

    # --- parsing the archive
    def _index(self, data: bytes, where: str) -> None:
        pos = 0
        counts = _Counts(where)
        override: dict[str, str] = {}
        while True:
            block = data[pos : pos + _BLOCK]
            if len(block) < _BLOCK:
                if counts.members:
                    break  # the end-of-archive blocks are missing: what came is read
                raise _sysfs.ReadError(f"{where}: truncated; not a readable tar archive")
            if block == bytes(_BLOCK):
                break
            if not _checksum_ok(block):
                raise _sysfs.ReadError(
                    f"{where}: bad header checksum at byte {pos}; not a readable tar archive"
                )
            size = _octal(block[124:136], "member size", where, TAR_CAP)
            body = pos + _BLOCK
            pos = body + -(-size // _BLOCK) * _BLOCK
            _within(body, size, data, where)
            flag = block[156:157]
            if _extension(flag, data[body : body + size], override, where):
                continue
            name, target, size = _names(block, override, size, where)
            _within(body, size, data, where)
            override = {}
            parts = counts.member(name, target)
            if parts:
                self._add(parts, _Member(_KINDS.get(flag, "special"), body, size, target))

    def _add(self, parts: list[str], member: _Member) -> None:
        node = self._top_node
        for name in parts:
            if node.children is None:
                node.children = {}
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = _Node()
            node = child
        node.member = member
        if member.kind == "dir" and node.children is None:
            node.children = {}

    # --- the tree, as the resolver sees it
    def _top(self) -> _Node:
        return self._top_node

    def _child(self, handle: _Node, name: str) -> _Node | None:
        return handle.children.get(name) if handle.children is not None else None

    def _kind(self, handle: _Node) -> str:
        m = handle.member
        if m is None:
            return "dir"
        return "file" if m.kind == "hard" else m.kind

    def _target(self, handle: _Node) -> str:
        return handle.member.target if handle.member is not None else ""

    def _hard_target(self, member: _Member) -> _Member | None:
        """A hard link names another member by its archive path (no link followed)."""
        node: _Node | None = self._top_node
        for name in (p for p in split_path(member.target) if p != ".."):
            node = self._child(node, name) if node is not None else None
        found = node.member if node is not None else None
        return found if found is not None and found.kind == "file" else None

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        display = f"{self.description}:{path}"
        handle = self.lookup(path, display)
        m = handle.member
        if m is not None and m.kind == "hard":
            m = self._hard_target(m)
        if m is None or m.kind != "file":
            raise _sysfs.ReadError(f"{display}: not a regular file; not read")
        if m.size > cap:
            raise _sysfs.ReadError(f"{display}: larger than {cap} bytes; not read")
        self.budget.charge(files=1, nbytes=m.size)
        return self._data[m.offset : m.offset + m.size].decode("utf-8", "replace").strip()

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        try:
            handle = self.resolve(path, path)
        except OSError:
            return []
        self.budget.charge(files=1)
        children = handle.children if self._kind(handle) == "dir" else None
        return sorted(children or ())[:cap]

    def isdir(self, path: str) -> bool:
        try:
            return self._kind(self.resolve(path, path)) == "dir"
        except OSError:
            return False

    def close(self) -> None:
        self._data = b""
        self._top_node = _Node()
        self._parents.clear()


# --- reading a capture file --------------------------------------------------------------------


def read_file(path: str, cap: int = TAR_CAP) -> bytes:
    """A capture file's bytes, decompressed (gzip, bzip2, xz) when it is compressed.

    One open, without blocking and without a controlling terminal; ``fstat`` of that
    descriptor refuses a FIFO or device; the decompressor reads from the same descriptor,
    so a file swapped by name meanwhile is never read; at most ``cap`` bytes come out (a
    crafted archive that inflates to terabytes stops there).  ``-`` is standard input (a
    pipe or a file: ``numabind gather - | ssh host numabind show --input -``)."""
    stdin = path == "-"
    fd = os.dup(0) if stdin else os.open(path, _sysfs.OPEN_FLAGS)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) or (stdin and stat.S_ISFIFO(st.st_mode))):
            what = (
                "standard input: not a pipe or a file" if stdin else f"{path}: not a regular file"
            )
            raise _sysfs.ReadError(f"{what}; not read")
        magic = f.peek(6)[:6]  # a pipe cannot seek back: look without consuming
        opener: Any = None
        if magic[:2] == b"\x1f\x8b":
            import gzip

            opener = gzip.GzipFile
        elif magic[:3] == b"BZh":
            import bz2

            opener = bz2.BZ2File
        elif magic == b"\xfd7zXZ\x00":
            import lzma

            opener = lzma.LZMAFile
        if opener is None:
            data = f.read(cap + 1)
        else:
            try:
                with opener(fileobj=f) if opener.__name__ == "GzipFile" else opener(f) as z:
                    data = z.read(cap + 1)
            except Exception as err:  # EOFError, OSError, zlib/lzma errors: corrupt data
                raise _sysfs.ReadError(f"{path}: corrupt compressed data ({err})") from err
    if len(data) > cap:
        raise _sysfs.ReadError(f"{path}: decompresses to more than {cap >> 20} MiB; not read")
    return data


def open_tar(path: str) -> TarRoot:
    """Index a tarball (plain, gzip, bzip2 or xz); ``OSError`` if it is not one."""
    data = read_file(path)
    if not is_tar(data):
        raise _sysfs.ReadError(f"{path}: not a tar archive")
    return TarRoot(data, path)
