"""Leaf helpers: bounded, non-blocking reads of kernel text files, and the kernel's formats
(CPU and node lists, masks, numbers, PCI addresses).

This module is on the startup path of every rank process: it imports nothing but ``os``,
``stat`` and ``sys`` (all loaded by the interpreter before any ``.pth`` runs).  It also
holds the one rule for a path the environment redirects numabind to (:func:`redirect`),
which the machine reader and the registry both obey.

Everything read here is input, and input can be hostile: a capture someone sent, a tree
named by ``NUMABIND_SYSROOT``, a file another user planted.  So every read

* opens with ``O_NONBLOCK`` (a FIFO planted at a read path cannot hang the process),
* accepts only a regular file (``fstat`` after the open; a device or FIFO is refused),
* reads at most a cap of bytes, never trusting ``st_size`` (procfs says 0, sysfs 4096),

and every parser bounds each number it accepts by a documented ceiling
(:data:`MAX_CPUS`, :data:`MAX_NODES`), so no value can make the work grow beyond what a
real machine needs.  Parsers are pure and raise ``ValueError`` with a message that quotes
the value (``repr``: a newline in input can never split numabind's one line).
"""

from __future__ import annotations

import os
import stat
import sys

import _numabind_base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

# Hard ceilings on what numabind accepts from any input.  Linux is built with at most
# 8192 CPUs (x86_64/powerpc MAXSMP; arm64 4096) and 1024 NUMA nodes (CONFIG_NODES_SHIFT
# <= 10); twice the CPU limit leaves room without letting a value like 0-99999999 turn
# into 10^8 integers.
MAX_CPUS = _numabind_base.MAX_CPUS  # the one home of both limits: the warm start reads too
MAX_NODES = _numabind_base.MAX_NODES
# Bytes read from one file.  sysfs attributes are < 4 KiB; /proc/self/status ~1.5 KiB;
# /proc/self/mounts can be long on container hosts.  Callers that read bigger files
# (numa_maps, environ, tarballs) pass their own cap.
READ_CAP = 1 << 20
# Entries listed from one directory (a PCI bus of a big host has ~1000 functions).
LIST_CAP = _numabind_base.LIST_CAP
# how every input file is opened: never blocking (a FIFO), never a controlling terminal
OPEN_FLAGS = _numabind_base.OPEN_FLAGS


class ReadError(OSError):
    """A file that exists but must not be read as numabind input (not a regular file, or
    larger than the cap).  An ``OSError`` so that callers' fallbacks treat it like an
    unreadable file; ``str()`` says what was wrong."""


def join(root: str, path: str) -> str:
    """Place an absolute kernel path (``/sys/...``) under a capture's root directory."""
    if root in ("", "/"):
        return path
    return root.rstrip("/") + path


def read_fd(fd: int, path: str, cap: int = READ_CAP) -> bytes:
    """Read an already-open descriptor under the module's rules (regular file, cap)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ReadError(f"{path}: not a regular file; not read")
    chunks: list[bytes] = []
    total = 0
    while True:
        data = os.read(fd, min(cap + 1 - total, 1 << 20))
        if not data:
            break
        chunks.append(data)
        total += len(data)
        if total > cap:
            raise ReadError(f"{path}: larger than {cap} bytes; not read")
    return b"".join(chunks)


def read_bytes(path: str, cap: int = READ_CAP, *, nofollow: bool = False) -> bytes:
    """Read a whole small file, safely (see the module docstring).  Raises ``OSError``."""
    fd = os.open(path, OPEN_FLAGS | (os.O_NOFOLLOW if nofollow else 0))
    try:
        return read_fd(fd, path, cap)
    finally:
        os.close(fd)


_MISSING: object = object()


def read_text(path: str, fallback: str | object | None = _MISSING, cap: int = READ_CAP) -> str:
    """Read a kernel text file and strip it.

    Without a fallback an ``OSError`` propagates (the caller wanted the file); with one, a
    missing, unreadable or refused file returns the fallback.
    """
    try:
        data = read_bytes(path, cap)
    except OSError:
        if fallback is _MISSING:
            raise
        return fallback  # type: ignore[return-value]
    return data.decode("utf-8", "replace").strip()


def read_opt(path: str, cap: int = READ_CAP) -> str | None:
    """``read_text`` that returns None for an absent, unreadable or refused file."""
    try:
        data = read_bytes(path, cap)
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip()


entries = _numabind_base.entries  # the one bounded directory walk (the witnesses' too)


def listdir(path: str, cap: int = LIST_CAP) -> list[str]:
    """Sorted directory entries (at most ``cap``), or [] when it cannot be read."""
    try:
        names, _ = entries(path, cap)
    except OSError:
        return []
    return sorted(names)


# --- parsers -----------------------------------------------------------------------------------


def short(text: str, limit: int = 60) -> str:
    """``repr`` of a value for a message, shortened: input can be megabytes long."""
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text)} characters)"
    return repr(text)


def _number(token: str, text: str, limit: int, what: str) -> int:
    # isascii + isdigit: int() would accept '²' (no: it raises), '٣' and '1_0'
    if not (token.isascii() and token.isdigit()) or len(token) > 6:
        raise ValueError(f"bad {what} {short(token)} in {short(text)}")
    value = int(token)
    if value >= limit:
        raise ValueError(f"{what} {value} in {short(text)} is beyond the ceiling of {limit}")
    return value


def parse_cpulist(text: str, limit: int = MAX_CPUS, what: str = "CPU") -> frozenset[int]:
    """Parse the kernel's list format (``0-3,8,10-11``; ``0-31:2`` strides too).

    Every number must be below ``limit`` (default :data:`MAX_CPUS`), so the set never
    grows beyond what a machine can have.  An empty string is the empty set (a CPU-less
    node has an empty ``cpulist``).
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    if len(text) > 16 * limit:
        raise ValueError(f"{what} list {short(text)} is too long")
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, _, s = part.partition(":")
            stride = _number(s.strip(), text, limit + 1, "stride")
            if stride <= 0:
                raise ValueError(f"bad stride in {what} list {short(text)}")
        if "-" in part:
            a, _, b = part.partition("-")
            lo = _number(a.strip(), text, limit, what)
            hi = _number(b.strip(), text, limit, what)
            if hi < lo:
                raise ValueError(f"bad range {short(part)} in {what} list {short(text)}")
            out.update(range(lo, hi + 1, stride))
        else:
            out.add(_number(part, text, limit, what))
    return frozenset(out)


