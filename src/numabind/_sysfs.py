"""Leaf helpers for reading sysfs/procfs text and parsing the kernel's CPU-set formats.

This module is on the startup path of every rank process: it imports nothing but ``os``
(already loaded by the interpreter) so that the ``.pth`` hook stays within its time budget.
Parsers are pure and raise ``ValueError`` on malformed input; readers swallow ``OSError``
only when the caller gives a fallback, so a missing file is a decision, not an accident.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

_MISSING: object = object()


def join(root: str, path: str) -> str:
    """Place an absolute kernel path (``/sys/...``) under a capture's root directory."""
    if root in ("", "/"):
        return path
    return root.rstrip("/") + path


def read_text(path: str, fallback: str | object | None = _MISSING) -> str:
    """Read a small sysfs/procfs file and strip it.

    Without a fallback an ``OSError`` propagates (the caller wanted the file); with one, a
    missing or unreadable file returns the fallback.  sysfs attributes are single short lines,
    so one ``read`` of a binary file is both the fastest and the safest way to get them.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        if fallback is _MISSING:
            raise
        return fallback  # type: ignore[return-value]
    return data.decode("utf-8", "replace").strip()


def read_opt(path: str) -> str | None:
    """``read_text`` that returns None for an absent or unreadable file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip()


def listdir(path: str) -> list[str]:
    """Sorted directory entries, or an empty list when the directory cannot be read."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse the kernel's list format (``0-3,8,10-11``; ``0-31:2`` strides too).

    An empty string is the empty set (a CPU-less node has an empty ``cpulist``).
    """
    out: set[int] = set()
    text = text.strip()
    if not text:
        return frozenset()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        stride = 1
        if ":" in part:
            part, _, s = part.partition(":")
            stride = int(s)
            if stride <= 0:
                raise ValueError(f"bad stride in cpulist {text!r}")
        if "-" in part:
            a, _, b = part.partition("-")
            lo, hi = int(a), int(b)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad range {part!r} in cpulist {text!r}")
            out.update(range(lo, hi + 1, stride))
        else:
            v = int(part)
            if v < 0:
                raise ValueError(f"negative CPU in cpulist {text!r}")
            out.add(v)
    return frozenset(out)


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


def parse_cpumask(text: str) -> frozenset[int]:
    """Parse a kernel bitmap (``local_cpus``, ``cpumap``): comma-separated 32-bit hex words,
    most significant first.  hwloc XML uses the same format, where an empty word means 0."""
    text = text.strip()
    if not text:
        return frozenset()
    words = text.split(",")
    out: set[int] = set()
    bit = 0
    for word in reversed(words):
        word = word.strip()
        value = int(word, 16) if word else 0
        if value < 0:
            raise ValueError(f"bad cpumask {text!r}")
        while value:
            low = value & -value
            out.add(bit + low.bit_length() - 1)
            value ^= low
        bit += 32
    return frozenset(out)


def parse_int(text: str | None) -> int | None:
    """Parse a decimal or 0x-prefixed integer; None for None, empty or garbage."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        if text[:2].lower() == "0x":
            return int(text[2:], 16)
        return int(text, 10)
    except ValueError:
        return None