def parse_nodelist(text: str) -> frozenset[int]:
    """A NUMA node list (``cpuset.mems``, ``Mems_allowed_list``), below :data:`MAX_NODES`."""
    return parse_cpulist(text, MAX_NODES, "node")


def format_cpulist(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_cpulist`: sorted, with runs collapsed into ranges."""
    items = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)


_HEX = frozenset("0123456789abcdefABCDEF")


def parse_cpumask(text: str, limit: int = MAX_CPUS, what: str = "CPU") -> frozenset[int]:
    """Parse a kernel bitmap (``local_cpus``, ``cpumap``): comma-separated 32-bit hex words,
    most significant first.  hwloc XML uses the same format with ``0x`` prefixes, where an
    empty word means 0.  Set bits at or above ``limit`` are an error."""
    text = text.strip()
    if not text:
        return frozenset()
    words = text.split(",")
    if len(words) > limit // 32 + 64:  # leading zero words are allowed, within reason
        raise ValueError(f"{what} mask {short(text)} is too long")
    out: set[int] = set()
    bit = 0
    for word in reversed(words):
        word = word.strip()
        if word[:2] in ("0x", "0X"):
            word = word[2:]
        if len(word) > 8 or not _HEX.issuperset(word):
            raise ValueError(f"bad word {short(word)} in {what} mask {short(text)}")
        value = int(word, 16) if word else 0
        while value:
            low = value & -value
            cpu = bit + low.bit_length() - 1
            if cpu >= limit:
                raise ValueError(
                    f"{what} {cpu} in mask {short(text)} is beyond the ceiling of {limit}"
                )
            out.add(cpu)
            value ^= low
        bit += 32
    return frozenset(out)


def parse_int(text: str | None) -> int | None:
    """Parse a short decimal or 0x-prefixed integer (sysfs ids, ``numa_node``); None for
    None, empty, garbage or a number longer than 18 digits (no sysfs value is)."""
    if text is None:
        return None
    text = text.strip()
    if not text or len(text) > 20 or not text.isascii():
        return None
    try:
        if text[:2].lower() == "0x":
            return int(text[2:], 16)
        return int(text, 10)
    except ValueError:
        return None


def clean_line(text: str, limit: int = 2000) -> str:
    """One printable line: control characters (a newline in an environment value, an
    escape sequence in a capture) become spaces, and the length is capped.  For values
    numabind stores (a registry field); text shown to a person goes through
    :func:`escape`, which keeps what was there visible."""
    if text.isprintable() and len(text) <= limit:
        return text
    out = "".join(c if c.isprintable() else " " for c in text[:limit])
    return out + (" ..." if len(text) > limit else "")


def escape(text: str, limit: int = 8000) -> str:
    r"""``text`` as one line a terminal shows as it is: every character that is not
    printable (a newline, an escape sequence, a bidirectional override) is written the way
    ``repr`` writes it (``\n``, ``\x1b``, ``\u202e``), and the length is capped.  The one
    function every line numabind prints goes through (:mod:`numabind._output`): a field
    another user controls can neither start a second line nor drive the terminal."""
    if text.isprintable() and len(text) <= limit:
        return text
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return out + (f" ... ({len(text)} characters)" if len(text) > limit else "")


# --- the work of reading one machine -----------------------------------------------------------
# Every number numabind accepts is capped, but links let a small crafted tree claim the cap
# everywhere (2N CPU directories linked to two templates, each listing 16,384 CPUs).  So
# the work of reading one machine is counted, not timed, against what the largest machine
# numabind accepts costs: MAX_CPUS CPUs with MAX_CACHE_INDEXES caches each, MAX_NODES
# nodes, MAX_ACCELERATORS accelerators and a PCI bus of PCI_LIST_CAP functions.  A real
# machine reads a small fraction of it (docs/security.rst has the figures).
MAX_ACCELERATORS = 64  # accelerators read per machine (an 8-way HGX has 8; 64 is generous)
MAX_CACHE_INDEXES = 16  # cache indexes read per CPU (real CPUs have 4-5)
PCI_LIST_CAP = 16384  # PCI functions listed (a large host has 1,000-2,000)
BUDGET_FILES = MAX_CPUS * (4 + 3 * MAX_CACHE_INDEXES) + MAX_NODES * 4 + PCI_LIST_CAP + 4096
BUDGET_BYTES = 256 << 20
BUDGET_ITEMS = 64 * MAX_CPUS  # CPU and node numbers parsed (identical lists parsed once)


class Budget:
    """What reading one machine has cost so far: files opened, bytes read, list items
    parsed.  :meth:`charge` raises :class:`~numabind.CaptureError` (never an ``OSError``,
    which readers turn into "absent") once a limit is passed."""

    __slots__ = ("bytes", "files", "items", "where")

    def __init__(self, where: str = "?") -> None:
        self.files = self.bytes = self.items = 0
        self.where = where

    def charge(self, files: int = 0, nbytes: int = 0, items: int = 0) -> None:
        self.files += files
        self.bytes += nbytes
        self.items += items
        if self.files > BUDGET_FILES or self.bytes > BUDGET_BYTES or self.items > BUDGET_ITEMS:
            from ._errors import CaptureError

            raise CaptureError(
                f"{self.where}: reading it costs more than the largest machine numabind "
                f"accepts ({self.files} files, {self.bytes} bytes, {self.items} CPU/node "
                f"numbers so far; limits {BUDGET_FILES}, {BUDGET_BYTES}, {BUDGET_ITEMS}): "
                "not a real machine, not read further"
            )


# --- PCI addresses -----------------------------------------------------------------------------
# The one spelling numabind uses is sysfs's (``0000:3b:00.0``).  NVML and nvidia-smi write
# ``00000000:3B:00.0`` (8-digit domain, upper case), CUDA ``0000:3B:00.0``, hwloc
# ``0000:3b:00.0``: everything is normalised before it is compared, so a device is never
# missed over a spelling.


def normalize_pci(bus_id: str) -> str | None:
    """Normalize a PCI address to sysfs form (``0000:3b:00.0``); None when the text is not
    a PCI address (or is absurdly long)."""
    text = bus_id.strip().lower()
    if len(text) > 32 or not text.isascii():
        return None
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dom, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        d, b, v, f = int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None
    if not (0 <= d <= 0xFFFFFFFF and 0 <= b <= 0xFF and 0 <= v <= 0x1F and 0 <= f <= 7):
        return None
    return f"{d:04x}:{b:02x}:{v:02x}.{f:x}"


def pci_sort_key(bdf: str) -> tuple[int, ...]:
    """Sort key in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID enumerates)."""
    out: list[int] = []
    for part in bdf.replace(".", ":").split(":"):
        try:
            out.append(int(part, 16))
        except ValueError:
            out.append(0)
    return tuple(out)


# --- paths the environment may redirect numabind to -----------------------------------------

# kernel pseudo file systems: a "registry" there would write into the kernel's own files
_PSEUDO_FS = frozenset(
    {
        "proc", "sysfs", "cgroup", "cgroup2", "devtmpfs", "debugfs", "tracefs", "securityfs",
        "configfs", "bpf", "pstore", "efivarfs", "fusectl", "mqueue", "devpts", "binfmt_misc",
        "autofs", "rpc_pipefs", "nsfs", "selinuxfs", "hugetlbfs",
    }
)  # fmt: skip


# The one copy of this rule is in _numabind_base (the warm start checks it before numabind
# is loaded): every directory on the path root's and nobody else's to write.
from _numabind_base import root_owned_path  # noqa: E402


def thread_ids(pid: int | str = "self") -> list[int]:
    """The thread ids of a process (at most :data:`LIST_CAP` of them)."""
    names = listdir(f"/proc/{pid}/task")
    found = sorted(int(t) for t in names if t.isascii() and t.isdigit() and len(t) < 11)
    if not found and pid == "self":
        return [os.getpid()]
    return found


def affinity_of(tid: int) -> frozenset[int] | None:
    """One thread's CPU mask, None when it is gone (or not ours to read)."""
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:
        return None


def fs_type(path: str) -> str | None:
    """The file system type of the mount holding ``path`` (/proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best, kind = -1, None
    for line in (read_opt("/proc/self/mountinfo", 4 << 20) or "").splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or sep + 1 >= len(fields):
            continue
        point = fields[4].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), fields[sep + 1]
    return kind


def redirect(
    name: str, raw: str | None, default: str, *, own: bool, registry: bool, notes: list[str]
) -> str:
    """The path a variable redirects numabind to (``NUMABIND_SYSROOT``, where the machine
    is read; ``NUMABIND_REGISTRY``, where entries are written), or ``default`` with the
    reason in ``notes``: ignored under ``python -I``/``-E`` (for the process's own
    environment, ``own``), and for euid 0 unless every directory of the path is root's and
    nobody else may write it (a registry also on a regular file system, not the kernel's
    own).  docs/security.rst has the threat model."""
    if raw is None or raw.strip() == "":
        return default
    if own and sys.flags.ignore_environment:
        notes.append(f"{name} ignored: python -I/-E ignores the environment's redirections")
        return default
    if own and os.geteuid() == 0:
        why = root_owned_path(raw)
        if why is None and registry:
            real = os.path.realpath(raw)
            kernel = [p for p in ("/proc", "/sys", "/dev") if real == p or real.startswith(p + "/")]
            if not os.path.isdir(raw):
                why = "not a directory"
            elif kernel and not (real == "/dev/shm" or real.startswith("/dev/shm/")):
                why = f"under {kernel[0]}, the kernel's own files"
            else:
                kind = fs_type(raw)
                if kind is None or kind in _PSEUDO_FS:
                    why = f"on a {kind or 'unknown'} file system, not a regular one"
        if why is not None:
            # the path check spells the first directory '//name': say it as written
            why = why.replace("//", "/", 1) if why.startswith("//") else why
            notes.append(f"{name}={short(raw)} ignored for root: {why}")
            return default
    return raw


# --- /proc/PID/numa_maps: where a process's pages are ------------------------------------------

MAPS_BYTES_CAP = 32 << 20  # bytes read of one maps or numa_maps file
MAPS_LINES_CAP = 1 << 18  # lines of one (vm.max_map_count defaults to 65,530)
_LINE_CAP = 8192  # longer lines (file mappings with long paths) are skipped, not kept


class Lines:
    """The lines of a /proc file, read as a stream under a byte and a line cap; lines
    longer than 8 KiB (file mappings with long paths, which numabind never measures) are
    skipped without being kept.  ``truncated`` says whether a cap cut it short."""

    def __init__(
        self, path: str, max_bytes: int = MAPS_BYTES_CAP, max_lines: int = MAPS_LINES_CAP
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self.truncated = False
        self.skipped = 0

    def __iter__(self) -> Iterator[str]:
        fd = os.open(self.path, OPEN_FLAGS)
        try:
            total = lines = 0
            rest = b""
            long_line = False
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                total += len(chunk)
                parts = (rest + chunk).split(b"\n")
                rest = parts.pop()
                for part in parts:
                    if long_line:
                        long_line = False
                        self.skipped += 1
                        continue
                    lines += 1
                    if lines > self.max_lines:
                        self.truncated = True
                        return
                    yield part.decode("utf-8", "replace")
                if len(rest) > _LINE_CAP:
                    rest, long_line = b"", True
                if total >= self.max_bytes:
                    self.truncated = True
                    return
            if rest and not long_line:
                yield rest.decode("utf-8", "replace")
        finally:
            os.close(fd)


def node_counts(fields: list[str]) -> Iterator[tuple[int, int]]:
    for f in fields:
        if f[:1] == "N" and "=" in f:
            node, _, count = f[1:].partition("=")
            if node.isdigit() and count.isdigit() and len(node) < 5 and len(count) < 16:
                yield int(node), int(count)


def anon_pages_outside(nodes: frozenset[int], pid: int | str = "self") -> int:
    """Resident pages of anonymous mappings outside ``nodes``, from numa_maps alone: a cheap
    first look that lets the startup hook skip the full walk when nothing is remote."""
    count = 0
    for line in Lines(f"/proc/{pid}/numa_maps"):
        if "file=" in line:
            continue
        for node, n in node_counts(line.split()[2:]):
            if node not in nodes:
                count += n
    return count
